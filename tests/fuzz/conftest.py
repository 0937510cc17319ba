"""The fuzzed server (tests/fuzz/fuzz_server.py has its settings), in-process and on loopback, per module."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from orl.connectors.event_log.base import TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.metrics import Metrics
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.serving.admin import admin_routes
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.checkpoint_follower import CheckpointFollower
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool
from starlette.applications import Starlette
from starlette.testclient import TestClient

from benchmarks.echo_backend import EchoBackend
from tests.fuzz.fuzz_server import (
    ADMIN_KEY,
    API_KEY,
    BODY_TIMEOUT_S,
    INTERNAL_KEY,
    MAX_BODY_BYTES,
    METRICS_KEY,
    WEBHOOKS,
)


@pytest.fixture(scope="module")
def fuzz_state(tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path) -> Iterator[ServerState]:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "webhooks.json").write_text(json.dumps(WEBHOOKS))
    spool = EventSpool(root / "spool.db", sync="normal")  # durability is not what is tested here
    backend, metrics = EchoBackend(), Metrics()
    recorder = EventRecorder(spool, "fuzz", clock_ms=lambda: 1_700_000_000_000)
    log = SqliteEventLog(root / "log.db")  # on its own thread: usable from the test client's event loop

    async def start_log() -> None:
        await log.start()
        await log.create_topics([TopicSpec("fuzz.checkpoints", 1)])

    asyncio.run(start_log())
    follower = CheckpointFollower(
        backend,
        LocalObjectStore(root / "store"),
        recorder,
        metrics,
        "live",
        "fuzz",
        root / "served",
        log,
        "fuzz",
    )
    state = ServerState(
        settings=ServeSettings(
            api_keys=(API_KEY,),
            admin_key=ADMIN_KEY,
            internal_key=INTERNAL_KEY,
            metrics_key=METRICS_KEY,
            webhooks_file=str(root / "webhooks.json"),
            max_body_bytes=MAX_BODY_BYTES,
            body_timeout_s=BODY_TIMEOUT_S,
        ),
        backend=backend,
        template=ChatTemplate.from_dir(base_model_dir),
        recorder=recorder,
        metrics=metrics,
        admin_routes=admin_routes(follower),
    )
    state.ready = True
    yield state
    asyncio.run(log.close())
    spool.close()


@pytest.fixture(scope="module")
def fuzz_app(fuzz_state: ServerState) -> Starlette:
    return build_app(fuzz_state)


@pytest.fixture(scope="module")
def fuzz_client(fuzz_app: Starlette) -> TestClient:
    return TestClient(fuzz_app, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def loopback_port(fuzz_app: Starlette) -> Iterator[int]:
    """The fuzzed app behind real uvicorn on 127.0.0.1 (ASGI test clients cannot send slowly)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(fuzz_app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    yield port
    server.should_exit = True
    thread.join(timeout=10)
