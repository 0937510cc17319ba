"""Reasoning in model text: a `<think>...</think>` block before the answer (Qwen3, DeepSeek-R1 and
other thinking chat templates).

A chat template thinks when it holds both markers. The reply's reasoning is the text of its block;
its answer (the `content` clients see, what is parsed for tool calls, what the judge reads) is the
text after `</think>`. The block starts either in the prompt (a generation prompt that ends with an
open `<think>`, as DeepSeek-R1's does) or with the reply itself (Qwen3's model writes `<think>`
first). A block never closed (the reply ran out of tokens) is all reasoning and no answer. Both parts
are stripped of the whitespace around them, as SGLang's and vLLM's reasoning parsers do; the token
ids stay exactly what was sampled.

`ReasoningStream` does the same split on a reply's text as it is generated, for streamed replies:
its reasoning and answer pieces add up to what `split_reasoning` gives for the whole text, however
the text is cut. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from orl.serving.tool_calls import ReplyDelta, ReplyStream

OPEN, CLOSE = "<think>", "</think>"

# Where a reply's reasoning block may start: nowhere (the template does not think), already in the
# prompt (its generation prompt ends inside an open block), or at the start of the reply.
ReasoningStart = Literal["none", "prompt", "reply"]


def template_thinks(chat_template: str) -> bool:
    """Whether a chat template's replies may start with a reasoning block."""
    return OPEN in chat_template and CLOSE in chat_template


def reasoning_start(chat_template: str, prompt_text: str) -> ReasoningStart:
    """Where the reply to `prompt_text` (rendered with `chat_template`) may start reasoning."""
    if not template_thinks(chat_template):
        return "none"
    return "prompt" if prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE) else "reply"


@dataclass(frozen=True)
class SplitReply:
    reasoning: str | None  # None: the reply has no reasoning block
    answer: str


def split_reasoning(text: str, start: ReasoningStart) -> SplitReply:
    """A whole reply's reasoning and answer. A block that starts with the reply counts only at its
    very start (after whitespace)."""
    if start == "prompt":
        body = text
    elif start == "reply" and text.lstrip().startswith(OPEN):
        body = text.lstrip()[len(OPEN) :]
    else:
        return SplitReply(None, text)
    end = body.find(CLOSE)
    if end < 0:
        return SplitReply(body.strip(), "")
    return SplitReply(body[:end].strip(), body[end + len(CLOSE) :].lstrip())


class ReasoningStream:
    """A reply stream whose text may open with a reasoning block: the block's text goes out as
    `ReplyDelta.reasoning`, the answer after it through `answer` (the tool-call splitter, or plain).

    What it holds back: the start of a reply that may still become `<think>` (whitespace, `<th`);
    inside the block, a possible start of `</think>` and trailing whitespace (the reasoning is
    stripped); after it, the answer's leading whitespace.
    """

    def __init__(self, answer: ReplyStream, start: ReasoningStart) -> None:
        self._answer = answer
        states = {"none": "answer", "prompt": "reasoning", "reply": "start"}
        self._state = states[start]  # start | reasoning | answer
        self._pending = ""  # text not yet decided on
        self._reasoning_shown = False
        self._answer_started = start == "none"  # no block: the answer is the reply exactly as written

    def feed(self, piece: str) -> ReplyDelta:
        self._pending += piece
        return self._scan(final=False)

    def finish(self) -> ReplyDelta:
        delta = self._scan(final=True)
        return _joined(delta, self._answer.finish())

    def _scan(self, final: bool) -> ReplyDelta:
        if self._state == "start":
            stripped = self._pending.lstrip()
            if stripped.startswith(OPEN):
                self._state, self._pending = "reasoning", stripped[len(OPEN) :]
            elif final or not OPEN.startswith(stripped):
                self._state = "answer"
                self._answer_started = True  # no block: the answer is the reply exactly as written
            else:
                return ReplyDelta()
        reasoning = ""
        if self._state == "reasoning":
            reasoning = self._reasoning(final)
        if self._state != "answer":
            return ReplyDelta(reasoning=reasoning)
        text, self._pending = self._pending, ""
        if not self._answer_started:
            text = text.lstrip()
            self._answer_started = bool(text)
        return replace(self._answer.feed(text) if text else ReplyDelta(), reasoning=reasoning)

    def _reasoning(self, final: bool) -> str:
        """The block's text that may be shown now; moves to the answer once `</think>` is seen."""
        end = self._pending.find(CLOSE)
        if end >= 0:
            shown, self._pending = self._pending[:end].rstrip(), self._pending[end + len(CLOSE) :]
            self._state = "answer"
        elif final:
            shown, self._pending = self._pending.rstrip(), ""
        else:
            keep = _close_tag_start(self._pending)
            shown = self._pending[: len(self._pending) - keep].rstrip()
            self._pending = self._pending[len(shown) :]
        if not self._reasoning_shown:
            shown = shown.lstrip()
            self._reasoning_shown = bool(shown)
        return shown


def _joined(first: ReplyDelta, second: ReplyDelta) -> ReplyDelta:
    return ReplyDelta(
        content=first.content + second.content,
        tool_calls=first.tool_calls + second.tool_calls,
        reasoning=first.reasoning + second.reasoning,
    )


def _close_tag_start(text: str) -> int:
    """How many characters at the end of `text` may be the start of `</think>`."""
    for length in range(min(len(CLOSE) - 1, len(text)), 0, -1):
        if text.endswith(CLOSE[:length]):
            return length
    return 0
