"""OpenAI chat messages: the one set of rules for reading their content, tool calls and identity.

A message `content` is None, a string, or a list of parts; a text part is a string or an object
with `"type": "text"` or a `"text"` key. From that one definition come three texts:

- `content_text`: readable text for people and judges (parts on their own lines, a placeholder
  such as `[image_url]` for every non-text part);
- `prompt_text`: what the policy model is prompted with (text parts run together, nothing else);
- `message_text`: a message's readable content followed by its tool calls, one line each.

And two ways to tell whether two message lists are the same conversation (why two: see
`conversation_key` and `messages_digest`), and the messages a chat template that knows no tools is
given (`plain_template_messages`: tool calls as `<tool_call>` JSON blocks, tool results as user turns
in `<tool_response>`, tool definitions in the system message; the Hermes / Qwen convention). Used by
serving (chat template, session tracker) and the pipeline (next-state text, conversation diff, the
token ids of imported turns). Reads and writes no topics.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from orl.schemas.errors import OrlError
from orl.schemas.json_depth import loads_within_depth

Message = dict[str, Any]


class UnsupportedContentError(OrlError):
    """A message `content` that is neither None, a string nor a list of parts."""


def part_text(part: Any) -> str | None:
    """The text of a text part; None for any other part (an image, audio, ...)."""
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and (part.get("type") == "text" or "text" in part):
        return str(part.get("text", ""))
    return None


def part_placeholder(part: Any) -> str:
    """How a non-text part shows in readable text: `[its type]`."""
    if isinstance(part, dict):
        return f"[{part.get('type', 'part')}]"
    return str(part)


def content_text(content: Any) -> str:
    """Readable text of a `content`: non-empty parts one per line, non-text parts as placeholders.

    Any other value (an object, a number) is shown as its JSON, so nothing a client sent is hidden.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        shown = [_readable_part(part) for part in content]
        return "\n".join(text for text in shown if text)
    return json.dumps(content, sort_keys=True)


def _readable_part(part: Any) -> str:
    text = part_text(part)
    return text if text is not None else part_placeholder(part)


def prompt_text(content: Any) -> str:
    """The text a model is prompted with: text parts joined with nothing between them, other parts dropped.

    Raises UnsupportedContentError for a content that is not None, a string or a list.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(text for text in map(part_text, content) if text is not None)
    raise UnsupportedContentError(f"unsupported message content of type {type(content).__name__}")


def tool_call_function(call: Any) -> dict[str, Any]:
    """The `function` object of an OpenAI tool call ({} when the call has none)."""
    function = call.get("function") if isinstance(call, dict) else None
    return function if isinstance(function, dict) else {}


def parsed_arguments(arguments: Any) -> Any:
    """Tool-call arguments as JSON values when they are a JSON string within MAX_JSON_DEPTH;
    otherwise unchanged (never raises: the server refuses too-deep arguments with a 400 itself)."""
    if isinstance(arguments, str):
        try:
            return loads_within_depth(arguments)
        except ValueError:  # JsonTooDeep included
            return arguments  # not JSON: keep the raw string the model produced
    return arguments


def tool_calls_text(tool_calls: Any) -> str:
    """OpenAI tool calls as one line each: `[tool call] name(arguments)`, arguments as sent."""
    if not tool_calls:
        return ""
    lines = []
    for call in tool_calls:
        function = tool_call_function(call)
        lines.append(f"[tool call] {function.get('name', '?')}({function.get('arguments', '')})")
    return "\n".join(lines)


def message_role(message: Message) -> str | None:
    """A message's role ("system", "user", "assistant", "tool", ...), or None when it has none."""
    role = message.get("role")
    return None if role is None else str(role)


def message_author(message: Message) -> str | None:
    """Who wrote a message beyond its role: its `name`, else the tool call it answers, or None."""
    author = message.get("name") or message.get("tool_call_id")
    return None if not author else str(author)


def message_text(message: Message) -> str:
    """The readable text of one message: its content, then its tool calls if any."""
    parts = [content_text(message.get("content")), tool_calls_text(message.get("tool_calls"))]
    return "\n".join(part for part in parts if part)


def message_key(message: Message) -> dict[str, Any]:
    """What must match for a re-sent message to count as the same one.

    Lenient on what SDKs change when they echo a reply back: surrounding whitespace, string vs text
    parts, the JSON formatting of tool-call arguments.
    """
    return {
        "role": message.get("role"),
        "content": prompt_text(message.get("content")).strip(),
        "tool_calls": [_tool_call_key(call) for call in message.get("tool_calls") or []],
        "tool_call_id": message.get("tool_call_id"),
    }


def _tool_call_key(call: Any) -> tuple[Any, Any]:
    function = tool_call_function(call)
    return function.get("name"), parsed_arguments(function.get("arguments"))


def conversation_key(messages: Sequence[Message]) -> str:
    """A hash of a message list under `message_key`: the server's own reply matches the client's echo of it.

    Held in memory only (the session tracker), so its rule may change between releases.
    """
    canonical = json.dumps([message_key(m) for m in messages], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def messages_digest(messages: Sequence[Message]) -> str:
    """A hash of a message list by role and `message_text`: a client's request against its next one.

    Stored in the turn linker's changelog-backed state, so its bytes must stay the same across
    releases; that is why it keeps its own, stricter rule instead of `conversation_key`'s.
    """
    normalised = [[str(m.get("role", "")), message_text(m)] for m in messages]
    encoded = json.dumps(normalised, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode()).hexdigest()


def plain_template_messages(
    messages: Sequence[Message], tools: Sequence[dict[str, Any]] | None = None
) -> list[Message]:
    """The messages as a chat template without tool roles gets them: role and prompt text only (and
    an assistant message's `reasoning_content`, for a template that shows earlier reasoning).

    Raises UnsupportedContentError for a message without a role or with unsupported content.
    """
    out: list[Message] = []
    for message in messages:
        role = message.get("role")
        if role is None:
            raise UnsupportedContentError("every message needs a role")
        text = prompt_text(message.get("content"))
        if role == "tool":
            out.append({"role": "user", "content": tool_response_text(message, text)})
        elif role == "assistant" and message.get("tool_calls"):
            out.append(
                {"role": "assistant", "content": assistant_text_with_tool_calls(text, message["tool_calls"])}
            )
        else:
            out.append({"role": role, "content": text})
        if role == "assistant" and isinstance(message.get("reasoning_content"), str):
            out[-1]["reasoning_content"] = message["reasoning_content"]
    if tools:
        out = with_tool_definitions(out, tools)
    return out


def tool_response_text(message: Message, text: str) -> str:
    """A tool result as the user turn a template without tool roles shows."""
    name = message_author(message) or "tool"
    return f'<tool_response name="{name}">\n{text}\n</tool_response>'


def assistant_text_with_tool_calls(text: str, tool_calls: Any) -> str:
    """An assistant reply and its tool calls, each call a `<tool_call>` JSON block on its own lines."""
    blocks = []
    for call in tool_calls or []:
        function = tool_call_function(call)
        arguments = parsed_arguments(function.get("arguments", {}))
        blocks.append(
            "<tool_call>\n"
            + json.dumps({"name": function.get("name"), "arguments": arguments})
            + "\n</tool_call>"
        )
    return "\n".join([text, *blocks]) if text else "\n".join(blocks)


def with_tool_definitions(messages: list[Message], tools: Sequence[dict[str, Any]]) -> list[Message]:
    """The tool signatures and how to call them, appended to the system message (or as the first one)."""
    listing = "\n".join(json.dumps(tool) for tool in tools)
    preamble = (
        "You may call functions. Their signatures:\n<tools>\n"
        + listing
        + '\n</tools>\nTo call one, reply with <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>'
    )
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": messages[0]["content"] + "\n\n" + preamble}
        return [first, *messages[1:]]
    return [{"role": "system", "content": preamble}, *messages]


def conversation_link_keys(messages: Sequence[Message]) -> list[str]:
    """The key of every prefix of `messages` (item i: `messages[: i + 1]`), for linking a resent conversation.

    Lenient as `message_key`, and on one thing more: a tool result is known by which call of the
    preceding assistant message it answers, not by its id, since clients rewrite the ids of calls
    they resend (OpenClaw turns `call_a9567d24` into `calla9567d24`, in the call and its result alike).
    A chain of hashes, so all prefixes cost one pass; a third rule beside `conversation_key` and
    `messages_digest`, held in memory only (the session tracker), so it may change between releases.
    """
    keys: list[str] = []
    running = hashlib.sha256()
    calls: list[Any] = []  # the tool calls of the latest assistant message
    for message in messages:
        key = message_key(message)
        if message.get("role") == "tool":
            key["tool_call_id"] = tool_call_reference(message.get("tool_call_id"), calls)
        elif message.get("role") == "assistant":
            calls = list(message.get("tool_calls") or [])
        # Compact JSON escapes every newline, so one after each message keeps the chain unambiguous.
        running.update(json.dumps(key, sort_keys=True, separators=(",", ":")).encode() + b"\n")
        keys.append(running.hexdigest())
    return keys


def tool_call_reference(tool_call_id: Any, calls: Sequence[Any]) -> int | str | None:
    """Which of `calls` a tool result answers: its index, by id, then by the id's letters and digits only.

    An id that names none of the calls stays as its letters and digits (None when it is not a string).
    """
    if not isinstance(tool_call_id, str):
        return None
    ids = [call.get("id") if isinstance(call, dict) else None for call in calls]
    if tool_call_id in ids:
        return ids.index(tool_call_id)
    wanted = _id_letters_and_digits(tool_call_id)
    loose = [_id_letters_and_digits(i) if isinstance(i, str) else None for i in ids]
    return loose.index(wanted) if wanted in loose else wanted


def _id_letters_and_digits(call_id: str) -> str:
    return "".join(ch for ch in call_id if ch.isalnum())
