"""The webhook connector: maps arbitrary JSON from another system to a next state, declaratively.

A mapping names, for each next-state field, where to find it in the incoming JSON:

    {"session_id": "$.data.session", "turn_id": "$.data.turn", "content": "$.data.message",
     "reward": "$.data.score", "role": "environment"}

A value starting with "$" is a path (`$` is the whole body, `.key` steps into an object, `.0` or
`[0]` into an array); any other value is a constant. Fields: session_id and content (required),
turn_id, role, reward, thumbs, exit_code, passed, failed, errors, kind (the outcome kind, default
"webhook"). A path that finds nothing gives None; a required field that is None, or a value of the
wrong type, raises `PayloadError` naming the field and the path. Reads and writes no topics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orl.connectors.environment.api import ROLES, Observation, Outcome
from orl.connectors.environment.outcome_events import (
    PayloadError,
    content_value,
    count_value,
    finite_number,
    thumbs_value,
)
from orl.schemas.errors import ConfigError

FIELDS = (
    "session_id",
    "turn_id",
    "content",
    "role",
    "reward",
    "thumbs",
    "exit_code",
    "passed",
    "failed",
    "errors",
    "kind",
)
REQUIRED = ("session_id", "content")
OUTCOME_FIELDS = ("reward", "thumbs", "exit_code", "passed", "failed", "errors")
_STEP = re.compile(r"\.([^.\[\]]+)|\[(-?\d+)\]")
_MISSING = object()


def parse_path(path: str) -> list[str | int]:
    """The steps of a `$.a.b[0]` path; ConfigError when it is malformed."""
    if not path.startswith("$"):
        raise ConfigError(f"path {path!r} must start with '$'")
    rest, steps = path[1:], []
    while rest:
        step = _STEP.match(rest)
        if step is None:
            raise ConfigError(f"path {path!r}: cannot read {rest!r} (use .key, .0 or [0])")
        key, index = step.group(1), step.group(2)
        steps.append(key if key is not None else int(index))
        rest = rest[step.end() :]
    return steps


def resolve_path(body: Any, path: str) -> Any:
    """The value at a `$.a.b[0]` path, or None when any step finds nothing."""
    value = body
    for step in parse_path(path):
        value = _step(value, step)
        if value is _MISSING:
            return None
    return value


def _step(value: Any, key: str | int) -> Any:
    if isinstance(value, dict):
        return value.get(str(key), _MISSING)
    if isinstance(value, list):
        try:
            position = int(key)
        except ValueError:
            return _MISSING
        return value[position] if -len(value) <= position < len(value) else _MISSING
    return _MISSING


@dataclass(frozen=True)
class WebhookTarget:
    """Where a mapped webhook body goes: which turn, and what was observed."""

    session_id: str
    turn_id: str | None
    observation: Observation


@dataclass(frozen=True)
class WebhookMapping:
    name: str
    fields: Mapping[str, Any]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.fields) - set(FIELDS))
        if unknown:
            raise ConfigError(f"webhook {self.name!r}: unknown fields {unknown}; known: {', '.join(FIELDS)}")
        missing = [f for f in REQUIRED if f not in self.fields]
        if missing:
            raise ConfigError(f"webhook {self.name!r}: mapping needs {', '.join(missing)}")
        for value in self.fields.values():
            if isinstance(value, str) and value.startswith("$"):
                parse_path(value)  # a malformed path is a configuration error, found at start-up

    def value(self, body: Any, key: str) -> Any:
        spec = self.fields.get(key)
        if isinstance(spec, str) and spec.startswith("$"):
            return resolve_path(body, spec)
        return spec

    def apply(self, body: Any) -> WebhookTarget:
        """Map one webhook body; `PayloadError` names the field (and its path) that is missing or wrong."""
        try:
            return self._apply(body)
        except PayloadError as error:
            field = error.field or ""
            where = f" (mapped from {self.fields[field]})" if field in self.fields else ""
            raise PayloadError(f"webhook {self.name!r}: {error}{where}", field) from None

    def _apply(self, body: Any) -> WebhookTarget:
        values = {key: self.value(body, key) for key in FIELDS}
        for key in REQUIRED:
            if values[key] is None:
                raise PayloadError(f"'{key}' has no value in the payload", key)
        session_id, turn_id = _id_value(values["session_id"], "session_id"), None
        if values["turn_id"] is not None:
            turn_id = _id_value(values["turn_id"], "turn_id")
        role = values["role"] or "environment"
        if role not in ROLES:
            raise PayloadError(f"'role' must be one of {', '.join(ROLES)}; got {role!r}", "role")
        content = values["content"]
        if not isinstance(content, str):  # a structured value is passed on as JSON text
            content = json.dumps(content, ensure_ascii=False, sort_keys=True)
        return WebhookTarget(
            session_id,
            turn_id,
            Observation(content=content_value(content), role=role, outcome=self._outcome(values)),
        )

    def _outcome(self, values: dict[str, Any]) -> Outcome | None:
        if all(values[key] is None for key in OUTCOME_FIELDS):
            return None
        exit_code = values["exit_code"]
        if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
            raise PayloadError(f"'exit_code' must be an integer; got {exit_code!r}", "exit_code")
        return Outcome(
            kind=str(values["kind"] or "webhook"),
            reward=finite_number(values["reward"], "reward"),
            exit_code=exit_code,
            passed=count_value(values["passed"], "passed"),
            failed=count_value(values["failed"], "failed"),
            errors=count_value(values["errors"], "errors"),
            thumbs=thumbs_value(values["thumbs"]),
            detail={"webhook": self.name},
        )


def _id_value(value: Any, key: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int) or not str(value) or len(str(value)) > 256:
        raise PayloadError(f"'{key}' must be a non-empty string (at most 256 characters); got {value!r}", key)
    return str(value)


def load_webhook_mappings(path: str | Path) -> dict[str, WebhookMapping]:
    """Mappings from a JSON file `{name: {field: "$.path" or constant}}`; ConfigError when malformed."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read webhook mappings from {path}: {error}") from error
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ConfigError(f"{path}: expected an object of {{name: mapping object}}")
    return webhook_mappings(raw)


def webhook_mappings(raw: Mapping[str, Mapping[str, Any]]) -> dict[str, WebhookMapping]:
    for name in raw:
        if not re.fullmatch(r"[a-z0-9_-]{1,64}", name):
            raise ConfigError(f"webhook name {name!r}: use 1-64 lowercase letters, digits, '_' and '-'")
    return {name: WebhookMapping(name, dict(fields)) for name, fields in raw.items()}
