"""turn_linker: next states from the conversation, side turns, out-of-order arrival, session end, idle close."""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from orl.pipeline.processors.config import LinkerConfig, PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import Event
from orl.pipeline.processors.turn_linker import CLOSE_GRACE_S, SESSION_END_CONTENT, TURN_LINKER
from orl.schemas.codec import encode

from tests.unit.pipeline_streams import Conversation, of_type, run_processor, tick_processor, tool_call

CONFIG = PipelineConfig(linker=LinkerConfig(idle_timeout_s=60, closed_retention_s=120))


def tool_conversation() -> tuple[Conversation, list[str]]:
    c = Conversation("s1")
    c.say("List the files and count them.")
    t0 = c.turn("", tool_calls=[tool_call("c1", "ls", {}), tool_call("c2", "wc", {})])
    c.tool_result("c1", "a.py b.py")
    c.tool_result("c2", "2")
    t1 = c.turn("There are 2 files: a.py and b.py.")
    c.say("No, include hidden files too.")
    t2 = c.turn("Including hidden files there are 3.")
    return c, [t0.turn_id, t1.turn_id, t2.turn_id]


def test_next_state_holds_every_message_appended_after_the_response() -> None:
    c, (t0, t1, _) = tool_conversation()
    _, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    states = {e["envelope"]["turn_id"]: e for e in of_type(emits, "NextStateObserved")}
    assert set(states) == {t0, t1}
    first = states[t0]
    appended = json.loads(first["messages_json"])
    assert [m["role"] for m in appended] == ["tool", "tool"]
    assert "a.py b.py" in first["content"] and "2" in first["content"]
    assert first["role"] == "tool" and first["source"] == "conversation"
    assert states[t1]["role"] == "user" and "include hidden files" in states[t1]["content"]
    for emit in emits:
        assert emit.topic == "next_states"
        encode(emit.event)


def test_side_turns_never_get_a_next_state_and_do_not_break_the_chain() -> None:
    c = Conversation("s2")
    c.say("hi")
    t0 = c.turn("hello")
    c.turn("memory summary", kind="side")
    c.say("bye")
    c.turn("goodbye")
    _, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    linked = [e["envelope"]["turn_id"] for e in of_type(emits, "NextStateObserved")]
    assert linked == [t0.turn_id]
    assert "bye" in of_type(emits, "NextStateObserved")[0]["content"]


def test_response_before_its_request_and_after_the_next_request() -> None:
    c, (t0, t1, _) = tool_conversation()
    events = list(c.events)
    # t0's response arrives last of all; t1's response arrives before t1's request.
    r0, q1, r1 = events[1], events[2], events[3]
    reordered = [events[0], r1, q1, *events[4:], r0]
    _, emits = run_processor(TURN_LINKER, reordered, CONFIG)
    _, in_order = run_processor(TURN_LINKER, events, CONFIG)
    assert sorted(e.event["envelope"]["event_id"] for e in emits) == sorted(
        e.event["envelope"]["event_id"] for e in in_order
    )
    assert {e["envelope"]["turn_id"] for e in of_type(emits, "NextStateObserved")} == {t0, t1}


def test_a_turn_without_a_response_gets_no_next_state() -> None:
    c = Conversation("s3")
    c.say("hi")
    c.turn("never sent", respond=False)
    c.say("hello?")
    c.turn("hello")
    _, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    assert of_type(emits, "NextStateObserved") == []


def test_explicit_close_gives_the_last_turn_a_session_end_state() -> None:
    c, (_, _, t2) = tool_conversation()
    c.close()
    states, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    last = of_type(emits, "NextStateObserved")[-1]
    assert last["envelope"]["turn_id"] == t2
    assert (last["source"], last["role"], last["content"]) == (
        "session_end",
        "environment",
        SESSION_END_CONTENT,
    )
    assert of_type(emits, "SessionClosed") == []  # serving already announced it
    assert tick_processor(TURN_LINKER, states, c.now_ms + 121_000, CONFIG) == []
    assert states == {}  # tombstone expired: nothing leaks


def test_idle_session_is_closed_by_tick_with_a_deterministic_event() -> None:
    c, (_, _, t2) = tool_conversation()
    states, _ = run_processor(TURN_LINKER, c.events, CONFIG)
    assert tick_processor(TURN_LINKER, states, c.now_ms + 59_000, CONFIG) == []
    first = tick_processor(TURN_LINKER, dict(states), c.now_ms + 61_000, CONFIG)  # states are frozen
    later = tick_processor(TURN_LINKER, states, c.now_ms + 600_000 - 1, CONFIG)
    assert first == later  # occurred_at is the idle deadline, not the tick time
    closed = of_type(first, "SessionClosed")[0]
    assert closed["reason"] == "idle_timeout" and closed["last_turn_id"] == t2
    assert closed["envelope"]["occurred_at"] == c.now_ms + 60_000
    assert of_type(first, "NextStateObserved")[0]["envelope"]["turn_id"] == t2
    assert tick_processor(TURN_LINKER, states, c.now_ms + 10**7, CONFIG) == []


def test_a_connector_next_state_replaces_the_session_end_state() -> None:
    c, (_, _, t2) = tool_conversation()
    states, _ = run_processor(TURN_LINKER, c.events, CONFIG)
    from orl.schemas.events import make_event

    feedback = make_event(
        "NextStateObserved", namespace="test", producer="connectors.feedback/1", occurred_at_ms=c.tick(),
        id_parts=("fb",), session_id="s1", turn_id=t2, source="feedback", role="user", content="thumbs up",
        messages_json=None, outcome={"kind": "thumbs", "reward": None, "exit_code": None, "passed": None,
                                     "failed": None, "errors": None, "thumbs": 1, "detail_json": None},
    )  # fmt: skip
    c.events.clear()
    c.close()
    _, emits = run_processor(TURN_LINKER, [feedback, *c.events], CONFIG, states)
    assert emits == []


def test_retry_without_a_new_message_is_a_next_state_saying_so() -> None:
    c = Conversation("s4")
    c.say("write a haiku")
    t0 = c.turn("an old silent pond")
    c.messages.pop()  # the client drops the answer and asks again
    c.turn("a frog jumps in")
    _, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    (state,) = of_type(emits, "NextStateObserved")
    assert state["envelope"]["turn_id"] == t0.turn_id and "retry" in state["content"]


def test_redelivered_events_emit_nothing_and_replay_is_identical() -> None:
    c, _ = tool_conversation()
    c.close()
    states, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    _, again = run_processor(TURN_LINKER, c.events, CONFIG, states)
    assert again == []
    _, replay = run_processor(TURN_LINKER, c.events, CONFIG)
    assert replay == emits


TOPIC_OF = {
    "RequestReceived": "requests",
    "ResponseGenerated": "responses",
    "SessionClosed": "sessions",
}


def emitted_ids(emits: list[Emit]) -> set[str]:
    return {emit.event["envelope"]["event_id"] for emit in emits}


def run_then_settle(events: list[Event], now_ms: int) -> set[str]:
    """Every event turn_linker emits for `events`, including what ticks after the grace period release."""
    states, emits = run_processor(TURN_LINKER, events, CONFIG)
    ticked = tick_processor(TURN_LINKER, states, now_ms + int(CLOSE_GRACE_S * 1000) + 1, CONFIG)
    return emitted_ids(emits) | emitted_ids(ticked)


def test_a_close_read_before_the_last_request_still_ends_the_last_turn() -> None:
    c, (t0, t1, t2) = tool_conversation()
    c.say("thanks, that is all")
    t3 = c.turn("You are welcome.").turn_id
    close = c.close()
    _, in_order = run_processor(TURN_LINKER, c.events, CONFIG)
    close_first = [close, *c.events[:-1]]  # the sessions topic was read before the requests topic
    states, emits = run_processor(TURN_LINKER, close_first, CONFIG)
    assert emitted_ids(emits) == emitted_ids(in_order)
    by_turn = {e["envelope"]["turn_id"]: e for e in of_type(emits, "NextStateObserved")}
    assert set(by_turn) == {t0, t1, t2, t3}
    assert by_turn[t2]["source"] == "conversation" and "that is all" in by_turn[t2]["content"]
    assert by_turn[t3]["source"] == "session_end"
    assert next(iter(states.values())).closed  # the late requests did not reopen the session


def test_a_close_naming_no_turn_settles_on_the_last_main_turn_after_the_grace_period() -> None:
    c, (_, _, t2) = tool_conversation()
    c.close(name_last_turn=False)
    states, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    assert [e["source"] for e in of_type(emits, "NextStateObserved")] == ["conversation", "conversation"]
    assert tick_processor(TURN_LINKER, states, c.now_ms + 1_000, CONFIG) == []  # still in the grace period
    settled = tick_processor(TURN_LINKER, states, c.now_ms + int(CLOSE_GRACE_S * 1000), CONFIG)
    (end,) = of_type(settled, "NextStateObserved")
    assert end["envelope"]["turn_id"] == t2 and end["source"] == "session_end"


def test_a_request_after_an_explicit_close_reopens_the_session() -> None:
    c = Conversation("s5")
    c.say("hi")
    t0 = c.turn("hello")
    c.close()
    c.tick()
    c.say("one more thing")
    c.turn("sure")
    states, emits = run_processor(TURN_LINKER, c.events, CONFIG)
    (end,) = of_type(emits, "NextStateObserved")
    assert (end["envelope"]["turn_id"], end["source"]) == (t0.turn_id, "session_end")
    assert not next(iter(states.values())).closed


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False))
def test_any_interleaving_of_the_topics_gives_the_same_next_states(rnd: random.Random) -> None:
    """Each topic keeps its own order, but topics are read in any order relative to each other."""
    c, _ = tool_conversation()
    c.say("great")
    c.turn("Glad it helped.")
    c.close()
    queues: dict[str, list[Event]] = {}
    for event in c.events:
        queues.setdefault(TOPIC_OF[event["envelope"]["event_type"]], []).append(event)
    interleaved: list[Event] = []
    while any(queues.values()):
        topic = rnd.choice([t for t, q in queues.items() if q])
        count = rnd.randint(1, 3)
        interleaved.extend(queues[topic][:count])
        del queues[topic][:count]
    assert run_then_settle(interleaved, c.now_ms) == run_then_settle(c.events, c.now_ms)


def test_settling_a_close_after_its_grace_period_returns_a_new_state() -> None:
    """The processor contract: a tick that changes a state emits something or returns another object.

    A close naming no known main turn waits CLOSE_GRACE_S for the turn; settling it clears the
    pending session end even when nothing is emitted (here: no main turn ever came), so the tick must
    hand back a new object, or runtimes that detect change by identity never store it.
    """
    c = Conversation("grace")
    c.close(name_last_turn=False)
    states, _ = run_processor(TURN_LINKER, c.events, CONFIG)
    (state,) = states.values()
    assert state.session_end is not None
    before = TURN_LINKER.state_codec.to_bytes(state)
    new_state, emits = TURN_LINKER.on_tick(state, c.now_ms + int(CLOSE_GRACE_S * 1000), CONFIG)
    assert emits == []
    assert new_state is not state and new_state.session_end is None
    assert TURN_LINKER.state_codec.to_bytes(state) == before  # the stored state was not changed in place
