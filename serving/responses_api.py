"""OpenAI's Responses API (POST /v1/responses) on orl's chat turn: the request becomes the chat request
orl serves and records, the reply becomes a Response object or its stream of typed events.

Pure functions and one pure class (`ResponseEvents`); reads and writes nothing. `RESPONSES_FIELDS`
is the field audit, as `CHAT_FIELDS` is for chat completions (serving/chat_fields.py): every request
field is honoured, taken as given, or refused by name.

A request is read in two steps: `parse_responses_request` checks the fields and turns `input` into
chat messages; `ResponsesRequest.chat_request` puts the stored conversation of `previous_response_id`
(found by the server, `EventSpool.stored_conversation`) before them and `instructions` first (as
OpenAI has it, the instructions of a previous response are not carried over), and parses the result
as a chat-completions body, with every check that path makes. The turn is then served, linked to a
session and recorded exactly as a chat turn is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from orl.serving.chat_fields import FIELDS_BY_NAME as CHAT_FIELDS_BY_NAME
from orl.serving.chat_fields import ChatField, FieldRefused, as_given, check_fields, honoured, limited
from orl.serving.openai_api import ApiError, ChatRequest, bad_request, bool_field, parse_chat_body
from orl.serving.tool_calls import ReplyDelta

LOGPROBS_INCLUDE = "message.output_text.logprobs"

# Fields both APIs have, taken the same way: their entries of the chat table.
_SAME_AS_CHAT = {
    name: CHAT_FIELDS_BY_NAME[name]
    for name in (
        "model", "tool_choice", "temperature", "top_p", "user", "top_logprobs", "parallel_tool_calls",
        "service_tier", "safety_identifier", "prompt_cache_retention",
    )
}  # fmt: skip

RESPONSES_FIELDS: tuple[ChatField, ...] = (
    _SAME_AS_CHAT["model"],
    honoured(
        "input",
        "a string, or items: messages (text parts), function_call and function_call_output; rendered with "
        "the chat template",
    ),
    honoured("instructions", "a system message before the input; not carried over to a next response"),
    honoured(
        "previous_response_id",
        "continues a response this server stored for the same API key: its input and output come first, "
        "and the turn joins its session",
    ),
    honoured(
        "store", "false: the response is not kept for previous_response_id (the turn is still recorded)"
    ),
    honoured(
        "tools",
        "function tools, rendered with the chat template; calls are parsed from the output; strict: true "
        "only where tool_choice makes a call (named or required), whose arguments are then held to its schema",
    ),
    _SAME_AS_CHAT["tool_choice"],
    _SAME_AS_CHAT["parallel_tool_calls"],
    honoured("stream", "typed server-sent events, from response.created to response.completed"),
    _SAME_AS_CHAT["temperature"],
    _SAME_AS_CHAT["top_p"],
    honoured("max_output_tokens", "the output's token limit; reaching it makes the response incomplete"),
    honoured(
        "text",
        "format text, json_object or json_schema, enforced by constrained decoding (llguidance); "
        "verbosity medium only",
    ),
    honoured(
        "include",
        f"{LOGPROBS_INCLUDE} only: each sampled token's logprob, exactly as recorded, in the output text",
    ),
    _SAME_AS_CHAT["user"],
    honoured("prompt_cache_key", "links the turn to a session"),
    _SAME_AS_CHAT["top_logprobs"],
    limited("max_tool_calls", "absent only: orl does not cap the calls of one reply"),
    limited("truncation", "disabled only: a prompt longer than the context window is a 400", "disabled"),
    limited("reasoning", "absent only: the served model has no reasoning control"),
    limited("background", "false only: every response is answered on its request", False),
    limited("conversation", "absent only: no conversations API; continue with previous_response_id"),
    limited("prompt", "absent only: no stored prompt templates"),
    limited("background_options", "absent only: no background execution"),
    limited("context_management", "absent only: orl does not compact a conversation; it must fit the window"),
    limited("access_programs", "absent only: orl has no access programs"),
    limited("image", "absent only: the served model writes no images"),
    limited("moderation", "absent only: orl runs no moderation"),
    limited("prompt_cache_options", "absent only: orl's prefix cache has no breakpoints to set"),
    _SAME_AS_CHAT["service_tier"],
    as_given(
        "stream_options",
        "include_obfuscation has no effect (no padding)",
        {"type": ["object", "null"], "additionalProperties": {"type": ["boolean", "null"]}},
    ),
    as_given(
        "metadata",
        "labels for OpenAI's dashboard: echoed in the response, not recorded",
        {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
    ),
    _SAME_AS_CHAT["safety_identifier"],
    _SAME_AS_CHAT["prompt_cache_retention"],
)

RESPONSES_FIELDS_BY_NAME = {f.name: f for f in RESPONSES_FIELDS}
_INPUT_TEXT_PARTS = ("input_text", "output_text")
_TOOL_FIELD = re.compile(r"(tools\[\d+\])\.function\.")
# chat-path parameter names as the Responses API calls them, for errors raised by the chat parser
_PARAM_NAMES = {
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",  # the conversation: the previous responses' messages, then the input's
}


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked Responses body: its input as chat messages, and what the chat request is built from."""

    input_messages: list[dict[str, Any]]
    instructions: str | None
    previous_response_id: str | None
    store: bool
    echo: dict[str, Any]  # the request's settings as the Response object repeats them
    chat_fields: dict[str, Any]  # the chat-completions body, less messages

    def chat_request(self, previous: list[dict[str, Any]], *, max_tokens_limit: int) -> ChatRequest:
        """The chat request of this turn after the `previous` conversation; a bad value is a 400 named
        as the Responses API names it."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        body = {**self.chat_fields, "messages": [*system, *previous, *self.input_messages]}
        try:
            return parse_chat_body(body, max_tokens_limit=max_tokens_limit)
        except ApiError as error:
            param, message = error.param or "", error.message
            for chat_name, name in _PARAM_NAMES.items():
                param = name + param.removeprefix(chat_name) if param.startswith(chat_name) else param
                message = message.replace(chat_name, name)
            # a chat tool's fields sit under `function`, a Responses tool's at its top
            param, message = _TOOL_FIELD.sub(r"\1.", param), _TOOL_FIELD.sub(r"\1.", message)
            raise ApiError(error.status, message, param=param or None, code=error.code) from None


def parse_responses_request(body: dict[str, Any]) -> ResponsesRequest:
    """A Responses body (a JSON object), every field checked against `RESPONSES_FIELDS`."""
    try:
        check_fields(body, RESPONSES_FIELDS_BY_NAME, "Responses")
    except FieldRefused as refused:
        raise bad_request(refused.message, param=refused.name, code=refused.code) from None
    instructions = _optional_text(body, "instructions")
    previous = _optional_text(body, "previous_response_id")
    store = bool_field(body, "store", True)
    tools = _tools(body.get("tools"))
    chat: dict[str, Any] = {
        name: body[name]
        for name in (
            "model",
            "stream",
            "stream_options",
            "temperature",
            "top_p",
            "user",
            "prompt_cache_key",
            "parallel_tool_calls",
        )
        if body.get(name) is not None
    }
    chat.update(
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice")),
        max_completion_tokens=body.get("max_output_tokens"),
        response_format=_response_format(body.get("text")),
        logprobs=_include(body.get("include")) or None,
    )
    echo = {
        "instructions": instructions,
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": bool_field(body, "parallel_tool_calls", True),
        "previous_response_id": previous,
        "prompt_cache_key": body.get("prompt_cache_key"),
        "store": store,
        "temperature": body.get("temperature", 1.0),
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "top_logprobs": 0,
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "user": body.get("user"),
    }
    return ResponsesRequest(
        input_messages=input_messages(body.get("input")),
        instructions=instructions,
        previous_response_id=previous,
        store=store,
        echo=echo,
        chat_fields={k: v for k, v in chat.items() if v is not None},
    )


def input_messages(value: Any) -> list[dict[str, Any]]:
    """`input` as chat messages: a string is one user message; items become messages, a run of
    function_call items one assistant message with tool_calls, a function_call_output a tool message.
    A reasoning item (a thinking model's earlier output, sent back) is the `reasoning_content` of the
    assistant output that follows it; the chat template decides whether the model sees it."""
    if value is None:
        raise bad_request("'input' is required", param="input", code="missing_required_parameter")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise bad_request("'input' must be a string or a non-empty array of items", param="input")
    messages: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item's text, until the assistant output it precedes
    for index, item in enumerate(value):
        param = f"input[{index}]"
        if not isinstance(item, dict):
            raise bad_request(f"{param} must be an object", param=param, code="invalid_type")
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = _reasoning_text(param, item)
            continue
        thought, reasoning = reasoning, None
        if kind == "message":
            message = _message(param, item)
            if thought is not None and message["role"] == "assistant":
                message["reasoning_content"] = thought
            messages.append(message)
        elif kind == "function_call":
            call = {
                "id": _text(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _text(item, "name", param),
                    "arguments": _text(item, "arguments", param),
                },
            }
            last = messages[-1] if messages else None
            if thought is not None:  # a new reply: its reasoning, then its calls
                messages.append(
                    {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": thought}
                )
            elif last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            content = _parts_text(f"{param}.output", output) if isinstance(output, list) else output
            if not isinstance(content, str):
                raise bad_request(f"{param}.output must be a string", param=f"{param}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _text(item, "call_id", param), "content": content}
            )
        else:
            raise bad_request(
                f"{param}.type {kind!r} is not supported: orl takes message, function_call, "
                "function_call_output and reasoning items (text only; no stored item references)",
                param=f"{param}.type",
                code="unsupported_parameter",
            )
    return messages


def _reasoning_text(param: str, item: dict[str, Any]) -> str:
    """A reasoning item's text: its reasoning_text parts (else its summary_text parts), joined."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise bad_request(
            f"{param}.content must be an array of reasoning_text parts", param=f"{param}.content"
        )
    texts = []
    for index, part in enumerate(parts):
        if not (isinstance(part, dict) and isinstance(part.get("text"), str)):
            raise bad_request(
                f"{param}.content[{index}] must be a reasoning_text or summary_text part with 'text'",
                param=f"{param}.content[{index}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _message(param: str, item: dict[str, Any]) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise bad_request(
            f"{param}.role must be user, system, developer or assistant; got {role!r}", param=f"{param}.role"
        )
    content = item.get("content")
    if isinstance(content, list):
        content = _parts_text(f"{param}.content", content)
    if not isinstance(content, str):
        raise bad_request(
            f"{param}.content must be a string or an array of text parts", param=f"{param}.content"
        )
    return {"role": role, "content": content}


def _parts_text(param: str, parts: list[Any]) -> str:
    """The text of input_text / output_text parts, joined; any other part is a 400 naming it."""
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _INPUT_TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(
                f"{param}[{index}] must be a text part (input_text or output_text with 'text'); got "
                f"{kind!r}: the served model reads text only",
                param=f"{param}[{index}]",
                code="unsupported_parameter",
            )
        texts.append(part["text"])
    return "".join(texts)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    """Responses function tools (flat: type, name, parameters) as chat tools (nested under function)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request("'tools' must be an array", param="tools", code="invalid_type")
    tools = []
    for index, tool in enumerate(value):
        param = f"tools[{index}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise bad_request(
                f"{param}.type {kind!r} is not supported: orl serves function tools only (no hosted tools)",
                param=f"{param}.type",
                code="unsupported_parameter",
            )
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        tools.append({"type": "function", "function": function})  # strict: checked by the chat parser
    return tools or None


def _tool_choice(value: Any) -> str | dict[str, Any] | None:
    if value is None or isinstance(value, str):
        return value  # checked by the chat parser (none, auto, required)
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return {"type": "function", "function": {"name": value["name"]}}
    raise bad_request(
        "tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}",
        param="tool_choice",
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    """`text.format` as chat's response_format (json_schema's name and schema move under json_schema)."""
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise bad_request("'text' takes 'format' and 'verbosity' only", param="text")
    if text.get("verbosity") not in (None, "medium"):
        raise bad_request(
            "text.verbosity other than medium is not supported: the served model has no verbosity control",
            param="text.verbosity",
            code="unsupported_parameter",
        )
    form = text.get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise bad_request("text.format must be an object", param="text.format", code="invalid_type")
    if form.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {"name": form.get("name"), "schema": form.get("schema")},
        }
    return {"type": form.get("type")}


def _include(value: Any) -> bool:
    """Whether `include` asks for the output text's logprobs (the only inclusion orl has)."""
    if value is None:
        return False
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request("'include' must be an array of strings", param="include", code="invalid_type")
    other = sorted(set(value) - {LOGPROBS_INCLUDE})
    if other:
        raise bad_request(
            f"include {other[0]!r} is not supported: orl includes {LOGPROBS_INCLUDE} only",
            param="include",
            code="unsupported_parameter",
        )
    return bool(value)


def _optional_text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", param=name, code="invalid_type")
    return value or None


def _text(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise bad_request(f"{param}.{name} must be a string", param=f"{param}.{name}")
    return value


# The reply as a Response object


def output_items(
    response_id: str, message: dict[str, Any], logprobs: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """The output of a reply (a chat assistant message): a reasoning item when it has reasoning, a
    message item when it has text or no calls, then one function_call item per tool call."""
    items = []
    if message.get("reasoning_content"):  # an empty block is no item
        items.append(reasoning_item(response_id, message["reasoning_content"], "completed"))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append(message_item(response_id, message.get("content") or "", logprobs, "completed"))
    items.extend(function_call_item(call, "completed") for call in calls)
    return items


def message_item(
    response_id: str, text: str, logprobs: list[dict[str, Any]] | None, status: str
) -> dict[str, Any]:
    content = [output_text_part(text, logprobs)] if status == "completed" else []
    return {
        "type": "message",
        "id": "msg_" + response_id.removeprefix("resp_"),
        "status": status,
        "role": "assistant",
        "content": content,
    }


def reasoning_item(response_id: str, text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {
        "type": "reasoning",
        "id": "rs_" + response_id.removeprefix("resp_"),
        "summary": [],
        "content": content,
        "status": status,
    }


def output_text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def function_call_item(call: dict[str, Any], status: str) -> dict[str, Any]:
    function = call["function"]
    return {
        "type": "function_call",
        "id": "fc_" + call["id"].removeprefix("call_"),
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function.get("arguments", "") if status == "completed" else "",
        "status": status,
    }


def response_object(
    request: ResponsesRequest,
    response_id: str,
    created_at: int,
    model: str,
    *,
    output: list[dict[str, Any]],
    finish_reason: str | None,
    usage: dict[str, int] | None,
) -> dict[str, Any]:
    """A Response: in progress (`finish_reason` None), completed, or incomplete at max_output_tokens."""
    status = "in_progress" if finish_reason is None else "completed"
    incomplete = None
    if finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": None,
        "incomplete_details": incomplete,
        "model": model,
        "output": output,
        "usage": _usage(usage) if usage else None,
        "background": False,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        **request.echo,
    }


def _usage(chat: dict[str, Any]) -> dict[str, Any]:
    return {
        "input_tokens": chat["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": chat["completion_tokens"],
        "output_tokens_details": chat["completion_tokens_details"],
        "total_tokens": chat["total_tokens"],
    }


def stored_messages(request: ResponsesRequest, message: dict[str, Any]) -> str:
    """What a stored response adds to its conversation: its input and its reply, as chat messages."""
    return json.dumps([*request.input_messages, message], ensure_ascii=False)


# The reply as a stream of events


class ResponseEvents:
    """The typed events of a streamed Response, from the reply's deltas (what `orl.serving.tool_calls`
    lets a stream show): the message item opens at its first text, each call at its first delta; all
    close at the end, and response.completed (or .incomplete) carries the Response with its output in
    the order the items opened."""

    def __init__(self, in_progress: dict[str, Any]) -> None:
        self._response = in_progress
        self._sequence = 0
        self._items: list[dict[str, Any]] = []  # in the order they opened
        self._text: list[str] = []
        self._message: dict[str, Any] | None = None
        self._reasoning: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # a call delta's index: its item

    def start(self) -> list[dict[str, Any]]:
        return [
            self._event("response.created", response=self._response),
            self._event("response.in_progress", response=self._response),
        ]

    def feed(self, delta: ReplyDelta) -> list[dict[str, Any]]:
        events = []
        if delta.reasoning:
            if self._reasoning is None:
                self._reasoning = reasoning_item(self._response["id"], "", "in_progress")
                events.append(self._added(self._reasoning))
            events.append(
                self._event(
                    "response.reasoning_text.delta",
                    item_id=self._reasoning["id"],
                    output_index=self._items.index(self._reasoning),
                    content_index=0,
                    delta=delta.reasoning,
                )
            )
        if delta.content:
            if self._message is None:
                events.extend(self._open_message())
            self._text.append(delta.content)
            events.append(self._text_event("response.output_text.delta", delta=delta.content, logprobs=[]))
        for call in delta.tool_calls:
            item = self._calls.get(call["index"])
            if item is None:
                item = self._calls[call["index"]] = function_call_item(call, "in_progress")
                events.append(self._added(item))
            arguments = call.get("function", {}).get("arguments", "")
            if arguments:
                item["arguments"] += arguments
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self._items.index(item),
                        delta=arguments,
                    )
                )
        return events

    def finish(self, final: dict[str, Any]) -> list[dict[str, Any]]:
        """The closing events; `final` is the Response built from the recorded reply (`response_object`)."""
        by_id = {item["id"]: item for item in final["output"]}
        events = []
        if self._message is None and self._message_id() in by_id:  # an empty reply: an empty message
            events.extend(self._open_message())
        for index, item in enumerate(self._items):
            done = by_id[item["id"]]
            if done["type"] == "reasoning":
                events.append(
                    self._event(
                        "response.reasoning_text.done",
                        item_id=done["id"],
                        output_index=index,
                        content_index=0,
                        text=done["content"][0]["text"],
                    )
                )
            elif done["type"] == "message":
                part = done["content"][0]
                events.append(
                    self._text_event(
                        "response.output_text.done", text=part["text"], logprobs=part["logprobs"]
                    )
                )
                events.append(self._text_event("response.content_part.done", part=part))
            else:
                events.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=done["id"],
                        output_index=index,
                        name=done["name"],
                        arguments=done["arguments"],
                    )
                )
            events.append(self._event("response.output_item.done", output_index=index, item=done))
        final = {**final, "output": [by_id[item["id"]] for item in self._items]}
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        events.append(self._event(kind, response=final))
        return events

    def streamed(self) -> tuple[str, list[dict[str, Any]]]:
        """The text and the calls' (name, arguments) shown so far, to check against the recorded reply."""
        calls = [{"name": c["name"], "arguments": c["arguments"]} for c in self._calls.values()]
        return "".join(self._text), calls

    def _message_id(self) -> str:
        return "msg_" + self._response["id"].removeprefix("resp_")

    def _open_message(self) -> list[dict[str, Any]]:
        self._message = message_item(self._response["id"], "", None, "in_progress")
        return [
            self._added(self._message),
            self._text_event("response.content_part.added", part=output_text_part("", None)),
        ]

    def _added(self, item: dict[str, Any]) -> dict[str, Any]:
        self._items.append(item)
        return self._event("response.output_item.added", output_index=len(self._items) - 1, item=dict(item))

    def _text_event(self, kind: str, **fields: Any) -> dict[str, Any]:
        assert self._message is not None
        index = self._items.index(self._message)
        return self._event(kind, item_id=self._message["id"], output_index=index, content_index=0, **fields)

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event


def error_event(body: dict[str, Any]) -> dict[str, Any]:
    """A stream's failure after its 200 as the Responses API's `error` event (from OpenAI's error body)."""
    error = body["error"]
    return {"type": "error", "code": error["code"], "message": error["message"], "param": error["param"]}
