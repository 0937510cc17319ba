"""Tool calls in model text: the `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` convention.

Small local models have no native tool-call format, so orl uses the Hermes/Qwen convention: the chat
template tells the model the tools and this markup; this module turns the generated text into
OpenAI `tool_calls`, and builds the prefix that forces a call when `tool_choice` names a function
(the prefix is part of the prompt, so only sampled tokens are ever trained on).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from schemas.ids import deterministic_id

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ParsedReply:
    content: str | None
    tool_calls: list[dict[str, Any]]


def forced_call_prefix(function_name: str) -> str:
    """Text appended after the assistant header so the model must write `function_name`'s arguments object."""
    return f'{OPEN}{{"name": {json.dumps(function_name)}, "arguments": {{'


def forced_call(function_name: str, generated: str, request_id: str) -> ParsedReply:
    """The call a forced prefix produced: the arguments object the model wrote after it.

    When the model's arguments are not valid JSON they are returned as written (OpenAI's
    documented behaviour: arguments may not be valid JSON), never dropped.
    """
    text = "{" + generated
    try:
        arguments, _ = json.JSONDecoder().raw_decode(text)
        arguments_text = json.dumps(arguments)
    except ValueError:
        arguments_text = text.split(CLOSE)[0].strip()
    call_id = "call_" + deterministic_id("tool_call", request_id, 0).split("-", 1)[1]
    return ParsedReply(
        content=None,
        tool_calls=[
            {
                "id": call_id,
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
        call_id = "call_" + deterministic_id("tool_call", request_id, len(calls)).split("-", 1)[1]
        calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    if not calls:
        return ParsedReply(content=text, tool_calls=[])
    rest = ("".join(kept) + text[position:]).strip()
    return ParsedReply(content=rest or None, tool_calls=calls)


def _name_and_arguments(body: str) -> tuple[str | None, str]:
    try:
        payload = json.loads(body)
    except ValueError:
        return None, "{}"  # not a call: the text stays in `content`, so nothing the model wrote is lost
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None, "{}"
    arguments = payload.get("arguments", {})
    return payload["name"], arguments if isinstance(arguments, str) else json.dumps(arguments)
