"""Streaming a reply that may hold `<tool_call>` blocks: what may be shown when, and that it adds up.

The splitter is fed the text piece by piece; whatever the cut, the content deltas must join to what
`parse_reply` gives for the whole text (which the server records) and the calls must be its calls.
"""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from orl.serving.tool_calls import (
    ForcedCallStream,
    PlainReplyStream,
    ReplyDelta,
    ReplyStream,
    RequiredCallStream,
    ToolCallSplitter,
    forced_call,
    merged_tool_calls,
    parse_reply,
    required_call,
)

RID = "chatcmpl-test"
ADD = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
NOW = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'


def deltas(pieces: list[str], stream: ReplyStream | None = None) -> list[ReplyDelta]:
    """One delta per piece, then the one `finish` gives."""
    reply = stream or ToolCallSplitter(RID)
    return [*(reply.feed(piece) for piece in pieces), reply.finish()]


def streamed(pieces: list[str], stream: ReplyStream | None = None) -> tuple[str, list[dict]]:
    """The content and calls a client assembles from the stream."""
    shown = deltas(pieces, stream)
    return "".join(d.content for d in shown), merged_tool_calls(c for d in shown for c in d.tool_calls)


def final(text: str) -> tuple[str, list[dict]]:
    parsed = parse_reply(text, RID)
    return parsed.content or "", parsed.tool_calls


def test_text_only_is_shown_as_it_comes() -> None:
    shown = deltas(["Paris is ", "the capital", "."])
    assert [d.content for d in shown] == ["Paris is", " the capital", ".", ""]  # a space waits for more text
    assert all(not d.tool_calls for d in shown)
    assert streamed(["Paris is", " the capital", ".\n"]) == ("Paris is the capital.\n", [])  # kept: no call


def test_a_call_at_the_end_is_given_whole_once_its_block_closes() -> None:
    pieces = [
        "Let me add. ",
        "<tool_",
        "call>\n{",
        '"name": "add", "arguments": {"a": 1, "b": 2}}',
        "\n</tool_call>",
    ]
    shown = deltas(pieces)
    assert [d.content for d in shown] == [
        "Let me add.",
        "",
        "",
        "",
        "",
        "",
    ]  # the space before the call is dropped
    assert [len(d.tool_calls) for d in shown] == [0, 0, 0, 0, 1, 0]
    call = shown[4].tool_calls[0]
    assert call["index"] == 0 and call["type"] == "function"
    assert call["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert streamed(pieces) == final("".join(pieces))


def test_text_then_call_then_text() -> None:
    pieces = ["First.\n", ADD, "\nThen more.", " Done.  "]
    shown = deltas(pieces)
    assert [d.content for d in shown] == ["First.", "", "\n\nThen more.", " Done.", ""]
    assert streamed(pieces) == final("".join(pieces))
    assert streamed(pieces)[0] == "First.\n\nThen more. Done."


def test_an_open_tag_cut_across_pieces_is_held_until_decided() -> None:
    pieces = ["Hi <", "tool", "_ca", "ll>", NOW[len("<tool_call>") :]]
    shown = deltas(pieces)
    assert [d.content for d in shown] == ["Hi", "", "", "", "", ""]
    assert shown[4].tool_calls[0]["function"]["name"] == "now"


def test_a_less_than_sign_that_is_no_tag_is_shown_once_the_next_piece_says_so() -> None:
    shown = deltas(["1 <", " 2 and a <tool", "box> b"])
    assert [d.content for d in shown] == ["1", " < 2 and a", " <toolbox> b", ""]
    assert streamed(["x<"]) == ("x<", [])  # a `<` at the very end is text


def test_malformed_json_in_a_block_stays_content() -> None:
    pieces = ["Try ", "<tool_call>{oops", "</tool_call>", " end"]
    assert deltas(pieces)[2].content == " <tool_call>{oops</tool_call>"
    assert streamed(pieces) == ("Try <tool_call>{oops</tool_call> end", [])
    assert streamed(pieces) == final("".join(pieces))


def test_two_calls_get_indexes_and_the_ids_of_the_final_parse() -> None:
    text = f"{ADD}\n{NOW}"
    shown = deltas([ADD, "\n", NOW])
    assert [[c["index"] for c in d.tool_calls] for d in shown] == [[0], [], [1], []]
    assert streamed([ADD, "\n", NOW]) == final(text) == ("", parse_reply(text, RID).tool_calls)


def test_an_unclosed_block_at_the_end_is_a_call_when_its_json_is_whole() -> None:
    pieces = ["<tool_call>", '{"name": "now", "arguments": {}}']
    assert [len(d.tool_calls) for d in deltas(pieces)] == [0, 0, 1]
    assert streamed(pieces) == final("".join(pieces))
    assert streamed(["<tool_call>", '{"name": "now"']) == ('<tool_call>{"name": "now"', [])


def test_leading_whitespace_waits_for_the_first_call_or_the_end() -> None:
    # parse_reply strips the content of a reply with calls only: until a call or the end, unknown
    assert [d.content for d in deltas(["\n Hi", " there", NOW])] == ["", "", "Hi there", ""]
    assert [d.content for d in deltas(["\n Hi", " there"])] == ["", "", "\n Hi there"]


def test_without_tools_every_piece_is_content() -> None:
    assert [d.content for d in deltas(["a ", "<tool_call>", " "], PlainReplyStream())] == [
        "a ",
        "<tool_call>",
        " ",
        "",
    ]


def test_a_forced_call_opens_at_once_and_gets_the_final_arguments_at_the_end() -> None:
    pieces = ['"a": 2,', ' "b": 3}}', "\n</tool_call>"]
    shown = deltas(pieces, ForcedCallStream("add", RID))
    assert shown[0].tool_calls[0]["function"] == {"name": "add", "arguments": ""}
    assert [len(d.tool_calls) for d in shown] == [1, 0, 0, 1]
    assert streamed(pieces, ForcedCallStream("add", RID)) == (
        "",
        forced_call("add", "".join(pieces), RID).tool_calls,
    )
    assert streamed([], ForcedCallStream("add", RID))[1][0]["function"]["name"] == "add"  # even with no text


ATOMS = [
    "Hi",
    " ",
    "\n",
    "\t",
    "x",
    "<",
    "</",
    "<tool",
    "<tool_call>",
    "</tool_call>",
    "tool_call>",
    '{"name": "f", "arguments": {"a": [1, "<"]}}',
    '{"name": "g"}',
    json.dumps({"name": "h", "arguments": "raw"}),
    "{oops",
    '"',
    "}",
    ADD,
    NOW,
]
replies = st.lists(st.sampled_from(ATOMS) | st.text(max_size=4), max_size=10).map("".join)


def cut(text: str, points: list[int]) -> list[str]:
    edges = [0, *sorted(p % (len(text) + 1) for p in points), len(text)]
    return [text[a:b] for a, b in zip(edges, edges[1:], strict=False)]


@given(replies, st.lists(st.integers(min_value=0), max_size=8))
def test_any_cut_streams_what_the_whole_reply_parses_to(text: str, points: list[int]) -> None:
    assert streamed(cut(text, points)) == streamed([text]) == final(text)


@given(replies, st.lists(st.integers(min_value=0), max_size=8))
def test_a_forced_call_streams_its_final_call_for_any_cut(text: str, points: list[int]) -> None:
    want = forced_call("f", text, RID).tool_calls
    assert streamed(cut(text, points), ForcedCallStream("f", RID)) == ("", want)


def test_a_required_call_is_the_call_object_the_model_wrote_after_the_prompts_prefix() -> None:
    [call] = required_call('{"name": "add", "arguments": {"a": 1}}', RID).tool_calls
    assert call["function"] == {"name": "add", "arguments": '{"a": 1}'}
    unparsed = required_call("oops", RID)  # no call: the text stays, as any unparsed block does
    assert unparsed.tool_calls == [] and unparsed.content == "<tool_call>oops"


@given(replies, st.lists(st.integers(min_value=0), max_size=8))
def test_a_required_call_streams_what_its_whole_reply_parses_to(text: str, points: list[int]) -> None:
    want = required_call(text, RID)
    assert streamed(cut(text, points), RequiredCallStream(RID)) == (want.content or "", want.tool_calls)
