"""Rendering OpenAI chat messages, responses and next states as readable text for the pipeline.

Used by the turn linker (the content of a conversation next state) and by the judge prompts. How a
message's content and tool calls read as text is `orl.schemas.messages`; this module lays messages out
(labels, the request a judge sees, truncation). Reads and writes no topics.
"""

from __future__ import annotations

import json

from orl.schemas.messages import Message, message_author, message_role, message_text, tool_calls_text

# Roles of NextStateObserved: who produced what came after the response.
NEXT_STATE_ROLE_BY_MESSAGE_ROLE = {"user": "user", "tool": "tool", "function": "tool"}


def message_label(message: Message) -> str:
    role = message_role(message) or "unknown"
    author = message_author(message)
    return f"{role} ({author})" if author else role


def render_messages(messages: list[Message]) -> str:
    """Messages as `[role] text` blocks separated by blank lines."""
    return "\n\n".join(f"[{message_label(m)}]\n{message_text(m)}" for m in messages)


def next_state_role(messages: list[Message]) -> str:
    """The NextStateObserved role for appended messages: that of the first one (user / tool / environment).

    The first message is what answered the response: after a tool call, its result, even when the
    client appends a user-role message of its own behind it (OpenClaw's internal context).
    """
    if not messages:
        return "user"
    return NEXT_STATE_ROLE_BY_MESSAGE_ROLE.get(message_role(messages[0]) or "", "environment")


def render_response(response_text: str, tool_calls_json: str | None) -> str:
    """A response as the judge should see it: its text and its tool calls."""
    tool_calls = json.loads(tool_calls_json) if tool_calls_json else None
    parts = [response_text, tool_calls_text(tool_calls)]
    return "\n".join(part for part in parts if part) or "(empty response)"


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of an over-long text, saying how much was cut."""
    if len(text) <= max_chars:
        return text
    keep = max(max_chars // 2, 1)
    cut = len(text) - 2 * keep
    return f"{text[:keep]}\n[... {cut} characters omitted ...]\n{text[-keep:]}"


def last_user_index(messages: list[Message]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        if message_role(messages[index]) == "user":
            return index
    return None


def render_request(messages: list[Message], max_chars: int = 8000) -> str:
    """The user's request for a judge: the last user message and every step after it.

    Earlier history (often a long system prompt) is left out; each part is truncated in the middle.
    """
    start = last_user_index(messages)
    relevant = messages[start:] if start is not None else messages[-1:]
    per_message = max(max_chars // max(len(relevant), 1), 200)
    rendered = [f"[{message_label(m)}]\n{truncate_middle(message_text(m), per_message)}" for m in relevant]
    return "\n\n".join(rendered) or "(no request messages)"
