"""Every request field of OpenAI's chat completions, and what `orl serve` does with it (issue 49's audit).

One table, `CHAT_FIELDS`, read by the request parser (serving/openai_api.py), the OpenAPI document
(serving/openapi.py) and the docs' table (docs/clients.md, checked against it by a test). Each field
is one of:

- honoured: parsed and acted on (`parse_chat_request` reads it);
- taken as given: any valid value leaves the answer as orl samples and records it (the reason says why);
- limited: only `accepted` values are taken, the ones that leave the answer as orl samples and
  records it; any other value is a 400 `unsupported_parameter` naming the field and the reason.

A field the table does not name is a 400 `unknown_parameter` naming it: none is silently ignored.
Pure data and checks; reads and writes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from orl.schemas.errors import OrlError

Treatment = Literal["honoured", "taken as given", "limited"]


@dataclass(frozen=True)
class ChatField:
    name: str
    treatment: Treatment
    effect: str  # what orl does with it (the docs' table, the OpenAPI description)
    accepted: tuple[Any, ...] = ()  # limited: the values taken (JSON values; null means absent)
    schema: dict[str, Any] | None = None  # taken as given: the JSON Schema of a valid value


def honoured(name: str, effect: str) -> ChatField:
    return ChatField(name, "honoured", effect)


def as_given(name: str, effect: str, schema: dict[str, Any]) -> ChatField:
    return ChatField(name, "taken as given", effect, schema=schema)


def limited(name: str, effect: str, *accepted: Any) -> ChatField:
    return ChatField(name, "limited", effect, accepted=(None, *accepted))


_NOT_RECORDED_DISTRIBUTION = "would sample from another distribution than the one orl records and trains on"

CHAT_FIELDS: tuple[ChatField, ...] = (
    honoured("model", "recorded with the turn; the served policy answers whatever the name"),
    honoured("messages", "rendered with the model's chat template; text parts only"),
    honoured(
        "tools",
        "rendered with the chat template; tool calls are parsed from the output; strict: true only where "
        "tool_choice makes a call (named or required), whose arguments are then held to its schema by "
        "constrained decoding",
    ),
    honoured(
        "tool_choice",
        "none, auto, required (the only tool's call, forced; among several, a call that constrained "
        "decoding holds to name one of them) or a named function, which is forced",
    ),
    honoured("stream", "server-sent chunks, then [DONE]"),
    honoured(
        "stream_options", "include_usage adds the usage chunk; include_obfuscation has no effect (no padding)"
    ),
    honoured("temperature", "sampling temperature, recorded; logprobs are at this temperature"),
    honoured("top_p", "nucleus sampling, recorded"),
    honoured("max_tokens", "the completion's token limit"),
    honoured("max_completion_tokens", "the completion's token limit (wins over max_tokens)"),
    honoured("stop", "up to 4 stop sequences"),
    honoured("seed", "seeds the sampler, recorded"),
    honoured("user", "links the turn to a session"),
    honoured("prompt_cache_key", "links the turn to a session (stock OpenClaw sends one per session)"),
    honoured("session_id", "orl's own: links the turn to this session"),
    honoured("logprobs", "each sampled token's logprob, exactly as recorded, with its bytes"),
    limited(
        "top_logprobs",
        "0 only: orl keeps the sampled token's logprob, not the K most likely alternatives",
        0,
    ),
    honoured(
        "n",
        "1 to 8 choices; each is the one turn of a session of its own, and the n sessions form a rollout "
        "group (as X-Group-Id); not with stream, a named session or X-Group-Id",
    ),
    honoured(
        "response_format",
        "text, json_object or json_schema, enforced by constrained decoding (llguidance); such a turn is "
        "recorded as constrained and never trained on",
    ),
    honoured(
        "parallel_tool_calls",
        "false: the reply ends with its first complete tool call (a stop string that closes the call, "
        "recorded with the turn's sampling), so it holds at most one",
    ),
    limited("frequency_penalty", f"0 only: a penalty {_NOT_RECORDED_DISTRIBUTION}", 0),
    limited("presence_penalty", f"0 only: a penalty {_NOT_RECORDED_DISTRIBUTION}", 0),
    limited("logit_bias", f"empty only: a bias {_NOT_RECORDED_DISTRIBUTION}", {}),
    limited("modalities", "text only: the served model reads and writes text", ["text"]),
    limited("audio", "absent only: the served model writes no audio"),
    limited("prediction", "absent only: no speculative decoding from a predicted output"),
    limited("web_search_options", "absent only: orl has no web search"),
    limited("functions", "absent only: the deprecated form of tools; send tools"),
    limited("function_call", "absent only: the deprecated form of tool_choice; send tool_choice"),
    limited("reasoning_effort", "absent only: the served model has no reasoning control"),
    limited(
        "verbosity",
        "medium only: the served model has no verbosity control (medium is the default)",
        "medium",
    ),
    limited("service_tier", "auto or default: orl has one tier", "auto", "default"),
    as_given(
        "store",
        "orl has no stored-completions API to keep the answer for; every turn is recorded on the "
        "event log for training whatever the value, which is what orl is run for",
        {"type": ["boolean", "null"]},
    ),
    as_given(
        "metadata",
        "labels for OpenAI's dashboard; orl has none, and does not record them",
        {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    ),
    as_given(
        "safety_identifier",
        "an end-user id for OpenAI's abuse checks; orl has none, and does not record it",
        {"type": ["string", "null"]},
    ),
    as_given(
        "prompt_cache_retention",
        "how long OpenAI keeps a prompt cache; orl keeps none",
        {"enum": ["in_memory", "24h", None]},
    ),
)

FIELDS_BY_NAME = {field.name: field for field in CHAT_FIELDS}
STREAM_OPTIONS = ("include_usage", "include_obfuscation")


class FieldRefused(OrlError):
    """A field orl does not know, or a value it does not take: `code` is OpenAI's error code."""

    def __init__(self, name: str, message: str, code: str) -> None:
        super().__init__(message)
        self.name, self.message, self.code = name, message, code


def check_fields(
    body: dict[str, Any], fields: dict[str, ChatField] = FIELDS_BY_NAME, api: str = "chat-completions"
) -> None:
    """Raise FieldRefused for the first field of `body` that `fields` (the table of the `api`'s request
    fields) does not name, or whose value orl does not take."""
    for name in sorted(body):
        field = fields.get(name)
        if field is None:
            raise FieldRefused(
                name,
                f"'{name}' is not a {api} request field orl knows (docs/clients.md)",
                "unknown_parameter",
            )
        value = body[name]
        if field.treatment == "limited" and not any(_same(value, a) for a in field.accepted):
            raise FieldRefused(
                name, f"{name}={_shown(value)} is not supported: {field.effect}", "unsupported_parameter"
            )
        if field.treatment == "taken as given" and not _valid(value, field.schema or {}):
            raise FieldRefused(name, f"'{name}' is not valid here: {field.effect}", "invalid_type")


def _same(value: Any, accepted: Any) -> bool:
    """JSON equality, as JSON Schema's enum has it: true is not 1, 1 is 1.0."""
    if isinstance(value, bool) or isinstance(accepted, bool):
        return value is accepted
    if isinstance(value, int | float) and isinstance(accepted, int | float):
        return value == accepted
    return json.dumps(value, sort_keys=True) == json.dumps(accepted, sort_keys=True)


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    """The few JSON Schema keywords the table uses: type (with null), enum, additionalProperties."""
    if "enum" in schema:
        return any(_same(value, option) for option in schema["enum"])
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    python = {"boolean": bool, "object": dict, "string": str}
    if value is None:
        return "null" in kinds
    if not any(isinstance(value, python[kind]) for kind in kinds if kind != "null"):
        return False
    values = schema.get("additionalProperties")
    return not (isinstance(value, dict) and values) or all(_valid(v, values) for v in value.values())


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
