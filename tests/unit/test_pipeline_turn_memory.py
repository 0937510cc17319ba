"""Turn memory of the effect stages: a turn is complete once its request and response are seen."""

from __future__ import annotations

import json

import pytest
from orl.pipeline.processors.turn_memory import (
    MAX_TURNS_PER_SESSION,
    TURN_MEMORY_STATE,
    TurnMemory,
    add_trigger,
    complete_turn,
    remember_turn_event,
    seen_first,
    take_ready_triggers,
)

from tests.unit.pipeline_streams import Conversation

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 18/24?"}]


def _one_turn() -> tuple[Conversation, str]:
    chat = Conversation("s1")
    chat.say("What is 18/24?")
    return chat, chat.turn("3/4.").turn_id


def test_a_turn_is_complete_with_its_request_and_response_and_its_messages_parsed() -> None:
    chat, turn_id = _one_turn()
    request, response = chat.events[-2], chat.events[-1]
    memory = remember_turn_event(TurnMemory(), request)
    assert complete_turn(memory.turns[turn_id]) is None
    memory = remember_turn_event(memory, response)
    complete = complete_turn(memory.turns[turn_id])
    assert complete is not None
    assert complete["messages"] == json.loads(request["messages_json"])
    assert complete["response_text"] == "3/4."
    assert complete["response_token_ids"] == list(response["response_token_ids"])
    assert memory.turns[turn_id].messages_json == request["messages_json"]  # kept as text, unparsed
    json.dumps(complete)  # an effect call's payload is JSON
    assert TURN_MEMORY_STATE.from_bytes(TURN_MEMORY_STATE.to_bytes(memory)) == memory


def test_the_judge_keeps_no_token_ids() -> None:
    chat, turn_id = _one_turn()
    memory = TurnMemory()
    for event in chat.events[-2:]:
        memory = remember_turn_event(memory, event, keep_tokens=False)
    turn = memory.turns[turn_id]
    assert turn.response_text == "3/4." and turn.response_token_ids is None and turn.temperature is None


def test_a_trigger_waits_for_its_turn_and_is_released_once() -> None:
    chat, turn_id = _one_turn()
    request, response = chat.events[-2], chat.events[-1]
    memory = add_trigger(remember_turn_event(TurnMemory(), request), turn_id, {"hint": "Reduce."})
    memory, turn, triggers = take_ready_triggers(memory, turn_id)
    assert turn is None and triggers == []  # no response yet
    memory, turn, triggers = take_ready_triggers(remember_turn_event(memory, response), turn_id)
    assert turn is not None and triggers == [{"hint": "Reduce."}]
    assert take_ready_triggers(memory, turn_id)[2] == []


def test_a_redelivered_event_is_seen_once() -> None:
    chat, _ = _one_turn()
    memory = seen_first(None, chat.events[-1], window=8)
    assert memory is not None
    assert seen_first(memory, chat.events[-1], window=8) is None


def test_the_oldest_turns_are_dropped_beyond_the_bound() -> None:
    memory = TurnMemory()
    for index in range(MAX_TURNS_PER_SESSION + 3):
        memory = add_trigger(memory, f"t{index}", {"hint": str(index)})
    assert len(memory.turns) == MAX_TURNS_PER_SESSION
    assert "t0" not in memory.turns and f"t{MAX_TURNS_PER_SESSION + 2}" in memory.turns


@pytest.mark.parametrize("stored_messages", ["messages", "messages_json"])
def test_a_dict_state_stored_before_the_typed_memory_still_reads(stored_messages: str) -> None:
    turn: dict[str, object] = {"response_text": "3/4.", "response_event_id": "e2", "pending": [{"hint": "x"}]}
    turn[stored_messages] = MESSAGES if stored_messages == "messages" else json.dumps(MESSAGES)
    stored = {"turns": {"t1": turn, "t2": {"response_text": "x"}}, "seen": ["e1"], "last_activity_ms": 5}
    memory = TURN_MEMORY_STATE.from_bytes(json.dumps(stored).encode())
    assert memory.seen == ("e1",) and memory.last_activity_ms == 5
    memory, complete, triggers = take_ready_triggers(memory, "t1")
    assert complete is not None and complete["messages"] == MESSAGES and triggers == [{"hint": "x"}]
    assert complete_turn(memory.turns["t2"]) is None  # its request was never seen
