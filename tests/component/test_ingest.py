"""The ingest routes on the real app: feedback, rewards, observations, webhooks, sessions.

Runs `orl.serving.app.build_app` with a real recorder and spool (no model: the ingest routes never
touch the policy) and reads the spooled NextStateObserved events back through the codec.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from orl.connectors.environment.api import Observation, Outcome
from orl.connectors.environment.outcome_events import observation_to_json
from orl.connectors.environment.webhook import webhook_mappings
from orl.connectors.metrics import Metrics
from orl.schemas.codec import decode
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.ingest import ingest_routes
from orl.serving.session_tracker import SessionTracker
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool
from starlette.applications import Starlette
from starlette.testclient import TestClient

KEY = "ingest-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEBHOOKS = {"ci": {"session_id": "$.build.session", "content": "$.build.log", "reward": "$.build.score"}}


class Server:
    def __init__(self, tmp_path: Path) -> None:
        self.spool = EventSpool(tmp_path / "spool.db")
        recorder = EventRecorder(self.spool, "live", clock_ms=lambda: 1_700_000_000_000)
        self.tracker = SessionTracker()
        self.state = ServerState(
            settings=ServeSettings(api_keys=(KEY,), admin_key="admin", max_body_bytes=10_000),
            backend=None,  # type: ignore[arg-type]  # the ingest routes never call the policy
            template=None,  # type: ignore[arg-type]
            recorder=recorder,
            metrics=Metrics(),
            tracker=self.tracker,
        )
        # The app as `orl serve` builds it, with test webhook mappings in front (first match wins).
        routes = [*ingest_routes(self.state, webhook_mappings(WEBHOOKS)), *build_app(self.state).routes]
        self.client = TestClient(Starlette(routes=routes))

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.client.post(path, content=content, headers=AUTH if headers is None else headers)

    def next_states(self) -> list[dict[str, Any]]:
        return [decode(e.value) for e in self.spool.oldest(1000) if e.topic == "live.next_states"]

    def main_turn(self, session_id: str) -> str:
        return self.tracker.assign([{"role": "user", "content": "hi"}], header_session=session_id).turn_id


@pytest.fixture
def server(tmp_path: Path) -> Server:
    return Server(tmp_path)


def test_thumbs_and_correction_become_a_user_next_state(server: Server) -> None:
    turn = server.main_turn("s1")
    reply = server.post(
        "/v1/feedback", {"session_id": "s1", "turn_id": turn, "thumbs": -1, "text": "Use km."}
    )
    assert reply.status_code == 202, reply.text
    [event] = server.next_states()
    assert event["envelope"]["event_id"] == reply.json()["event_id"]
    assert (event["envelope"]["session_id"], event["envelope"]["turn_id"]) == ("s1", turn)
    assert (event["source"], event["role"], event["content"]) == ("feedback", "user", "Use km.")
    assert event["outcome"]["kind"] == "thumbs" and event["outcome"]["thumbs"] == -1


def test_feedback_defaults_to_the_sessions_last_main_turn(server: Server) -> None:
    server.main_turn("s1")
    last = server.main_turn("s1")
    server.tracker.assign([{"role": "user", "content": "side"}], header_session="s1", main=False)
    reply = server.post("/v1/feedback", {"session_id": "s1", "thumbs": 1})
    assert reply.status_code == 202 and reply.json()["turn_id"] == last
    [event] = server.next_states()
    assert event["content"] == "(the user gave a thumbs up)" and event["outcome"]["thumbs"] == 1


def test_text_only_feedback_carries_no_outcome(server: Server) -> None:
    turn = server.main_turn("s1")
    assert server.post("/v1/feedback", {"session_id": "s1", "text": "That is wrong."}).status_code == 202
    [event] = server.next_states()
    assert event["envelope"]["turn_id"] == turn and event["outcome"] is None


def test_reward_becomes_an_outcome_of_kind_reward(server: Server) -> None:
    turn = server.main_turn("s2")
    reply = server.post("/v1/rewards", {"session_id": "s2", "reward": 0.5, "detail": {"task": "t-1"}})
    assert reply.status_code == 202 and reply.json()["turn_id"] == turn
    [event] = server.next_states()
    assert event["source"] == "reward" and event["role"] == "environment"
    assert event["outcome"]["kind"] == "reward" and event["outcome"]["reward"] == 0.5
    assert json.loads(event["outcome"]["detail_json"]) == {"task": "t-1"}


def test_a_retried_report_has_the_same_event_id(server: Server) -> None:
    turn = server.main_turn("s2")
    body = {"session_id": "s2", "turn_id": turn, "reward": 1}
    first, second = server.post("/v1/rewards", body), server.post("/v1/rewards", body)
    assert first.json()["event_id"] == second.json()["event_id"]


def test_connector_observation_is_recorded_as_sent(server: Server) -> None:
    observation = Observation(
        content="2 passed", role="tool", outcome=Outcome(kind="tests", passed=2, failed=0, reward=1.0)
    )
    body = {"session_id": "s3", "turn_id": "s3/t4", "source": "pytest", **observation_to_json(observation)}
    assert server.post("/v1/observations", body).status_code == 202
    [event] = server.next_states()
    assert (event["envelope"]["turn_id"], event["source"], event["role"]) == ("s3/t4", "pytest", "tool")
    assert event["outcome"]["passed"] == 2 and event["outcome"]["reward"] == 1.0


def test_webhook_maps_arbitrary_json(server: Server) -> None:
    turn = server.main_turn("s4")
    reply = server.post("/v1/webhooks/ci", {"build": {"session": "s4", "log": "3 tests failed", "score": -1}})
    assert reply.status_code == 202, reply.text
    [event] = server.next_states()
    assert event["source"] == "webhook:ci" and event["envelope"]["turn_id"] == turn
    assert event["content"] == "3 tests failed" and event["outcome"]["reward"] == -1.0


def test_session_start_returns_a_fresh_id(server: Server) -> None:
    first = server.post("/v1/sessions/start", {"task_id": "calc-1"})
    second = server.post("/v1/sessions/start", b"")
    assert first.status_code == second.status_code == 200
    assert first.json()["session_id"] != second.json()["session_id"]
    assert first.json()["headers"] == {"X-Session-Id": first.json()["session_id"]}


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/feedback", {"session_id": "s1", "thumbs": 2}, 400, "thumbs"),
        ("/v1/feedback", {"session_id": "s1"}, 400, "thumbs"),
        ("/v1/feedback", {"session_id": "s1", "text": ""}, 400, "text"),
        ("/v1/feedback", {"thumbs": 1}, 400, "session_id"),
        ("/v1/feedback", {"session_id": 7, "thumbs": 1}, 400, "session_id"),
        ("/v1/rewards", {"session_id": "s1"}, 400, "reward"),
        ("/v1/rewards", {"session_id": "s1", "reward": "high"}, 400, "reward"),
        ("/v1/rewards", {"session_id": "s1", "reward": None}, 400, "reward"),  # was a 500 (tests/fuzz)
        ("/v1/rewards", {"session_id": "s1", "reward": 1, "detail": [1]}, 400, "detail"),
        ("/v1/observations", {"session_id": "s1", "turn_id": "t", "content": "x"}, 400, "source"),
        (
            "/v1/observations",
            {"session_id": "s1", "turn_id": "t", "source": "conversation", "content": "x"},
            400,
            "source",
        ),
        (
            "/v1/observations",
            {"session_id": "s1", "turn_id": "t", "source": "e", "content": ""},
            400,
            "content",
        ),
        ("/v1/webhooks/ci", {"build": {"log": "no session"}}, 400, "session_id"),
        ("/v1/webhooks/nope", {}, 404, None),
        ("/v1/rewards", {"session_id": "never-seen", "reward": 1}, 409, "turn_id"),
        ("/v1/sessions/start", {"task_id": 5}, 400, "task_id"),
    ],
)
def test_malformed_payloads_get_a_4xx_with_the_reason(
    server: Server, path: str, body: dict, status: int, param: str | None
) -> None:
    server.main_turn("s1")
    reply = server.post(path, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["param"] == param
    assert server.next_states() == []
    assert b"ingest_rejected" in server.state.metrics.exposition()


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b"x" * 20_000,
        b'{"session_id": "s1", "turn_id": "t", "text": "\\udc00"}',  # a lone surrogate: was a 500 (tests/fuzz)
    ],
)
def test_unreadable_bodies_are_refused(server: Server, raw: bytes) -> None:
    for path in ("/v1/rewards", "/v1/feedback"):
        reply = server.post(path, raw)
        assert reply.status_code in (400, 413) and reply.json()["error"]["message"]
    assert server.next_states() == []


def test_every_ingest_route_needs_the_api_key(server: Server) -> None:
    for path in ("/v1/feedback", "/v1/rewards", "/v1/observations", "/v1/webhooks/ci", "/v1/sessions/start"):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Bearer admin"}):
            assert server.post(path, {}, headers).status_code == 401
    assert server.next_states() == []


def test_the_feedback_after_an_ended_session_needs_a_turn_id(server: Server) -> None:
    turn = server.main_turn("s5")
    assert server.post("/v1/sessions/s5/end", {}).status_code == 200
    closes = [decode(e.value) for e in server.spool.oldest(1000) if e.topic == "live.sessions"]
    assert [c["last_turn_id"] for c in closes] == [turn]  # the pipeline ends the session's last main turn
    assert server.post("/v1/feedback", {"session_id": "s5", "thumbs": 1}).status_code == 409
    assert server.post("/v1/feedback", {"session_id": "s5", "turn_id": turn, "thumbs": 1}).status_code == 202


def test_orl_serve_app_registers_the_ingest_routes(server: Server) -> None:
    paths = {getattr(route, "path", "") for route in build_app(server.state).routes}
    assert {
        "/v1/feedback",
        "/v1/rewards",
        "/v1/observations",
        "/v1/webhooks/{name}",
        "/v1/sessions/start",
    } <= paths
    client = TestClient(build_app(server.state))
    reply = client.post("/v1/webhooks/ci", json={}, headers=AUTH)  # no mappings configured by default
    assert reply.status_code == 404 and "none configured" in reply.json()["error"]["message"]


def test_the_metric_of_next_states_has_a_fixed_set_of_source_labels(server: Server) -> None:
    for source in ("pytest", "my-own-ci:run-17", "x" * 60):
        body = {"session_id": "s9", "turn_id": "s9/t0", "source": source, "content": "ok", "role": "tool"}
        assert server.post("/v1/observations", body).status_code == 202, source
    server.post("/v1/feedback", {"session_id": "s9", "turn_id": "s9/t0", "thumbs": 1})
    exposition = server.state.metrics.exposition().decode()
    labels = {
        line.split('source="')[1].split('"')[0]
        for line in exposition.splitlines()
        if "next_states_ingested" in line and 'source="' in line
    }
    assert labels == {"observation", "feedback"}, exposition
