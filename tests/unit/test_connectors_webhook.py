"""The webhook connector: a declarative mapping from arbitrary JSON to a next state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from orl.connectors.environment.outcome_events import PayloadError
from orl.connectors.environment.webhook import WebhookMapping, load_webhook_mappings, resolve_path
from orl.schemas.errors import ConfigError

BODY = {"data": {"session": "s-9", "turn": "s-9/t2", "message": "build failed", "score": -1, "runs": [5, 7]}}
MAPPING = WebhookMapping(
    "ci",
    {
        "session_id": "$.data.session",
        "turn_id": "$.data.turn",
        "content": "$.data.message",
        "reward": "$.data.score",
        "kind": "ci",
    },
)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("$", BODY),
        ("$.data.session", "s-9"),
        ("$.data.runs.1", 7),
        ("$.data.runs[0]", 5),
        ("$.data.runs[-1]", 7),
        ("$.data.runs[9]", None),
        ("$.data.missing.deeper", None),
        ("$.data.session.x", None),
    ],
)
def test_resolve_path(path: str, expected: object) -> None:
    assert resolve_path(BODY, path) == expected


@pytest.mark.parametrize("path", ["data.session", "$data", "$.a[x]"])
def test_malformed_paths_are_configuration_errors(path: str) -> None:
    with pytest.raises(ConfigError):
        resolve_path(BODY, path)


def test_mapping_builds_the_next_state_and_outcome() -> None:
    target = MAPPING.apply(BODY)
    assert (target.session_id, target.turn_id) == ("s-9", "s-9/t2")
    assert target.observation.content == "build failed" and target.observation.role == "environment"
    outcome = target.observation.outcome
    assert outcome is not None and (outcome.kind, outcome.reward) == ("ci", -1.0)


def test_constants_and_structured_content() -> None:
    mapping = WebhookMapping("x", {"session_id": "fixed", "content": "$.data", "role": "user", "thumbs": 1})
    target = mapping.apply({"data": {"b": 1, "a": 2}})
    assert target.session_id == "fixed" and target.turn_id is None
    assert json.loads(target.observation.content) == {"a": 2, "b": 1}
    assert target.observation.outcome is not None and target.observation.outcome.thumbs == 1


def test_no_outcome_fields_means_no_outcome() -> None:
    mapping = WebhookMapping("x", {"session_id": "$.s", "content": "$.c"})
    assert mapping.apply({"s": "a", "c": "hello"}).observation.outcome is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"data": {"message": "m"}}, "session_id"),
        ({"data": {"session": "s"}}, "content"),
        ({"data": {"session": "s", "message": "m", "score": "high"}}, "reward"),
        ({"data": {"session": {"id": 1}, "message": "m"}}, "session_id"),
        ([1, 2, 3], "session_id"),
    ],
)
def test_malformed_payloads_name_the_field_and_its_path(body: object, field: str) -> None:
    with pytest.raises(PayloadError) as caught:
        MAPPING.apply(body)
    assert caught.value.field == field
    assert "webhook 'ci'" in str(caught.value) and "mapped from $." in str(caught.value)


def test_mapping_configuration_is_checked_up_front() -> None:
    with pytest.raises(ConfigError, match="needs content"):
        WebhookMapping("x", {"session_id": "$.s"})
    with pytest.raises(ConfigError, match="unknown fields"):
        WebhookMapping("x", {"session_id": "$.s", "content": "$.c", "score": "$.r"})
    with pytest.raises(ConfigError):
        WebhookMapping("x", {"session_id": "$s", "content": "$.c"})


def test_load_mappings_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "webhooks.json"
    path.write_text(json.dumps({"ci": {"session_id": "$.s", "content": "$.c"}}))
    assert set(load_webhook_mappings(path)) == {"ci"}
    path.write_text(json.dumps({"Bad Name": {"session_id": "$.s", "content": "$.c"}}))
    with pytest.raises(ConfigError, match="webhook name"):
        load_webhook_mappings(path)
    path.write_text("[1]")
    with pytest.raises(ConfigError):
        load_webhook_mappings(path)
    with pytest.raises(ConfigError, match="cannot read"):
        load_webhook_mappings(tmp_path / "missing.json")
