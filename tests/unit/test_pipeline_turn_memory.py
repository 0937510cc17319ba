"""Turn memory of the effect stages: a turn is complete once its request and response are seen."""

from __future__ import annotations

import json

from orl.pipeline.processors.turn_memory import complete_turn, new_turn_memory, remember_turn_event

from tests.unit.pipeline_streams import Conversation

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 18/24?"}]


def test_a_turn_is_complete_with_its_request_and_response_and_its_messages_parsed() -> None:
    chat = Conversation("s1")
    chat.say("What is 18/24?")
    turn = chat.turn("3/4.")
    request, response = chat.events[-2], chat.events[-1]
    state = new_turn_memory()
    remember_turn_event(state, request)
    assert complete_turn(state, turn.turn_id) is None
    remember_turn_event(state, response)
    complete = complete_turn(state, turn.turn_id)
    assert complete is not None
    assert complete["messages"] == json.loads(request["messages_json"])
    assert complete["response_text"] == "3/4."
    assert "messages_json" in state["turns"][turn.turn_id]  # the state keeps the text, unparsed
    json.dumps(state)


def test_a_state_stored_with_parsed_messages_still_completes() -> None:
    state = {
        "turns": {"t1": {"messages": MESSAGES, "response_text": "3/4."}},
        "seen": [],
        "last_activity_ms": 0,
    }
    complete = complete_turn(state, "t1")
    assert complete is not None and complete["messages"] == MESSAGES
    assert complete_turn({"turns": {"t2": {"response_text": "x"}}}, "t2") is None
