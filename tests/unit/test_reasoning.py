"""Reasoning blocks in replies: the split of a whole reply, and the streamed split that must add up to it.

Whatever the cut of the text into pieces, the streamed reasoning must join to `split_reasoning`'s
reasoning, and the content and calls to what the tool-call parser gives for its answer.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from orl.serving.reasoning import (
    ReasoningStart,
    ReasoningStream,
    SplitReply,
    reasoning_start,
    split_reasoning,
    template_thinks,
)
from orl.serving.tool_calls import PlainReplyStream, ToolCallSplitter, merged_tool_calls, parse_reply

RID = "chatcmpl-test"
THINKING_TEMPLATE = "{{ '<|im_start|>assistant\\n<think>\\n' }}{# a closed block: </think> #}"
CALL = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'


def test_a_template_thinks_only_with_both_markers() -> None:
    assert template_thinks(THINKING_TEMPLATE)
    assert not template_thinks("{{ '<|im_start|>assistant\\n' }}")
    assert not template_thinks("<think> only")


def test_where_reasoning_starts_follows_the_prompt_end() -> None:
    assert reasoning_start("plain ChatML", "<|im_start|>assistant\n<think>\n") == "none"
    assert reasoning_start(THINKING_TEMPLATE, "...<|im_start|>assistant\n<think>\n") == "prompt"
    # an earlier turn's closed block and a generation prompt that opens none: the model may open one
    closed = "<think>\nhm\n</think>\n\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert reasoning_start(THINKING_TEMPLATE, closed) == "reply"
    assert reasoning_start(THINKING_TEMPLATE, closed + "<think>\n") == "prompt"


def test_whole_replies_split_at_the_closing_marker() -> None:
    assert split_reasoning("\nAdd 2 and 2.\n</think>\n\nIt is 4.", "prompt") == SplitReply(
        "Add 2 and 2.", "It is 4."
    )
    assert split_reasoning("  <think>Add.</think>4", "reply") == SplitReply("Add.", "4")
    assert split_reasoning("never closed ", "prompt") == SplitReply(
        "never closed", ""
    )  # cut off: all reasoning
    assert split_reasoning(" 4 <think>late</think>", "reply") == SplitReply(None, " 4 <think>late</think>")
    assert split_reasoning("<think>x</think>y", "none") == SplitReply(None, "<think>x</think>y")
    assert split_reasoning("</think>", "prompt") == SplitReply("", "")


def streamed(pieces: list[str], start: ReasoningStart, tools: bool = False) -> tuple[str, str, list[dict]]:
    """The reasoning, content and calls a client assembles from the stream."""
    stream = ReasoningStream(ToolCallSplitter(RID) if tools else PlainReplyStream(), start)
    shown = [*(stream.feed(piece) for piece in pieces), stream.finish()]
    calls = merged_tool_calls(c for d in shown for c in d.tool_calls)
    return "".join(d.reasoning for d in shown), "".join(d.content for d in shown), calls


def recorded(text: str, start: ReasoningStart, tools: bool = False) -> tuple[str, str, list[dict]]:
    """What the server records for the whole text: the split, then the answer's calls."""
    split = split_reasoning(text, start)
    if not tools:
        return split.reasoning or "", split.answer, []
    parsed = parse_reply(split.answer, RID)
    return split.reasoning or "", parsed.content or "", parsed.tool_calls


def test_reasoning_streams_before_the_answer_and_holds_back_a_split_marker() -> None:
    stream = ReasoningStream(PlainReplyStream(), "prompt")
    shown = [stream.feed(p) for p in ["\nLet me ", "think. ", "</thi", "nk>\n\n", "Four", "."]]
    assert [(d.reasoning, d.content) for d in shown] == [
        ("Let me", ""),  # leading whitespace stripped, trailing held back
        (" think.", ""),
        ("", ""),  # maybe a closing marker
        ("", ""),  # the answer's leading whitespace is stripped
        ("", "Four"),
        ("", "."),
    ]
    assert stream.finish().content == ""


def test_a_reply_that_may_still_open_a_block_is_held_until_it_does_not() -> None:
    stream = ReasoningStream(PlainReplyStream(), "reply")
    assert stream.feed(" <th").content == ""
    assert stream.feed("e").content == " <the"  # not a block: the reply exactly as written
    assert streamed([" <thi", "nk>x</think> y"], "reply") == ("x", "y", [])


def test_calls_in_the_answer_are_parsed_and_calls_in_the_reasoning_are_not() -> None:
    text = f"I could write {CALL} here.</think>\nCalling. {CALL}"
    assert streamed([text[:20], text[20:45], text[45:]], "prompt", tools=True) == recorded(
        text, "prompt", True
    )
    reasoning, content, calls = recorded(text, "prompt", tools=True)
    assert CALL in reasoning and content == "Calling." and [c["function"]["name"] for c in calls] == ["now"]


pieces_of_text = st.lists(
    st.sampled_from(
        ["<think>", "</think>", "<th", "ink>", "</", "think>", " ", "\n", "a", "b c", CALL, "<tool_call>"]
    ),
    max_size=14,
).map("".join)


@given(text=pieces_of_text, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_the_stream_adds_up_to_the_recorded_split_however_it_is_cut(text: str, cuts: list[int]) -> None:
    bounds = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)], strict=True)]
    for start in ("none", "prompt", "reply"):
        for tools in (False, True):
            assert streamed(pieces, start, tools) == recorded(text, start, tools), (start, tools)
