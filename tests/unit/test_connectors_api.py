"""The connector API: observations, outcome events, discovery and isolation of plugin code."""

from __future__ import annotations

import json
import threading
import time

import pytest
from orl.connectors.environment.api import (
    ERROR_KIND,
    Connector,
    Observation,
    Outcome,
    TurnContext,
    discover_connectors,
    load_connector,
    run_connector,
)
from orl.connectors.environment.outcome_events import (
    PayloadError,
    check_source,
    observation_from_json,
    observation_to_json,
    outcome_event,
    outcome_from_json,
)
from orl.schemas.codec import decode, encode
from orl.schemas.errors import ConfigError

CONTEXT = TurnContext(session_id="s-1", turn_id="s-1/t0", response_text="four")


def event_for(observation: Observation, source: str = "tests") -> dict:
    return outcome_event(
        observation,
        session_id="s-1",
        turn_id="s-1/t0",
        source=source,
        namespace="live",
        producer="test/1",
        occurred_at_ms=1_700_000_000_000,
    )


def test_outcome_event_is_a_valid_next_state_with_the_outcome() -> None:
    observation = Observation(
        content="2 passed",
        role="tool",
        outcome=Outcome(kind="tests", reward=1.0, passed=2, failed=0, errors=0, detail={"k": [1]}),
    )
    event = event_for(observation)
    decoded = decode(encode(event))
    assert decoded["envelope"]["event_type"] == "NextStateObserved"
    assert (decoded["envelope"]["session_id"], decoded["envelope"]["turn_id"]) == ("s-1", "s-1/t0")
    assert decoded["source"] == "tests" and decoded["role"] == "tool" and decoded["content"] == "2 passed"
    assert decoded["outcome"]["kind"] == "tests" and decoded["outcome"]["passed"] == 2
    assert json.loads(decoded["outcome"]["detail_json"]) == {"k": [1]}


def test_event_id_is_deterministic_and_depends_on_what_was_observed() -> None:
    a = Observation(content="ok", outcome=Outcome(kind="reward", reward=1.0))
    same = Observation(content="ok", outcome=Outcome(kind="reward", reward=1.0))
    other = Observation(content="ok", outcome=Outcome(kind="reward", reward=-1.0))
    assert event_for(a)["envelope"]["event_id"] == event_for(same)["envelope"]["event_id"]
    assert event_for(a)["envelope"]["event_id"] != event_for(other)["envelope"]["event_id"]
    assert event_for(a)["envelope"]["event_id"] != event_for(a, "other")["envelope"]["event_id"]


def test_observation_json_round_trip() -> None:
    observation = Observation(
        content="exit 1",
        role="tool",
        outcome=Outcome(kind="shell", exit_code=1, detail={"stderr_tail": "boom"}),
        messages=({"role": "tool", "content": "exit 1"},),
    )
    assert observation_from_json(observation_to_json(observation)) == observation


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"content": ""}, "content"),
        ({"content": 3}, "content"),
        ({"content": "x", "role": "assistant"}, "role"),
        ({"content": "x", "outcome": "good"}, "outcome"),
        ({"content": "x", "outcome": {"reward": 1}}, "kind"),
        ({"content": "x", "outcome": {"kind": "r", "reward": float("nan")}}, "outcome.reward"),
        ({"content": "x", "outcome": {"kind": "r", "reward": True}}, "outcome.reward"),
        ({"content": "x", "outcome": {"kind": "r", "thumbs": 2}}, "outcome.thumbs"),
        ({"content": "x", "outcome": {"kind": "r", "passed": -1}}, "outcome.passed"),
        ({"content": "x", "outcome": {"kind": "r", "exit_code": "0"}}, "outcome.exit_code"),
        ({"content": "x", "outcome": {"kind": "r", "score": 1}}, "outcome"),
        ({"content": "x", "messages": "hi"}, "messages"),
    ],
)
def test_malformed_observations_name_the_field(body: dict, field: str) -> None:
    with pytest.raises(PayloadError) as caught:
        observation_from_json(body)
    assert caught.value.field == field


def test_outcome_from_json_accepts_none_and_full_records() -> None:
    assert outcome_from_json(None) is None
    outcome = outcome_from_json({"kind": "tests", "passed": 3, "failed": 1, "reward": 0.5})
    assert outcome == Outcome(kind="tests", passed=3, failed=1, reward=0.5)


def test_sources_of_the_turn_linker_are_reserved() -> None:
    assert check_source("my-env") == "my-env"
    for bad in ("conversation", "session_end", "", "a b", None, "x" * 65):
        with pytest.raises(PayloadError):
            check_source(bad)


def test_observation_rejects_an_unknown_role() -> None:
    with pytest.raises(ValueError, match="role"):
        Observation(content="x", role="assistant")


def test_built_in_connectors_are_discovered_and_loaded() -> None:
    found = discover_connectors()
    assert {"shell", "pytest"} <= set(found)
    assert isinstance(load_connector("shell"), Connector)
    with pytest.raises(ConfigError, match="known: .*pytest"):
        load_connector("no-such-connector")


class Raising:
    name = "raising"

    def observe(self, context: TurnContext) -> Observation | None:
        raise RuntimeError("the environment is gone")


class Hanging:
    name = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()

    def observe(self, context: TurnContext) -> Observation | None:
        self.release.wait(30)
        return Observation(content="too late")


class WrongType:
    name = "wrong"

    def observe(self, context: TurnContext) -> Observation | None:
        return "a string"  # type: ignore[return-value]


class Quiet:
    name = "quiet"

    def observe(self, context: TurnContext) -> Observation | None:
        return None


def test_a_raising_connector_becomes_an_error_observation() -> None:
    observation = run_connector(Raising(), CONTEXT, timeout_s=5)
    assert observation is not None and observation.failed
    assert observation.outcome is not None and observation.outcome.kind == ERROR_KIND
    assert "RuntimeError: the environment is gone" in observation.content
    event_for(observation)  # an error observation is still a valid event


def test_a_hanging_connector_is_abandoned_after_its_timeout() -> None:
    hanging = Hanging()
    started = time.monotonic()
    observation = run_connector(hanging, CONTEXT, timeout_s=0.3)
    assert time.monotonic() - started < 5
    assert observation is not None and observation.failed
    assert observation.outcome is not None and observation.outcome.detail is not None
    assert observation.outcome.detail["timed_out"] is True
    hanging.release.set()


def test_a_connector_returning_the_wrong_type_is_an_error() -> None:
    observation = run_connector(WrongType(), CONTEXT, timeout_s=5)
    assert observation is not None and observation.failed and "not Observation" in observation.content


def test_a_connector_may_observe_nothing() -> None:
    assert run_connector(Quiet(), CONTEXT, timeout_s=5) is None
