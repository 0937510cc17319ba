"""Observations as events and as JSON: NextStateObserved building and payload validation.

`outcome_event` builds the NextStateObserved of an observation (deterministic id from session,
turn, connector and a hash of what was observed, so a retried report is a detectable duplicate).
`observation_from_json` / `outcome_from_json` validate the JSON an HTTP client or a webhook sends
and raise `PayloadError` naming the offending field. Reads and writes no topics: the caller puts
the event on `next_states` (the server through its recorder).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from orl.connectors.environment.api import ROLES, Observation, Outcome
from orl.schemas.errors import OrlError
from orl.schemas.event_constructors import next_state_observed
from orl.schemas.event_types import NextStateObserved
from orl.schemas.events import EventOrigin

MAX_CONTENT_CHARS = 100_000
RESERVED_SOURCES = ("conversation", "session_end")  # written by the pipeline's turn linker only
_SOURCE = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")


class PayloadError(OrlError):
    """A connector payload is malformed; `field` names the part that is wrong."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def observation_digest(observation: Observation) -> str:
    """A hash of everything observed: equal observations of a turn get equal event ids."""
    canonical = json.dumps(
        {
            "role": observation.role,
            "content": observation.content,
            "outcome": observation.outcome.record() if observation.outcome else None,
            "messages": observation.messages,
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def outcome_event(
    observation: Observation,
    *,
    session_id: str,
    turn_id: str,
    source: str,
    namespace: str,
    producer: str,
    occurred_at_ms: int,
) -> NextStateObserved:
    """The NextStateObserved event for `observation` following turn `turn_id`, from connector `source`."""
    origin = EventOrigin(
        namespace=namespace,
        producer=producer,
        occurred_at_ms=occurred_at_ms,
        id_parts=(session_id, turn_id, source, observation_digest(observation)),
        session_id=session_id,
        turn_id=turn_id,
    )
    return next_state_observed(
        origin,
        source=source,
        role=observation.role,
        content=observation.content,
        messages_json=None
        if observation.messages is None
        else json.dumps(list(observation.messages), ensure_ascii=False, sort_keys=True),
        outcome=observation.outcome.record() if observation.outcome else None,
    )


def check_source(source: Any) -> str:
    if not isinstance(source, str) or not _SOURCE.fullmatch(source):
        raise PayloadError("'source' must be 1-64 characters of letters, digits and _ . : / -", "source")
    if source in RESERVED_SOURCES:
        raise PayloadError(f"source {source!r} is reserved for the pipeline's turn linker", "source")
    return source


def optional_str(body: dict[str, Any], key: str, max_chars: int = 256) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise PayloadError(f"'{key}' must be a non-empty string of at most {max_chars} characters", key)
    return value


def required_str(body: dict[str, Any], key: str, max_chars: int = 256) -> str:
    value = optional_str(body, key, max_chars)
    if value is None:
        raise PayloadError(f"'{key}' is required", key)
    return value


def finite_number(value: Any, key: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PayloadError(f"'{key}' must be a finite number; got {value!r}", key)
    return float(value)


def thumbs_value(value: Any, key: str = "thumbs") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or value not in (1, -1):
        raise PayloadError(f"'{key}' must be 1 (up) or -1 (down); got {value!r}", key)
    return int(value)


def count_value(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        raise PayloadError(f"'{key}' must be a non-negative integer; got {value!r}", key)
    return value


def outcome_from_json(value: Any, field: str = "outcome") -> Outcome | None:
    """An `Outcome` from `{kind, reward?, exit_code?, passed?, failed?, errors?, thumbs?, detail?}`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PayloadError(f"'{field}' must be an object", field)
    unknown = sorted(
        set(value) - {"kind", "reward", "exit_code", "passed", "failed", "errors", "thumbs", "detail"}
    )
    if unknown:
        raise PayloadError(f"'{field}' has unknown keys: {', '.join(unknown)}", field)
    kind = required_str(value, "kind", 64)
    exit_code = value.get("exit_code")
    if exit_code is not None and (
        isinstance(exit_code, bool) or not isinstance(exit_code, int) or not -(2**31) <= exit_code < 2**31
    ):
        raise PayloadError(f"'{field}.exit_code' must be an integer; got {exit_code!r}", f"{field}.exit_code")
    detail = value.get("detail")
    if detail is not None and not isinstance(detail, dict):
        raise PayloadError(f"'{field}.detail' must be an object", f"{field}.detail")
    return Outcome(
        kind=kind,
        reward=finite_number(value.get("reward"), f"{field}.reward"),
        exit_code=exit_code,
        passed=count_value(value.get("passed"), f"{field}.passed"),
        failed=count_value(value.get("failed"), f"{field}.failed"),
        errors=count_value(value.get("errors"), f"{field}.errors"),
        thumbs=thumbs_value(value.get("thumbs"), f"{field}.thumbs"),
        detail=detail,
    )


def content_value(value: Any, key: str = "content") -> str:
    if not isinstance(value, str) or not value.strip():
        raise PayloadError(f"'{key}' must be a non-empty string", key)
    if len(value) > MAX_CONTENT_CHARS:
        raise PayloadError(f"'{key}' exceeds {MAX_CONTENT_CHARS} characters", key)
    return value


def observation_from_json(body: dict[str, Any]) -> Observation:
    """An `Observation` from `{role?, content, outcome?, messages?}` (what `observation_to_json` writes)."""
    role = body.get("role", "environment")
    if role not in ROLES:
        raise PayloadError(f"'role' must be one of {', '.join(ROLES)}; got {role!r}", "role")
    messages = body.get("messages")
    if messages is not None and (
        not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages)
    ):
        raise PayloadError("'messages' must be an array of message objects", "messages")
    return Observation(
        content=content_value(body.get("content")),
        role=role,
        outcome=outcome_from_json(body.get("outcome")),
        messages=None if messages is None else tuple(messages),
    )


def observation_to_json(observation: Observation) -> dict[str, Any]:
    """The JSON body of an observation, as POST /v1/observations accepts it (plus session, turn, source)."""
    body: dict[str, Any] = {"role": observation.role, "content": observation.content}
    if observation.outcome is not None:
        outcome = observation.outcome
        fields = {
            "kind": outcome.kind,
            "reward": outcome.reward,
            "exit_code": outcome.exit_code,
            "passed": outcome.passed,
            "failed": outcome.failed,
            "errors": outcome.errors,
            "thumbs": outcome.thumbs,
            "detail": dict(outcome.detail) if outcome.detail is not None else None,
        }
        body["outcome"] = {k: v for k, v in fields.items() if v is not None}
    if observation.messages is not None:
        body["messages"] = list(observation.messages)
    return body
