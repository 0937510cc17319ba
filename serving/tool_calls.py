"""Tool calls in model text: the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` convention.

Small local models have no native tool-call format, so orl uses the Hermes/Qwen convention: the chat
template tells the model the tools and this markup; this module turns the generated text into
OpenAI `tool_calls`, and builds the prefix that forces a call when `tool_choice` names a function
(the prefix is part of the prompt, so only sampled tokens are ever trained on).

For streamed replies, the `ReplyStream` classes turn the text as it is generated into what may be
shown at once: content deltas and finished calls that add up to what `parse_reply` (or
`forced_call`) gives for the whole text, which is what the server records. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from orl.schemas.ids import deterministic_id
from orl.schemas.json_depth import loads_within_depth

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    tool_calls: list[dict[str, Any]]


def call_id(request_id: str, index: int) -> str:
    """The id of a reply's `index`-th tool call: derived from the request id, so replays give the same id."""
    return "call_" + deterministic_id("tool_call", request_id, index).split("-", 1)[1]


def forced_call_prefix(function_name: str, *, constrained: bool = False) -> str:
    """Text appended after the assistant header so the model must write `function_name`'s arguments
    object. `constrained` (a strict tool, its schema enforced by constrained decoding): the prefix
    stops before the object, which the grammar then makes the model write whole."""
    head = f'{OPEN}{{"name": {json.dumps(function_name)}, "arguments": '
    return head if constrained else head + "{"


# tool_choice required among several tools: the prompt opens a call, and constrained decoding
# makes the reply a call object that names one of the tools. Its text is parsed after this prefix.
REQUIRED_CALL_PREFIX = OPEN


def required_call(generated: str, request_id: str) -> ParsedReply:
    """The reply to a required call's prompt: `parse_reply` of the prefix and what the model wrote
    after it (a call whose name or arguments do not parse stays text, prefix included, as any
    unparsed block does)."""
    return parse_reply(REQUIRED_CALL_PREFIX + generated, request_id)


def forced_call(
    function_name: str, generated: str, request_id: str, *, constrained: bool = False
) -> ParsedReply:
    """The call a forced prefix produced: the arguments object the model wrote after it
    (`constrained`: as `forced_call_prefix`, the model wrote the whole object).

    When the model's arguments are not valid JSON they are returned as written (OpenAI's
    documented behaviour: arguments may not be valid JSON), never dropped.
    """
    text = generated if constrained else "{" + generated
    try:
        arguments, _ = json.JSONDecoder().raw_decode(text)
        arguments_text = json.dumps(arguments)
    except (ValueError, RecursionError):  # RecursionError: nested thousands deep, kept as written
        arguments_text = text.split(CLOSE)[0].strip()
    return ParsedReply(
        content=None,
        tool_calls=[
            {
                "id": call_id(request_id, 0),
                "type": "function",
                "function": {"name": function_name, "arguments": arguments_text},
            }
        ],
    )


def parse_reply(text: str, request_id: str) -> ParsedReply:
    """Split generated text into content and OpenAI-shaped tool calls (ids derived from the request id)."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []  # text outside well-formed calls stays content
    position = 0
    for match in _CALL_RE.finditer(text):
        name, arguments = _name_and_arguments(match.group(1))
        if name is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(
            {
                "id": call_id(request_id, len(calls)),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
    if not calls:
        return ParsedReply(content=text, tool_calls=[])
    rest = ("".join(kept) + text[position:]).strip()
    return ParsedReply(content=rest or None, tool_calls=calls)


def _name_and_arguments(body: str) -> tuple[str | None, str]:
    try:
        payload = loads_within_depth(body)
    except ValueError:  # JsonTooDeep included
        return None, "{}"  # not a call: the text stays in `content`, so nothing the model wrote is lost
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None, "{}"
    arguments = payload.get("arguments", {})
    return payload["name"], arguments if isinstance(arguments, str) else json.dumps(arguments)


@dataclass(frozen=True)
class ReplyDelta:
    """What a piece of generated text lets a stream show now: content, OpenAI `tool_calls` deltas, and
    reasoning (`orl.serving.reasoning`)."""

    content: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()  # each with its `index`, as in a chat.completion.chunk
    reasoning: str = ""


class ReplyStream(Protocol):
    """Fed a reply's text piece by piece; the deltas add up to the reply's final message."""

    def feed(self, piece: str) -> ReplyDelta: ...

    def finish(self) -> ReplyDelta: ...


class PlainReplyStream:
    """No tools offered (or `tool_choice` "none"): the text is the content, shown as it comes."""

    def feed(self, piece: str) -> ReplyDelta:
        return ReplyDelta(piece)

    def finish(self) -> ReplyDelta:
        return ReplyDelta()


class ForcedCallStream:
    """`tool_choice` names a function: the call's id and name go out at once, its arguments at the end.

    `forced_call` re-serializes the arguments the model wrote, so raw fragments would not add up to
    them; the reply has no content, so nothing else streams.
    """

    def __init__(self, function_name: str, request_id: str, *, constrained: bool = False) -> None:
        self._name, self._request_id, self._constrained = function_name, request_id, constrained
        self._pieces: list[str] = []
        self._opened = False

    def feed(self, piece: str) -> ReplyDelta:
        self._pieces.append(piece)
        return self._open()

    def finish(self) -> ReplyDelta:
        call = forced_call(
            self._name, "".join(self._pieces), self._request_id, constrained=self._constrained
        ).tool_calls[0]
        arguments = {"index": 0, "function": {"arguments": call["function"]["arguments"]}}
        return ReplyDelta(tool_calls=(*self._open().tool_calls, arguments))

    def _open(self) -> ReplyDelta:
        if self._opened:
            return ReplyDelta()
        self._opened = True
        opening = {"name": self._name, "arguments": ""}
        return ReplyDelta(
            tool_calls=(
                {"index": 0, "id": call_id(self._request_id, 0), "type": "function", "function": opening},
            )
        )


class RequiredCallStream:
    """A required call's reply as `ToolCallSplitter` streams it, the prompt's prefix fed first, so
    the deltas add up to `required_call`."""

    def __init__(self, request_id: str) -> None:
        self._splitter = ToolCallSplitter(request_id)
        self._splitter.feed(REQUIRED_CALL_PREFIX)  # inside a block: nothing shows yet

    def feed(self, piece: str) -> ReplyDelta:
        return self._splitter.feed(piece)

    def finish(self) -> ReplyDelta:
        return self._splitter.finish()


class ToolCallSplitter:
    """A reply that may hold `<tool_call>` blocks: content once it is known to be content, calls once closed.

    Gives the same content and calls as `parse_reply` on the whole text, however the text is cut
    into pieces. What it holds back, and why:

    * a possible start of `<tool_call>` at the end of the text so far (`<`, `<tool_c`), until the
      next piece (or the end) decides;
    * a block from `<tool_call>` to its `</tool_call>`, or to the end of the reply (an unclosed block
      may still be a call); a block that is not a call is shown as content;
    * trailing whitespace: the content of a reply with calls is stripped, so whitespace is shown
      only once more content follows it;
    * a reply that starts with whitespace, until its first call or its end: only then is it known
      whether that whitespace is content (no call) or stripped (a call). Rare, and exact.
    """

    def __init__(self, request_id: str) -> None:
        self._request_id = request_id
        self._pending = ""  # text not yet scanned; inside a block, the block's text after `<tool_call>`
        self._in_block = False
        self._held = ""  # content not yet shown
        self._shown = False
        self._calls = 0

    def feed(self, piece: str) -> ReplyDelta:
        self._pending += piece
        calls = self._scan(final=False)
        return ReplyDelta(self._release(final=False), calls)

    def finish(self) -> ReplyDelta:
        calls = self._scan(final=True)
        return ReplyDelta(self._release(final=True), calls)

    def _scan(self, final: bool) -> tuple[dict[str, Any], ...]:
        calls: list[dict[str, Any]] = []
        while True:
            if not self._in_block:
                at = self._pending.find(OPEN)
                if at < 0:
                    cut = len(self._pending) - (0 if final else _open_tag_start(self._pending))
                    self._held, self._pending = self._held + self._pending[:cut], self._pending[cut:]
                    return tuple(calls)
                self._held += self._pending[:at]
                self._pending, self._in_block = self._pending[at + len(OPEN) :], True
            end = self._pending.find(CLOSE)
            if end < 0 and not final:
                return tuple(calls)
            end = len(self._pending) if end < 0 else end + len(CLOSE)
            call = self._block(OPEN + self._pending[:end])
            if call is not None:
                calls.append(call)
            self._pending, self._in_block = self._pending[end:], False

    def _block(self, block: str) -> dict[str, Any] | None:
        """The call a whole block (closed, or running to the end of the reply) makes, else None."""
        match = _CALL_RE.match(block)
        name, arguments = _name_and_arguments(match.group(1)) if match else (None, "")
        if name is None:
            self._held += block  # not a call: the text stays content, as in parse_reply
            return None
        index, self._calls = self._calls, self._calls + 1
        function = {"name": name, "arguments": arguments}
        return {
            "index": index,
            "id": call_id(self._request_id, index),
            "type": "function",
            "function": function,
        }

    def _release(self, final: bool) -> str:
        held = self._held
        if self._calls and not self._shown:
            held = held.lstrip()  # a reply with calls has its content stripped
        elif not self._shown and held[:1].isspace() and not final:
            return ""  # leading whitespace: content only if no call ever comes
        shown = held if final and not self._calls else held.rstrip()
        self._held = held[len(shown) :]
        self._shown = self._shown or bool(shown)
        return shown


def merged_tool_calls(deltas: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool calls a client assembles from streamed deltas: by index, argument fragments joined."""
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        call = calls.setdefault(delta["index"], {"function": {"arguments": ""}})
        for key in ("id", "type"):
            if key in delta:
                call[key] = delta[key]
        function = delta.get("function", {})
        if "name" in function:
            call["function"]["name"] = function["name"]
        call["function"]["arguments"] += function.get("arguments", "")
    return [
        {"id": c.get("id"), "type": c.get("type"), "function": c["function"]}
        for _, c in sorted(calls.items())
    ]


def _open_tag_start(text: str) -> int:
    """How many characters at the end of `text` may be the start of `<tool_call>`."""
    for length in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:length]):
            return length
    return 0
