"""OpenAI chat-completions wire format: validate request bodies, build responses, chunks and errors.

Pure functions. Every rejection is an `ApiError` carrying the HTTP status and OpenAI's error shape
(`{"error": {"message", "type", "param", "code"}}`), so bad input always gets a 4xx that says what
is wrong and never reaches the model.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from orl.rules.top_k import MAX_TOP_K
from orl.schemas.errors import OrlError
from orl.schemas.json_depth import JsonTooDeep, loads_within_depth
from orl.serving.chat_fields import STREAM_OPTIONS, FieldRefused, check_fields

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 8  # n: the most choices of one request


class ApiError(OrlError):
    """A request rejected with an HTTP status and OpenAI's error shape (`error_body` renders it)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any] | None
    stream: bool
    include_usage: bool
    temperature: float
    top_p: float
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    session_id: str | None
    user: str | None
    prompt_cache_key: str | None  # a session hint: stock OpenClaw sends `<sessionId>:0`
    logprobs: bool = False  # return each sampled token's logprob (the recorded one)
    # response_format json_object / json_schema, or a tool call's schema (a forced strict tool's
    # parameters, tool_choice required's call object) as a json_schema response_format; canonical JSON
    constraint: str | None = None
    n: int = 1  # choices: each one turn of a session of its own, the n sessions one rollout group
    parallel_tool_calls: bool = True  # false: at most one tool call (the reply stops after it)

    def forced_tool(self) -> str | None:
        """The function whose call is forced: the one tool_choice names, or the only tool offered
        when tool_choice is required."""
        return _forced_name(self.tools, self.tool_choice)

    def required_call(self) -> bool:
        """Whether the reply must be a call of one of several tools (tool_choice required): the
        prompt ends with `<tool_call>` and constrained decoding holds the call object that follows
        (`REQUIRED_CALL_PREFIX`, the constraint)."""
        return self.tool_choice == "required" and self.forced_tool() is None

    def constrained_call(self) -> bool:
        """Whether the forced call's arguments are held to its strict tool's parameters schema (the
        constraint): the prompt then leaves the whole arguments object to the model."""
        return self.forced_tool() is not None and self.constraint is not None

    def may_call_tools(self) -> bool:
        """Whether the reply is parsed for tool calls: tools offered, not turned off, and no JSON
        output asked for (a constrained reply is the JSON content)."""
        return bool(self.tools) and self.tool_choice != "none" and self.constraint is None


def parse_chat_request(raw: bytes, *, max_tokens_limit: int) -> ChatRequest:
    """A chat-completions body, every field checked against serving/chat_fields.py's table."""
    return parse_chat_body(json_object(raw), max_tokens_limit=max_tokens_limit)


def parse_chat_body(body: dict[str, Any], *, max_tokens_limit: int) -> ChatRequest:
    """A chat-completions body already read as a JSON object (the Responses API builds one too)."""
    try:
        check_fields(body)
    except FieldRefused as refused:
        raise bad_request(refused.message, param=refused.name, code=refused.code) from None
    messages = _messages(body.get("messages"))
    tools = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    response_constraint = _constraint(body.get("response_format"))
    if response_constraint and (isinstance(tool_choice, dict) or tool_choice == "required"):
        raise bad_request(
            "response_format json and a forced tool call cannot both hold the reply", param="response_format"
        )
    req = ChatRequest(
        model=_optional_str(body, "model") or "",
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        stream=bool_field(body, "stream", False),
        include_usage=_include_usage(body.get("stream_options")),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_top_p(body),
        max_tokens=_max_tokens(body, max_tokens_limit),
        stop=_stop(body.get("stop")),
        seed=_seed(body.get("seed")),
        session_id=_optional_str(body, "session_id"),
        user=_optional_str(body, "user"),
        prompt_cache_key=_optional_str(body, "prompt_cache_key"),
        logprobs=_logprobs(body),
        constraint=response_constraint or _call_constraint(tools, tool_choice),
        n=_choices(body),
        parallel_tool_calls=bool_field(body, "parallel_tool_calls", True),
    )
    if req.n > 1 and req.stream:
        raise bad_request(
            "n > 1 with stream: true is not built yet: ask for the choices unstreamed", param="n"
        )
    if req.n > 1 and (req.session_id or req.user or req.prompt_cache_key):
        raise bad_request(
            "n > 1 opens a session of its own for each choice: send no session_id, user or prompt_cache_key",
            param="n",
        )
    return req


def _choices(body: dict[str, Any]) -> int:
    value = body.get("n")
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request("'n' must be an integer", param="n", code="invalid_type")
    if not 1 <= value <= MAX_CHOICES:
        raise bad_request(f"'n' must be between 1 and {MAX_CHOICES}; got {value}", param="n")
    return value


@dataclass(frozen=True)
class ScoreRequest:
    """POST /v1/orl/score: logprobs of `response_token_ids` after the rendered `messages`, and with
    `top_k` > 0 each position's `top_k` most likely ids and their logprobs (top-K distillation)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    response_token_ids: list[int]
    temperature: float
    use_base: bool
    top_k: int  # 0: no top-K logprobs


@dataclass(frozen=True)
class RolloutGroup:
    """Sessions that attempt the same task (`X-Group-Id`, `X-Group-Size`): the pipeline can normalise
    their rewards together (pipeline/processors/group_advantage.py)."""

    group_id: str
    size: int | None


MAX_GROUP_SIZE = 1024


MAX_ID_CHARS = 256  # a client-chosen id (session, user, prompt cache key, X-Session-Id): longer is a 400


def session_header(value: str | None) -> str | None:
    """The X-Session-Id header, or None; one over MAX_ID_CHARS is a 400."""
    if value is not None and len(value) > MAX_ID_CHARS:
        raise bad_request(f"X-Session-Id is longer than {MAX_ID_CHARS} characters", param="X-Session-Id")
    return value


def parse_rollout_group(group_id: str | None, size: str | None) -> RolloutGroup | None:
    """The request's rollout group from its headers, or None; a malformed header is a 400."""
    if group_id is None or not group_id.strip():
        if size is not None:
            raise bad_request("X-Group-Size needs X-Group-Id", param="X-Group-Size")
        return None
    if len(group_id) > 200:
        raise bad_request("X-Group-Id is longer than 200 characters", param="X-Group-Id")
    if size is None:
        return RolloutGroup(group_id.strip(), None)
    try:
        count = int(size)
    except ValueError:
        raise bad_request(
            f"X-Group-Size must be an integer, not {size[:40]!r}", param="X-Group-Size"
        ) from None
    if not 1 <= count <= MAX_GROUP_SIZE:
        raise bad_request(f"X-Group-Size must be in [1, {MAX_GROUP_SIZE}], not {count}", param="X-Group-Size")
    return RolloutGroup(group_id.strip(), count)


def parse_score_request(raw: bytes, *, vocab_size: int) -> ScoreRequest:
    body = _json_object(raw)
    ids = body.get("response_token_ids")
    if not isinstance(ids, list) or not ids or not all(type(i) is int for i in ids):
        raise bad_request(
            "'response_token_ids' must be a non-empty array of integers", param="response_token_ids"
        )
    outside = [i for i in ids if not 0 <= i < vocab_size]
    if outside:
        raise bad_request(
            f"'response_token_ids' has ids outside the vocabulary [0, {vocab_size}): {outside[:5]}",
            param="response_token_ids",
        )
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    if temperature == 0:
        raise bad_request("'temperature' must be above 0 to score logprobs", param="temperature")
    return ScoreRequest(
        messages=_messages(body.get("messages")),
        tools=_tools(body.get("tools")),
        response_token_ids=ids,
        temperature=temperature,
        use_base=bool_field(body, "use_base", False),
        top_k=_top_k(body),
    )


def _top_k(body: dict[str, Any]) -> int:
    value = body.get("top_k", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request("'top_k' must be an integer", param="top_k", code="invalid_type")
    if not 0 <= value <= MAX_TOP_K:
        raise bad_request(f"'top_k' must be between 0 and {MAX_TOP_K}; got {value}", param="top_k")
    return value


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object: every route that reads a body reads it here, so every kind of
    bad JSON (not UTF-8, not JSON, nested deeper than MAX_JSON_DEPTH, not an object, not encodable) is
    a 400 that says which."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise bad_request(
            f"request body is not valid UTF-8 (byte {error.start})", code="invalid_encoding"
        ) from error
    try:
        body = loads_within_depth(text)
    except JsonTooDeep as error:
        raise too_deep(error, "request body") from error
    except json.JSONDecodeError as error:
        raise bad_request(
            f"request body is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}",
            code="invalid_json",
        ) from error
    except ValueError as error:  # an integer literal longer than Python converts (4300 digits)
        raise bad_request(
            "request body has an integer of more than 4300 digits", code="invalid_value"
        ) from error
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", code="invalid_type")
    check_encodable(body)
    return body


def too_deep(error: JsonTooDeep, what: str, param: str | None = None) -> ApiError:
    return bad_request(
        f"{what} is nested deeper than {error.limit} levels of arrays and objects (the limit)",
        param=param,
        code="json_too_deep",
    )


def _json_object(raw: bytes) -> dict[str, Any]:
    """A score body: a JSON object, with OpenAI's `n` (only 1 is supported)."""
    body = json_object(raw)
    n = body.get("n", 1)
    if isinstance(n, bool) or n != 1:
        raise bad_request("only n=1 is supported", param="n")
    return body


def check_encodable(value: Any) -> None:
    """A 400 for a string holding a lone UTF-16 surrogate (JSON's "\\ud800"): valid JSON, but no
    UTF-8 text, so the tokenizer, the spool and the event codec could not take it."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise bad_request(
            "request body has a string with a lone UTF-16 surrogate (\\ud800-\\udfff), which is not text",
            code="invalid_encoding",
        ) from error


def _messages(value: Any) -> list[dict[str, Any]]:
    if value is None:
        raise bad_request("'messages' is required", param="messages", code="missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    for index, message in enumerate(value):
        _check_message(index, message)
    return value


def _check_message(index: int, message: Any) -> None:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad_request(f"{param} must be an object", param=param, code="invalid_type")
    role = message.get("role")
    if role not in ROLES:
        raise bad_request(
            f"{param}.role must be one of {', '.join(ROLES)}; got {role!r}", param=f"{param}.role"
        )
    content = message.get("content")
    if content is None:
        if not (role == "assistant" and message.get("tool_calls")):
            raise bad_request(f"{param}.content is required for role {role!r}", param=f"{param}.content")
    elif isinstance(content, list):
        for part_index, part in enumerate(content):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise bad_request(
                    f"{param}.content[{part_index}] must be a text part {{'type':'text','text':...}}",
                    param=f"{param}.content[{part_index}]",
                )
    elif not isinstance(content, str):
        raise bad_request(
            f"{param}.content must be a string or an array of text parts",
            param=f"{param}.content",
            code="invalid_type",
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise bad_request(f"{param}.tool_call_id is required for role 'tool'", param=f"{param}.tool_call_id")
    if message.get("tool_calls") is not None:
        _check_tool_calls(param, message["tool_calls"])


def _check_tool_calls(param: str, calls: Any) -> None:
    if not isinstance(calls, list):
        raise bad_request(
            f"{param}.tool_calls must be an array", param=f"{param}.tool_calls", code="invalid_type"
        )
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad_request(
                f"{param}.tool_calls[{i}].function.name is required",
                param=f"{param}.tool_calls[{i}].function",
            )
        _check_arguments_depth(f"{param}.tool_calls[{i}].function.arguments", function.get("arguments"))


def _check_arguments_depth(param: str, arguments: Any) -> None:
    """Arguments are a JSON text inside the body: the body's depth limit holds inside it too."""
    if not isinstance(arguments, str):
        return  # an object is part of the body, whose depth is already checked
    try:
        loads_within_depth(arguments)
    except JsonTooDeep as error:
        raise too_deep(error, param, param=param) from error
    except ValueError:
        return  # arguments that are not JSON are kept as sent (OpenAI allows them)


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request("'tools' must be an array", param="tools", code="invalid_type")
    for i, tool in enumerate(value):
        ok = (
            isinstance(tool, dict)
            and tool.get("type") == "function"
            and isinstance(tool.get("function"), dict)
        )
        if not ok or not isinstance(tool["function"].get("name"), str):
            raise bad_request(
                f"tools[{i}] must be {{'type':'function','function':{{'name':...}}}}", param=f"tools[{i}]"
            )
        strict = tool["function"].get("strict")
        if strict is not None and strict is not True and strict is not False:  # 0 is no boolean in JSON
            raise bad_request(
                f"tools[{i}].function.strict must be a boolean",
                param=f"tools[{i}].function.strict",
                code="invalid_type",
            )
    return value or None


def _forced_name(tools: list[dict[str, Any]] | None, tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict):
        return str(tool_choice["function"]["name"])
    if tool_choice == "required" and tools and len(tools) == 1:
        return str(tools[0]["function"]["name"])
    return None


def _call_constraint(tools: list[dict[str, Any]] | None, tool_choice: Any) -> str | None:
    """The constraint that holds a reply's tool call, enforced by constrained decoding: a forced
    strict tool's parameters schema; for tool_choice required among several tools, a call object
    that names one of them (its arguments held to a strict tool's parameters, any object for the
    others). A strict tool whose call is not held (tool_choice auto) is a 400: orl holds a call's
    arguments to a schema only where a call must be made."""
    if tool_choice == "none" or not tools:
        return None  # no call: nothing to constrain
    forced = _forced_name(tools, tool_choice)
    required = tool_choice == "required" and forced is None
    constraint, calls = None, []
    for i, tool in enumerate(tools):
        function = tool["function"]
        strict = function.get("strict") is True
        parameters = function.get("parameters") or {"type": "object"}
        if strict and not required and function["name"] != forced:
            raise bad_request(
                f"tools[{i}].function.strict=true is honoured only for a call that must be made: orl holds "
                "a call's arguments to the schema by constrained decoding once tool_choice names the "
                "function or is required; do so, or send strict: false (the arguments are then parsed as "
                "the model wrote them)",
                param=f"tools[{i}].function.strict",
                code="unsupported_parameter",
            )
        if strict:
            constraint = _tool_constraint(i, function["name"], parameters)  # a schema llguidance takes
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": function["name"]},
                    "arguments": parameters if strict else {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if required:
        return _tool_constraint(None, "tool_call", {"anyOf": calls})
    return constraint


def _tool_constraint(index: int | None, name: str, schema: dict[str, Any]) -> str | None:
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}
    try:
        return _constraint(response_format)
    except ApiError as error:
        raise bad_request(
            error.message,
            param="tools" if index is None else f"tools[{index}].function.parameters",
            code=error.code or "invalid_json_schema",
        ) from None


def _tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any] | None:
    if value is None or value in ("none", "auto"):
        return value
    if value == "required" and tools:
        return value
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        name = value["function"].get("name")
        if tools and any(t["function"]["name"] == name for t in tools):
            return value
        raise bad_request(
            f"tool_choice names function {name!r}, which is not in 'tools'", param="tool_choice"
        )
    raise bad_request(
        "tool_choice must be 'none', 'auto', 'required' (with tools) or a named function", param="tool_choice"
    )


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number", param=name, code="invalid_type")
    if not low <= value <= high:
        raise bad_request(f"'{name}' must be between {low} and {high}; got {value}", param=name)
    return float(value)


def _top_p(body: dict[str, Any]) -> float:
    value = _number(body, "top_p", 1.0, 0.0, 1.0)
    if value == 0.0:
        raise bad_request("'top_p' must be greater than 0", param="top_p")
    return value


def _max_tokens(body: dict[str, Any], limit: int) -> int | None:
    """max_completion_tokens (OpenAI's newer name) wins over max_tokens; both must be valid."""
    given = _token_limit(body, "max_tokens", limit)
    return _token_limit(body, "max_completion_tokens", limit) or given


def _token_limit(body: dict[str, Any], name: str, limit: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer", param=name, code="invalid_type")
    if not 1 <= value <= limit:
        raise bad_request(f"'{name}' must be between 1 and {limit}; got {value}", param=name)
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("'stop' must be a non-empty string or an array of them", param="stop")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise bad_request(f"'stop' takes at most {MAX_STOP_SEQUENCES} sequences", param="stop")
    return tuple(stops)


def _seed(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request("'seed' must be an integer", param="seed", code="invalid_type")
    if not -(2**63) <= value < 2**63:  # recorded as a 64-bit integer
        raise bad_request("'seed' must fit in a signed 64-bit integer", param="seed")
    return value


def _logprobs(body: dict[str, Any]) -> bool:
    """`logprobs`; `top_logprobs` only as 0 (or null): orl returns the sampled tokens' logprobs, the
    numbers it records, not the K most likely alternatives."""
    wanted = body.get("logprobs") is not None and bool_field(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is None:
        return wanted
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= 20:
        raise bad_request("'top_logprobs' must be an integer in [0, 20]", param="top_logprobs")
    if top > 0:
        raise bad_request(
            "top_logprobs > 0 is not supported: orl returns the logprob of each sampled token "
            "(logprobs: true, top_logprobs: 0), the number it records for training",
            param="top_logprobs",
            code="unsupported_parameter",
        )
    if not wanted:
        raise bad_request("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    return wanted


def _constraint(value: Any) -> str | None:
    """response_format: None for text; for json_object and json_schema its canonical JSON, once
    llguidance has compiled its schema (one it cannot enforce is a 400, never free text)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        constraint: dict[str, Any] = {"type": "json_object"}
    elif kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise bad_request(
                "response_format.json_schema needs a 'name'", param="response_format.json_schema"
            )
        schema = spec.get("schema")
        if schema is not None and not isinstance(schema, dict):
            raise bad_request(
                "response_format.json_schema.schema must be an object",
                param="response_format.json_schema.schema",
            )
        constraint = {"type": "json_schema", "json_schema": {"name": spec["name"], "schema": schema or {}}}
    else:
        raise bad_request(
            "response_format.type must be 'text', 'json_object' or 'json_schema'",
            param="response_format.type",
        )
    text = json.dumps(constraint, sort_keys=True, separators=(",", ":"))
    from orl.serving.policy.output_constraint import ConstraintError, grammar_of  # llguidance: JSON only

    try:
        grammar_of(text)
    except ConstraintError as error:
        raise bad_request(str(error), param="response_format", code="invalid_json_schema") from None
    return text


def bool_field(body: dict[str, Any], name: str, default: bool) -> bool:
    """A boolean field; null is the default, as absent is (clients send nulls for unset fields)."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean", param=name, code="invalid_type")
    return value


def _include_usage(options: Any) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict):
        raise bad_request("'stream_options' must be an object", param="stream_options", code="invalid_type")
    unknown = sorted(set(options) - set(STREAM_OPTIONS))
    if unknown:
        raise bad_request(
            f"stream_options.{unknown[0]} is not a stream option orl knows ({', '.join(STREAM_OPTIONS)})",
            param=f"stream_options.{unknown[0]}",
            code="unknown_parameter",
        )
    for name in STREAM_OPTIONS:  # include_obfuscation is checked, then has no effect: orl pads nothing
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise bad_request(
                f"'stream_options.{name}' must be a boolean",
                param=f"stream_options.{name}",
                code="invalid_type",
            )
    return bool(options.get("include_usage"))


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"'{name}' must be a string", param=name, code="invalid_type")
    if len(value) > MAX_ID_CHARS:
        raise bad_request(
            f"'{name}' is longer than {MAX_ID_CHARS} characters", param=name, code="invalid_value"
        )
    return value or None
