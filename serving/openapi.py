"""The OpenAPI 3.1 document of `orl serve`, served at GET /openapi.json (no key needed).

Describes every route `orl.serving.app.build_app` registers, with request schemas that accept what the
handlers accept: never stricter (a body the schema rejects is one the server answers with a 4xx;
tests/fuzz checks it), looser only where a rule cannot be said in JSON Schema (a tool_choice that
names one of `tools`, a prompt that fits the context window). Reads and writes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orl.connectors.environment.api import ROLES as OBSERVATION_ROLES
from orl.connectors.environment.outcome_events import MAX_CONTENT_CHARS
from orl.rules.top_k import MAX_TOP_K
from orl.serving.chat_fields import CHAT_FIELDS, STREAM_OPTIONS, ChatField
from orl.serving.openai_api import MAX_CHOICES, MAX_STOP_SEQUENCES, ROLES
from orl.serving.responses_api import LOGPROBS_INCLUDE, RESPONSES_FIELDS

if TYPE_CHECKING:
    from orl.serving.app import ServerState

JSON = "application/json"
Schema = dict[str, Any]


def openapi_document(state: ServerState) -> dict[str, Any]:
    """The document for this server: /metrics is keyed only when a metrics key is set, /admin/* only
    exist when admin routes are registered."""
    settings = state.settings
    paths: dict[str, Any] = {
        "/openapi.json": {"get": _get("This document.", {"type": "object"})},
        "/healthz": {"get": _get("Liveness.", _object({"status": {"const": "ok"}}))},
        "/readyz": {"get": _readyz()},
        "/metrics": {"get": _metrics(keyed=bool(settings.metrics_key))},
        "/v1/models": {"get": _get("The served model.", _models(), security="apiKey")},
        "/v1/chat/completions": {"post": _chat(settings.max_tokens_limit)},
        "/v1/responses": {"post": _responses_api(settings.max_tokens_limit)},
        "/v1/sessions/{session_id}/end": {"post": _end_session()},
        "/v1/orl/score": {"post": _score(len(state.template.tokenizer))},
        "/v1/feedback": {"post": _ingest("A user's verdict or correction.", _feedback())},
        "/v1/rewards": {"post": _ingest("An explicit reward.", _reward())},
        "/v1/observations": {"post": _ingest("What a connector observed.", _observation())},
        "/v1/webhooks/{name}": {"post": _webhook()},
        "/v1/sessions/start": {"post": _start_session()},
    }
    if state.admin_routes:
        paths.update(_admin_paths())
    return {
        "openapi": "3.1.0",
        "info": {"title": "orl serve", "version": "0.1.0"},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "One of --api-keys."},
                "adminKey": {"type": "http", "scheme": "bearer", "description": "--admin-key."},
                "internalKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "--internal-key (orl's pipeline and gate; the chat routes take it too).",
                },
                "metricsKey": {"type": "http", "scheme": "bearer", "description": "--metrics-key."},
            },
            "schemas": {"Error": _ERROR},
        },
    }


_ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

_ERROR_TEXT = {
    400: "Invalid request (the error's param names the field).",
    401: "Missing or wrong bearer key.",
    403: "The key is valid but not one this route takes (the error's code says why).",
    404: "No such route or webhook.",
    405: "Method not allowed.",
    408: "The request body did not arrive in time.",
    409: "Conflict (see the error message).",
    413: "The request body is too large.",
    500: "The policy backend failed, or an unexpected server error.",
    503: "The spool or the model backend cannot take the request now; retry after Retry-After seconds.",
}


def _object(properties: dict[str, Schema], required: list[str] | None = None) -> Schema:
    return {"type": "object", "properties": properties, "required": required or list(properties)}


def _nullable(schema: Schema) -> Schema:
    """`schema` or null: the handlers treat an explicit null like an absent field."""
    return {"anyOf": [schema, {"type": "null"}]}


def _json(schema: Schema) -> dict[str, Any]:
    return {"content": {JSON: {"schema": schema}}}


def _responses(ok: dict[int, tuple[str, Schema]], errors: tuple[int, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {
        str(code): {"description": text, **_json(schema)} for code, (text, schema) in ok.items()
    }
    for code in errors:
        out[str(code)] = {"description": _ERROR_TEXT[code], **_json({"$ref": "#/components/schemas/Error"})}
    return out


def _operation(
    summary: str,
    responses: dict[str, Any],
    *,
    security: str | None = None,
    body: Schema | None = None,
    body_required: bool = True,
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if security:
        op["security"] = [{security: []}]
    if body is not None:
        op["requestBody"] = {"required": body_required, **_json(body)}
    if parameters:
        op["parameters"] = parameters
    return op


def _get(summary: str, schema: Schema, security: str | None = None) -> dict[str, Any]:
    errors = (401,) if security else ()
    return _operation(summary, _responses({200: ("OK", schema)}, errors), security=security)


def _readyz() -> dict[str, Any]:
    schema = _object({"ready": {"type": "boolean"}, "policy_version": {"type": "integer"}})
    return _operation("Readiness.", _responses({200: ("Ready.", schema), 503: ("Starting.", schema)}, ()))


def _metrics(*, keyed: bool) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "200": {
            "description": "Prometheus exposition.",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    }
    if keyed:
        responses.update(_responses({}, (401,)))
    return _operation("Metrics.", responses, security="metricsKey" if keyed else None)


def _models() -> Schema:
    model = _object(
        {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "policy_version": {"type": "integer"},
        }
    )
    return _object({"object": {"const": "list"}, "data": {"type": "array", "items": model}})


def _messages(roles: tuple[str, ...] = ROLES) -> Schema:
    text_part = _object({"type": {"const": "text"}, "text": {"type": "string"}})
    tool_call = _object({"function": _object({"name": {"type": "string"}})})
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"enum": list(roles)},
            # null only for an assistant message with tool_calls (not expressible here: looser)
            "content": {
                "anyOf": [{"type": "string"}, {"type": "array", "items": text_part}, {"type": "null"}]
            },
            "tool_call_id": {"type": "string"},
            "tool_calls": _nullable({"type": "array", "items": tool_call}),
        },
    }
    return {"type": "array", "minItems": 1, "items": message}


def _tools() -> Schema:
    function = _object({"name": {"type": "string"}}) | {
        "properties": {"name": {"type": "string"}, "strict": _nullable({"type": "boolean"})}
    }  # strict: true only where a call must be made (serving/openai_api.py _call_constraint)
    tool = _object({"type": {"const": "function"}, "function": function})
    return _nullable({"type": "array", "items": tool})


def _number(low: float, high: float, *, above_low: bool = False) -> Schema:
    lower = {"exclusiveMinimum": low} if above_low else {"minimum": low}
    return _nullable({"type": "number", **lower, "maximum": high})


def chat_request_schema(max_tokens_limit: int) -> Schema:
    max_tokens = _nullable({"type": "integer", "minimum": 1, "maximum": max_tokens_limit})
    stop = {"type": "string", "minLength": 1}
    tool_choice = {
        "anyOf": [
            {"enum": ["none", "auto", "required", None]},
            _object({"function": _object({"name": {"type": "string"}})}),
        ]
    }
    honoured = {
        "model": _nullable({"type": "string"}),
        "messages": _messages(),
        "tools": _tools(),
        "tool_choice": tool_choice,
        "stream": _nullable({"type": "boolean"}),
        "stream_options": _nullable(
            {
                "type": "object",
                "properties": {option: _nullable({"type": "boolean"}) for option in STREAM_OPTIONS},
                "additionalProperties": False,
            }
        ),
        "temperature": _number(0.0, 2.0),
        "top_p": _number(0.0, 1.0, above_low=True),
        "max_tokens": max_tokens,
        "max_completion_tokens": max_tokens,
        "stop": _nullable(
            {"anyOf": [stop, {"type": "array", "maxItems": MAX_STOP_SEQUENCES, "items": stop}]}
        ),
        "seed": _nullable({"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}),
        "n": _nullable({"type": "integer", "minimum": 1, "maximum": MAX_CHOICES}),
        "session_id": _nullable({"type": "string"}),
        "user": _nullable({"type": "string"}),
        "prompt_cache_key": _nullable({"type": "string"}),
        "logprobs": _nullable({"type": "boolean"}),
        "parallel_tool_calls": _nullable({"type": "boolean"}),
        "response_format": _nullable(
            {
                "anyOf": [
                    _object({"type": {"enum": ["text", "json_object"]}}),
                    _object(
                        {
                            "type": {"const": "json_schema"},
                            "json_schema": _object({"name": {"type": "string"}}, ["name"])
                            | {"properties": {"name": {"type": "string"}, "schema": {"type": "object"}}},
                        }
                    ),
                ]
            }
        ),
    }
    return _fields_schema(CHAT_FIELDS, honoured, required=["messages"])  # serving/chat_fields.py


_API_ERRORS = (400, 401, 408, 413)


def _chat(max_tokens_limit: int) -> dict[str, Any]:
    completion = {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {"object": {"const": "chat.completion"}, "choices": {"type": "array", "minItems": 1}},
    }
    responses = _responses({200: ("The completion.", completion)}, (*_API_ERRORS, 500, 503))
    # stream: true; each event's data is a chat.completion.chunk, the last one [DONE]
    event = {"type": "object", "required": ["data"], "properties": {"data": {"type": "string"}}}
    responses["200"]["content"]["text/event-stream"] = {"schema": event}
    headers = [
        _header("X-Session-Id", {"type": "string"}),
        _header("X-Session-Done", {"type": "string"}),
        # a rollout group: sessions attempting the same task, normalised together by the pipeline
        _header("X-Group-Id", {"type": "string", "maxLength": 200}),
        _header("X-Group-Size", {"type": "string", "pattern": "^[0-9]{1,4}$"}),
        # main or side in any case; empty means the server's default
        _header("X-Turn-Type", {"type": "string", "pattern": "^([Mm][Aa][Ii][Nn]|[Ss][Ii][Dd][Ee])?$"}),
    ]
    return _operation(
        "OpenAI chat completion; the turn is recorded.",
        responses,
        security="apiKey",
        body=chat_request_schema(max_tokens_limit),
        parameters=headers,
    )


def responses_request_schema(max_tokens_limit: int) -> Schema:
    """The Responses API's request body: every field of serving/responses_api.py's table, no other."""
    text = {"type": "string"}
    honoured = {
        "model": _nullable(text),
        "input": {"anyOf": [text, {"type": "array", "minItems": 1, "items": {"type": "object"}}]},
        "instructions": _nullable(text),
        "previous_response_id": _nullable(text),
        "store": _nullable({"type": "boolean"}),
        "tools": _nullable(
            {
                "type": "array",
                "items": _object({"type": {"const": "function"}, "name": text})
                | {
                    "properties": {
                        "type": {"const": "function"},
                        "name": text,
                        "strict": _nullable({"type": "boolean"}),
                    }
                },
            }
        ),
        "tool_choice": {
            "anyOf": [
                {"enum": ["none", "auto", "required", None]},
                _object({"type": {"const": "function"}, "name": text}),
            ]
        },
        "stream": _nullable({"type": "boolean"}),
        "parallel_tool_calls": _nullable({"type": "boolean"}),
        "temperature": _number(0.0, 2.0),
        "top_p": _number(0.0, 1.0, above_low=True),
        "max_output_tokens": _nullable({"type": "integer", "minimum": 1, "maximum": max_tokens_limit}),
        "text": _nullable(
            {
                "type": "object",
                "properties": {
                    "format": _nullable(
                        _object({"type": {"enum": ["text", "json_object", "json_schema"]}})
                        | {"additionalProperties": True}
                    ),
                    "verbosity": {"enum": ["medium", None]},
                },
                "additionalProperties": False,
            }
        ),
        "include": _nullable({"type": "array", "items": {"const": LOGPROBS_INCLUDE}}),
        "user": _nullable(text),
        "prompt_cache_key": _nullable(text),
    }
    return _fields_schema(RESPONSES_FIELDS, honoured, required=["input"])


def _fields_schema(fields: tuple[ChatField, ...], honoured: dict[str, Schema], required: list[str]) -> Schema:
    """A request body of a field table: each field's schema, described with what orl does with it."""
    properties = {}
    for field in fields:
        if field.treatment == "honoured":
            schema = honoured[field.name]
        elif field.treatment == "limited":
            schema = {"enum": list(field.accepted)}
        else:
            schema = dict(field.schema or {})
        properties[field.name] = {**schema, "description": f"{field.treatment}: {field.effect}"}
    return {"type": "object", "required": required, "properties": properties, "additionalProperties": False}


def _responses_api(max_tokens_limit: int) -> dict[str, Any]:
    response = {
        "type": "object",
        "required": ["id", "object", "created_at", "status", "model", "output"],
        "properties": {"object": {"const": "response"}, "output": {"type": "array"}},
    }
    responses = _responses({200: ("The response.", response)}, (*_API_ERRORS, 404, 500, 503))
    # stream: true; each event is named by its type (response.created ... response.completed)
    text = {"type": "string"}
    event = {"type": "object", "required": ["data"], "properties": {"event": text, "data": text}}
    responses["200"]["content"]["text/event-stream"] = {"schema": event}
    headers = [
        _header("X-Session-Id", {"type": "string"}),
        _header("X-Session-Done", {"type": "string"}),
        _header("X-Turn-Type", {"type": "string", "pattern": "^([Mm][Aa][Ii][Nn]|[Ss][Ii][Dd][Ee])?$"}),
    ]
    return _operation(
        "OpenAI Responses API on the chat turn; recorded as one. 404: previous_response_id is not a response "
        "this key stored.",
        responses,
        security="apiKey",
        body=responses_request_schema(max_tokens_limit),
        parameters=headers,
    )


def _header(name: str, schema: Schema) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}


def _score(vocab_size: int) -> dict[str, Any]:
    body = {
        "type": "object",
        "required": ["messages", "response_token_ids"],
        "properties": {
            "messages": _messages(),
            "tools": _tools(),
            "response_token_ids": {
                "type": "array",
                "minItems": 1,
                "items": {"type": "integer", "minimum": 0, "maximum": vocab_size - 1},
            },
            "temperature": _number(0.0, 2.0, above_low=True),
            "use_base": {"type": "boolean"},
            "top_k": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_K},
            "n": {"const": 1},
        },
    }
    scores = {
        "type": "object",
        "required": ["prompt_token_ids", "policy_version", "logprobs"],
        "properties": {
            "prompt_token_ids": {"type": "array", "items": {"type": "integer"}},
            "policy_version": {"type": "integer"},
            "logprobs": {"type": "array", "items": {"type": "number"}},
        },
    }
    return _operation(
        "Teacher logprobs of response tokens after a prompt (the pipeline's scorer).",
        _responses({200: ("The logprobs.", scores)}, (*_API_ERRORS, 403, 500, 503)),
        security="internalKey",
        body=body,
    )


def _end_session() -> dict[str, Any]:
    closed = _object(
        {"session_id": {"type": "string"}, "closed": {"const": True}, "was_open": {"type": "boolean"}}
    )
    return _operation(
        "Close a session (records SessionClosed).",
        _responses({200: ("Closed.", closed)}, (401, 503)),
        security="apiKey",
        parameters=[_path_param("session_id")],
    )


def _id(max_chars: int = 256) -> Schema:
    return {"type": "string", "minLength": 1, "maxLength": max_chars}


def _target() -> dict[str, Schema]:
    return {"session_id": _id(), "turn_id": _nullable(_id())}


def _content() -> Schema:
    # also not blank; Python's idea of whitespace differs from ECMA regex's, so that rule is left out
    return {"type": "string", "minLength": 1, "maxLength": MAX_CONTENT_CHARS}


def _feedback() -> Schema:
    # one of thumbs and text is required (not expressible as simply: looser)
    return {
        "type": "object",
        "required": ["session_id"],
        "properties": {**_target(), "thumbs": _nullable({"enum": [1, -1]}), "text": _nullable(_content())},
    }


def _reward() -> Schema:
    return {
        "type": "object",
        "required": ["session_id", "reward"],
        "properties": {**_target(), "reward": {"type": "number"}, "detail": _nullable({"type": "object"})},
    }


def _observation() -> Schema:
    count = _nullable({"type": "integer", "minimum": 0, "maximum": 2**31 - 1})
    outcome = {
        "type": "object",
        "required": ["kind"],
        "additionalProperties": False,
        "properties": {
            "kind": _id(64),
            "reward": _nullable({"type": "number"}),
            "exit_code": _nullable({"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1}),
            "passed": count,
            "failed": count,
            "errors": count,
            "thumbs": _nullable({"enum": [1, -1]}),
            "detail": _nullable({"type": "object"}),
        },
    }
    return {
        "type": "object",
        "required": ["session_id", "source", "content"],
        "properties": {
            **_target(),
            "source": {"type": "string", "pattern": "^[A-Za-z0-9_.:/-]{1,64}$"},
            "role": {"enum": list(OBSERVATION_ROLES)},
            "content": _content(),
            "outcome": _nullable(outcome),
            "messages": _nullable({"type": "array", "items": {"type": "object"}}),
        },
    }


_RECORDED = _object(
    {
        "event_id": {"type": "string"},
        "session_id": {"type": "string"},
        "turn_id": {"type": "string"},
        "source": {"type": "string"},
    }
)


def _ingest(summary: str, body: Schema) -> dict[str, Any]:
    """Without turn_id the session's last main turn is the target: 409 when there is none."""
    return _operation(
        summary + " Recorded as NextStateObserved.",
        _responses({202: ("Recorded.", _RECORDED)}, (*_API_ERRORS, 409, 503)),
        security="apiKey",
        body=body,
    )


def _webhook() -> dict[str, Any]:
    return _operation(
        "Any JSON object, mapped by the named webhook mapping (--webhooks-file).",
        _responses({202: ("Recorded.", _RECORDED)}, (*_API_ERRORS, 404, 409, 503)),
        security="apiKey",
        body={"type": "object"},
        parameters=[_path_param("name")],
    )


def _start_session() -> dict[str, Any]:
    started = _object(
        {
            "session_id": {"type": "string"},
            "task_id": {"type": ["string", "null"]},
            "headers": _object({"X-Session-Id": {"type": "string"}}),
        }
    )
    return _operation(
        "A fresh session id (send it as X-Session-Id).",
        _responses({200: ("Started.", started)}, _API_ERRORS),
        security="apiKey",
        body={"type": "object", "properties": {"task_id": _nullable(_id())}},
        body_required=False,
    )


def _admin_paths() -> dict[str, Any]:
    status = _object(
        {
            "run_id": {"type": "string"},
            "policy_version": {"type": "integer"},
            "pinned": {"type": ["integer", "null"]},
            "served_versions": {"type": "array", "items": {"type": "integer"}},
        }
    )
    policy = {**status, "required": [*status["required"], "tenant_runs"]}
    policy["properties"] = {
        **status["properties"],
        "tenant_runs": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}},
    }
    pinned = {**status, "required": [*status["required"], "activated"]}
    pinned["properties"] = {**status["properties"], "activated": {"type": "boolean"}}
    admin = (401,)
    run = {"type": "string", "description": "A tenant's own run (--tenant-adapters); default: the main run."}
    pin_body = _object({"version": {"type": "integer", "minimum": 1}, "run": run}, required=["version"])
    run_body = {"type": "object", "properties": {"run": run}}
    return {
        "/admin/policy": {
            "get": _get("Which policy is served, and each tenant run's version.", policy, security="adminKey")
        },
        "/admin/pin": {
            "post": _operation(
                "Serve exactly this checkpoint version and stop following newer ones.",
                _responses(
                    {200: ("Pinned.", pinned), 409: ("Refused: not activated.", pinned)}, (400, 401, 408, 413)
                ),
                security="adminKey",
                body=pin_body,
            )
        },
        "/admin/unpin": {
            "post": _operation(
                "Follow new checkpoints again.",
                _responses({200: ("Unpinned.", status)}, (400, *admin)),
                security="adminKey",
                body=run_body,
                body_required=False,
            )
        },
        "/admin/rollback": {
            "post": _operation(
                "Pin the previously served checkpoint.",
                _responses({200: ("Rolled back.", status)}, (400, *admin)),
                security="adminKey",
                body=run_body,
                body_required=False,
            )
        },
    }
