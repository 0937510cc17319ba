"""Session and turn assignment: explicit ids, prefix linking of header-less clients, side turns."""

import itertools

from orl.serving.session_tracker import SessionTracker, conversation_key


def tracker() -> SessionTracker:
    counter = itertools.count()
    return SessionTracker(new_session_id=lambda: f"s{next(counter)}")


def test_header_beats_body_beats_user() -> None:
    t = tracker()
    msgs = [{"role": "user", "content": "hi"}]
    assert t.assign(msgs, header_session="h", body_session="b", user="u").session_id == "h"
    assert t.assign(msgs, body_session="b", user="u").session_id == "b"
    a = t.assign(msgs, user="u")
    assert (a.session_id, a.link_method) == ("user:u", "user")


def test_three_turns_without_headers_link_by_prefix() -> None:
    t = tracker()
    m1 = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "What is 2+2?"}]
    a1 = t.assign(m1)
    r1 = {"role": "assistant", "content": "4"}
    t.record_response(a1, m1, r1)
    m2 = [*m1, {"role": "assistant", "content": " 4 "}, {"role": "user", "content": "and 3+3?"}]
    a2 = t.assign(m2)
    r2 = {"role": "assistant", "content": "6", "tool_calls": None}
    t.record_response(a2, m2, r2)
    m3 = [*m2, r2, {"role": "user", "content": "thanks"}]
    a3 = t.assign(m3)
    assert a1.link_method == "new" and a2.link_method == "prefix" and a3.link_method == "prefix"
    assert a1.session_id == a2.session_id == a3.session_id
    assert [a1.turn_index, a2.turn_index, a3.turn_index] == [0, 1, 2]
    assert a2.previous_turn_id == a1.turn_id and a3.previous_turn_id == a2.turn_id


def test_unrelated_conversation_starts_a_new_session() -> None:
    t = tracker()
    m1 = [{"role": "user", "content": "a"}]
    a1 = t.assign(m1)
    t.record_response(a1, m1, {"role": "assistant", "content": "b"})
    a2 = t.assign(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "DIFFERENT"},
            {"role": "user", "content": "c"},
        ]
    )
    assert a2.session_id != a1.session_id and a2.link_method == "new"


def test_side_turns_do_not_move_the_main_chain() -> None:
    t = tracker()
    msgs = [{"role": "user", "content": "x"}]
    main = t.assign(msgs, header_session="s")
    side = t.assign([{"role": "user", "content": "summarize"}], header_session="s", main=False)
    nxt = t.assign(msgs, header_session="s")
    assert side.previous_turn_id is None
    assert nxt.previous_turn_id == main.turn_id
    assert side.turn_index == 1 and nxt.turn_index == 2


def test_concurrent_requests_are_ordered_by_arrival() -> None:
    t = tracker()
    first = t.assign([{"role": "user", "content": "1"}], header_session="s")
    second = t.assign([{"role": "user", "content": "2"}], header_session="s")
    assert (first.turn_index, second.turn_index) == (0, 1)


def test_tool_call_arguments_compare_as_json() -> None:
    call = {"function": {"name": "f", "arguments": '{"a": 1, "b": 2}'}}
    same = {"function": {"name": "f", "arguments": '{"b":2,"a":1}'}}
    m1 = [{"role": "assistant", "content": None, "tool_calls": [call]}]
    m2 = [{"role": "assistant", "content": "", "tool_calls": [same]}]
    assert conversation_key(m1) == conversation_key(m2)


def test_close_forgets_the_session() -> None:
    t = tracker()
    t.assign([{"role": "user", "content": "x"}], header_session="s")
    assert t.close("s") is True
    assert t.close("s") is False
    assert t.assign([{"role": "user", "content": "x"}], header_session="s").turn_index == 0
