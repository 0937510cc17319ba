"""OpenClaw-shaped chat requests, as a probe of stock OpenClaw 2026.9.6 saw them (no real traffic).

What the shapes copy: a long system prompt; after the history a user message of text parts holding
`<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>...` that the next request does not resend; tool calls resent
with the `_` dropped from their ids (the tool result uses the altered id), compact arguments and
`content: null`; always streaming with usage, `max_completion_tokens`, 12 function tools with
`tool_choice: "auto"`, no temperature, no session header and no `user`; `prompt_cache_key:
"<sessionId>:0"` when the provider sets `compat.supportsPromptCacheKey`.
"""

from __future__ import annotations

import json
from typing import Any

SYSTEM_PROMPT = "You are a personal assistant running inside OpenClaw. " * 740  # about 40k characters
TOOL_NAMES = [
    "read",
    "write",
    "edit",
    "exec",
    "process",
    "web_search",
    "web_fetch",
    "browser",
    "message",
    "cron",
    "sessions_list",
    "session_status",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in TOOL_NAMES
]


def internal_context(turn: int) -> dict[str, Any]:
    """The trailing user message OpenClaw appends to every request and never keeps in its history."""
    text = (
        "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\n"
        f"Current time: 2026-09-06T12:0{turn}:00Z. Workspace: /home/user/project.\n"
        "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"
    )
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text}]}


def server_tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool call as the server answers it: its own id, arguments as `json.dumps` spaces them."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def resent_assistant(reply: dict[str, Any]) -> dict[str, Any]:
    """An assistant reply as OpenClaw resends it: ids without `_`, compact arguments, null content."""
    calls = [
        {
            "id": call["id"].replace("_", ""),
            "type": "function",
            "function": {
                "name": call["function"]["name"],
                "arguments": json.dumps(json.loads(call["function"]["arguments"]), separators=(",", ":")),
            },
        }
        for call in reply.get("tool_calls") or []
    ]
    if not calls:
        return {"role": "assistant", "content": reply["content"]}
    return {"role": "assistant", "content": reply.get("content") or None, "tool_calls": calls}


def body(messages: list[dict[str, Any]], prompt_cache_key: str | None = None) -> dict[str, Any]:
    """A request body as stock OpenClaw posts it to /v1/chat/completions."""
    sent: dict[str, Any] = {
        "model": "orl-policy",
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_completion_tokens": 8,
        "tools": TOOLS,
        "tool_choice": "auto",
    }
    if prompt_cache_key is not None:
        sent["prompt_cache_key"] = prompt_cache_key
    return sent
