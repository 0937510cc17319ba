"""Stock OpenClaw's turns link into one session without any header; other conversations stay apart."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from orl.pipeline.processors.next_state_text import next_state_role
from orl.schemas.messages import conversation_link_keys, tool_call_reference
from orl.serving.openai_api import parse_chat_request
from orl.serving.session_tracker import SessionTracker, TurnAssignment

from tests.unit.openclaw_requests import (
    SYSTEM_PROMPT,
    body,
    internal_context,
    resent_assistant,
    server_tool_call,
    user,
)

SYSTEM = {"role": "system", "content": SYSTEM_PROMPT}


def tracker() -> SessionTracker:
    counter = itertools.count()
    return SessionTracker(new_session_id=lambda: f"s{next(counter)}")


def turn(
    t: SessionTracker, messages: list[dict[str, Any]], reply: dict[str, Any], cache_key: str | None
) -> TurnAssignment:
    """One main turn as the app runs it: assign on arrival, remember the reply once it is recorded."""
    assigned = t.assign(messages, cache_key=cache_key)
    t.record_response(assigned, messages, reply)
    return assigned


def three_turns(t: SessionTracker, cache_key: str | None) -> list[TurnAssignment]:
    """A tool call, its result, a thanks: each request drops the last one's internal context."""
    ask = user("Which files are in the project?")
    m0 = [SYSTEM, ask, internal_context(0)]
    r0 = {
        "role": "assistant",
        "content": "",
        "tool_calls": [server_tool_call("call_a9567d24", "exec", {"command": "ls", "timeout": 30})],
    }
    a0 = turn(t, m0, r0, cache_key)
    history = [
        SYSTEM,
        ask,
        resent_assistant(r0),
        {"role": "tool", "tool_call_id": "calla9567d24", "content": "a.txt"},
    ]
    assert (
        history[2]["content"] is None
        and history[2]["tool_calls"][0]["function"]["arguments"] == '{"command":"ls","timeout":30}'
    )
    m1 = [*history, internal_context(1)]
    r1 = {"role": "assistant", "content": "There is one file, a.txt."}
    a1 = turn(t, m1, r1, cache_key)
    m2 = [*history, resent_assistant(r1), user("Thanks!"), internal_context(2)]
    a2 = turn(t, m2, {"role": "assistant", "content": "You're welcome."}, cache_key)
    return [a0, a1, a2]


@pytest.mark.parametrize("cache_key", [None, "4f1c2b7e-session:0"])
def test_an_openclaw_exchange_links_into_one_session(cache_key: str | None) -> None:
    turns = three_turns(tracker(), cache_key)
    assert len({a.session_id for a in turns}) == 1
    assert [a.turn_index for a in turns] == [0, 1, 2]
    assert [a.previous_turn_id for a in turns] == [None, turns[0].turn_id, turns[1].turn_id]
    expected = ["new", "prefix", "prefix"] if cache_key is None else ["cache_key"] * 3
    assert [a.link_method for a in turns] == expected


def test_a_cache_key_comes_after_explicit_ids() -> None:
    t = tracker()
    msgs = [SYSTEM, user("hi")]
    assert t.assign(msgs, header_session="h", cache_key="k:0").session_id == "h"
    assert t.assign(msgs, body_session="b", cache_key="k:0").session_id == "b"
    assert t.assign(msgs, user="u", cache_key="k:0").session_id == "user:u"
    assert t.assign(msgs, cache_key="k:0").session_id == "cache:k:0"


def test_two_openclaw_sessions_with_one_system_prompt_stay_apart() -> None:
    t = tracker()
    ask = user("hi")
    first = [SYSTEM, ask, internal_context(0)]  # both sessions send exactly this first request
    replies = [{"role": "assistant", "content": "Hello!"}, {"role": "assistant", "content": "Hi, what's up?"}]
    starts = [turn(t, first, reply, None) for reply in replies]
    nexts = [
        t.assign([SYSTEM, ask, resent_assistant(r), user("go on"), internal_context(1)]) for r in replies
    ]
    assert starts[0].session_id != starts[1].session_id
    assert [a.session_id for a in nexts] == [a.session_id for a in starts]
    assert [a.link_method for a in nexts] == ["prefix", "prefix"]


def test_a_conversation_two_sessions_answered_alike_links_to_neither() -> None:
    # Nothing tells the two apart once the internal context is dropped: a new session, not a guess.
    t = tracker()
    reply = {"role": "assistant", "content": "Hello!"}
    starts = [turn(t, [SYSTEM, user("hi"), internal_context(n)], reply, None) for n in (0, 1)]
    following = t.assign([SYSTEM, user("hi"), reply, user("go on"), internal_context(2)])
    assert following.link_method == "new"
    assert following.session_id not in {a.session_id for a in starts}


def test_one_session_answering_a_conversation_alike_twice_still_links() -> None:
    t = tracker()
    reply = {"role": "assistant", "content": "Hello!"}
    one = turn(t, [SYSTEM, user("hi"), internal_context(0)], reply, "k:0")
    two = turn(t, [SYSTEM, user("hi"), internal_context(1)], reply, "k:0")  # a retry, say
    following = t.assign([SYSTEM, user("hi"), reply, user("go on"), internal_context(2)])
    assert (following.session_id, following.previous_turn_id) == (one.session_id, two.turn_id)


def test_only_trailing_user_messages_may_be_missing_from_the_resend() -> None:
    t = tracker()
    m0 = [SYSTEM, user("hi"), internal_context(0)]
    reply = {"role": "assistant", "content": "Hello!"}
    turn(t, m0, reply, None)
    # Dropping the question the reply answered is not a resend of this conversation.
    assert t.assign([SYSTEM, reply, user("go on")]).link_method == "new"
    assert t.assign([SYSTEM, user("hello"), reply, user("go on")]).link_method == "new"


def test_tool_results_are_known_by_the_call_they_answer() -> None:
    calls = [
        server_tool_call("call_a_1", "read", {"path": "a"}),
        server_tool_call("call_b_2", "read", {"path": "b"}),
    ]
    sent = {"role": "assistant", "content": None, "tool_calls": calls}
    resent = resent_assistant(sent)

    def results(ids: list[str]) -> list[dict[str, Any]]:
        return [
            {"role": "tool", "tool_call_id": i, "content": c} for i, c in zip(ids, ["A", "B"], strict=True)
        ]

    original = [SYSTEM, sent, *results(["call_a_1", "call_b_2"])]
    altered = [SYSTEM, resent, *results(["calla1", "callb2"])]
    assert conversation_link_keys(original) == conversation_link_keys(altered)
    swapped = [SYSTEM, resent, *results(["callb2", "calla1"])]
    assert conversation_link_keys(swapped)[-1] != conversation_link_keys(altered)[-1]
    assert tool_call_reference("call_b_2", calls) == 1 and tool_call_reference("callb2", calls) == 1
    assert tool_call_reference("call_zz", calls) == "callzz" and tool_call_reference(None, calls) is None


def test_link_keys_are_the_keys_of_every_prefix() -> None:
    messages = [SYSTEM, user("hi"), {"role": "assistant", "content": "Hello!"}, user("bye")]
    keys = conversation_link_keys(messages)
    assert [conversation_link_keys(messages[: i + 1])[-1] for i in range(len(messages))] == keys
    assert len(set(keys)) == len(keys)


def test_an_openclaw_request_keeps_its_prompt_cache_key() -> None:
    sent = body([SYSTEM, user("hi"), internal_context(0)], prompt_cache_key="4f1c2b7e-session:0")
    req = parse_chat_request(json.dumps(sent).encode(), max_tokens_limit=4096)
    assert req.prompt_cache_key == "4f1c2b7e-session:0"
    assert req.stream and req.include_usage and req.max_tokens == 8 and req.tool_choice == "auto"
    assert req.tools is not None and len(req.tools) == 12 and req.user is None and req.session_id is None


def test_a_tool_result_is_the_next_state_even_with_openclaws_internal_context_behind_it() -> None:
    appended = [{"role": "tool", "tool_call_id": "calla9567d24", "content": "a.txt"}, internal_context(1)]
    assert next_state_role(appended) == "tool"
    assert next_state_role([user("Thanks!"), internal_context(2)]) == "user"
    assert next_state_role([]) == "user"


def test_a_session_the_tracker_does_not_hold_continues_its_stored_numbering() -> None:
    stored = {"s1": 2}
    restarted = SessionTracker(stored_next_turn_index=lambda session_id: stored.get(session_id, 0))
    first = restarted.assign([user("Again?")], header_session="s1")
    assert (first.turn_id, first.turn_index) == ("s1/t2", 2)  # not s1/t0, the session's first turn
    restarted.close("s1")
    stored["s1"] = 3
    assert restarted.assign([user("Once more")], header_session="s1").turn_id == "s1/t3"
    assert restarted.assign([user("New")], header_session="s9").turn_id == "s9/t0"
