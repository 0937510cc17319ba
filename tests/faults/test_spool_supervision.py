"""The server's spool under faults that outlive every retry inside one drain (issue 44).

The real app (`build_app` over the zero-cost echo backend and the real SmolLM2 tokenizer), the real
spool and SpoolDrainer, and the real embedded event log, driven in-process through httpx's ASGI
transport. The faults are real:
- a lock: another connection holds an exclusive lock on the log's SQLite file past the log's busy
  timeout (0.2 s here instead of 30 s, so that the test does not wait half a minute per drain);
- a full disk: the log (or the spool) lives on a 2 MiB tmpfs of the test's own, filled by a ballast
  file; the fault clears when the ballast is deleted (mounting needs root, as on CI's machine);
- the byte cap: a spool capped at a few kilobytes while the log is locked.
Each test checks that every acknowledged turn (a 200) reaches the log once the fault clears, that
/readyz says why while it lasts, and that the drainer task never dies. The drain time after the
fault clears is printed (the issue's target is 10 s; the drainer's backoff is capped at 5 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.metrics import Metrics
from orl.schemas.codec import decode
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.main import _serve_until_background_ends
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool, SpoolDrainer

from benchmarks.echo_backend import EchoBackend
from tests.fixtures.fake_sglang import free_port

KEY = "spool-key"
TURNS = 12
LONG_TEXT = " ".join(["lorem"] * 3000)  # about 18 KB of messages and 3,000 prompt token ids a turn


class Stack:
    """The app, its spool and drainer (running), and an embedded log at `log_path`."""

    def __init__(
        self, template: ChatTemplate, spool_path: Path, log_path: Path, max_bytes: int | None
    ) -> None:
        self.log = SqliteEventLog(log_path, busy_timeout_s=0.2)
        self.spool = EventSpool(spool_path, sync="normal", max_bytes=max_bytes)
        metrics = Metrics()
        self.drainer = SpoolDrainer(self.spool, self.log, metrics=metrics)
        self.spool.on_committed = self.drainer.wake
        self.state = ServerState(
            settings=ServeSettings(api_keys=(KEY,), admin_key="admin"),
            backend=EchoBackend(),
            template=template,
            recorder=EventRecorder(self.spool, "live", clock_ms=lambda: int(time.time() * 1000)),
            metrics=metrics,
            drainer=self.drainer,
            ready=True,
        )
        transport = httpx.ASGITransport(app=build_app(self.state), raise_app_exceptions=True)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://orl")
        self.task: asyncio.Task[None] | None = None
        self.acknowledged: list[str] = []  # request ids of the turns answered 200

    async def start(self) -> None:
        await self.log.start()
        await create_catalog_topics(self.log, "live", 1)
        self.task = asyncio.create_task(self.drainer.run())

    async def chat(self, text: str) -> httpx.Response:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
        reply = await self.client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"}
        )
        if reply.status_code == 200:
            self.acknowledged.append(reply.json()["id"])
        return reply

    async def readiness(self) -> dict[str, Any]:
        reply = await self.client.get("/readyz")
        body: dict[str, Any] = reply.json()
        assert (reply.status_code == 200) == body["ready"], body
        return body

    async def wait_for_problem(self, timeout_s: float = 10.0) -> str:
        deadline = time.monotonic() + timeout_s
        while self.drainer.problem is None:
            assert time.monotonic() < deadline, "the drainer never reported the fault"
            self.drainer.wake()
            await asyncio.sleep(0.05)
        return self.drainer.problem

    async def drained_after_clearing(self) -> float:
        """Seconds from now until the spool is empty and drains again, with nobody waking the
        drainer (its own backoff decides; fails after 10 s)."""
        started = time.monotonic()
        while self.spool.depth() > 0 or self.drainer.problem is not None:
            assert time.monotonic() - started < 10.0, (self.spool.depth(), self.drainer.problem)
            await asyncio.sleep(0.02)
        return time.monotonic() - started

    async def check_every_acknowledged_turn_is_logged(self) -> int:
        """Every turn answered 200 has its request and its response on the log, and no other turn
        has a response there (a turn refused after its request was spooled leaves only the request);
        returns how many records are there twice (see the full-disk test)."""
        await self.drainer.flush(timeout_s=10.0)
        requests = [decode(r.value)["request_id"] for r in await read_to_end(self.log, "live.requests")]
        responses = [decode(r.value)["request_id"] for r in await read_to_end(self.log, "live.responses")]
        assert set(self.acknowledged) <= set(requests)
        assert set(responses) == set(self.acknowledged)
        return len(requests) - len(set(requests)) + len(responses) - len(set(responses))

    async def close(self) -> None:
        assert self.task is not None and not self.task.done(), "the drainer task ended"
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.client.aclose()
        await self.log.close()
        self.spool.close()


@pytest.fixture(scope="module")
def template(base_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(base_model_dir)


@contextlib.contextmanager
def exclusive_lock(db: Path) -> Iterator[None]:
    """Another connection's exclusive lock on `db` (a backup tool or a stuck reader) until the block ends."""
    holder = sqlite3.connect(db, isolation_level=None, timeout=5.0)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs of this test's own."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI's machine runs the suite as root)")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """A ballast file that takes every free byte of `disk`."""
    ballast = disk / "ballast"
    descriptor = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(descriptor, b"\0" * 4096)
    except OSError:  # ENOSPC: the disk is full
        pass
    finally:
        os.close(descriptor)
    return ballast


@pytest.fixture
async def stack(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[Stack]:
    up = Stack(template, tmp_path / "spool.db", tmp_path / "log.db", max_bytes=None)
    await up.start()
    yield up
    await up.close()


async def test_a_log_locked_past_its_busy_timeout_is_retried_and_nothing_acknowledged_is_lost(
    stack: Stack, tmp_path: Path
) -> None:
    await stack.chat("before the lock")
    await stack.drainer.flush()
    with exclusive_lock(tmp_path / "log.db"):
        replies = [await stack.chat(f"question {index}") for index in range(TURNS)]
        assert [reply.status_code for reply in replies] == [200] * TURNS  # answered while spooling
        problem = await stack.wait_for_problem()
        assert "locked" in problem, problem
        readiness = await stack.readiness()
        assert not readiness["ready"] and readiness["reason"] == stack.drainer.problem
        await asyncio.sleep(1.0)  # several failed drains: the drainer lives on
        assert stack.task is not None and not stack.task.done()
        assert stack.drainer.failures >= 2
    print(f"lock released: drained in {await stack.drained_after_clearing():.2f} s")
    assert (await stack.readiness())["ready"]
    assert await stack.check_every_acknowledged_turn_is_logged() == 0
    assert len(stack.acknowledged) == TURNS + 1
    exposition = stack.state.metrics.exposition().decode()
    assert "orl_spool_drain_failures_total" in exposition, exposition


async def test_a_full_disk_under_the_log_is_retried_and_drains_once_space_is_back(
    tmp_path: Path, template: ChatTemplate, small_disk: Path
) -> None:
    up = Stack(template, tmp_path / "spool.db", small_disk / "log.db", max_bytes=None)
    await up.start()
    try:
        ballast = fill(small_disk)
        replies = [await up.chat(f"{index} {LONG_TEXT}") for index in range(TURNS)]
        assert [reply.status_code for reply in replies] == [200] * TURNS  # the spool is on another disk
        problem = await up.wait_for_problem()
        assert "full" in problem, problem
        assert not (await up.readiness())["ready"]
        ballast.unlink()
        print(f"disk freed: drained in {await up.drained_after_clearing():.2f} s")
        assert await up.check_every_acknowledged_turn_is_logged() == 0
        assert (await up.readiness())["ready"]
    finally:
        await up.close()


async def test_a_full_disk_under_the_spool_refuses_turns_and_acknowledges_none_it_did_not_keep(
    tmp_path: Path, template: ChatTemplate, small_disk: Path
) -> None:
    up = Stack(template, small_disk / "spool.db", tmp_path / "log.db", max_bytes=None)
    await up.start()
    try:
        await up.chat("before the disk fills")
        ballast = fill(small_disk)
        statuses = [(await up.chat(f"{index} {LONG_TEXT}")).status_code for index in range(TURNS)]
        assert 503 in statuses and set(statuses) <= {200, 503}, statuses
        ballast.unlink()
        assert (await up.chat("after the disk is freed")).status_code == 200
        print(f"disk freed: drained in {await up.drained_after_clearing():.2f} s")
        # A drain whose DELETE of the moved rows failed (no room for the spool's WAL) moves them
        # again: the log holds them twice, with the same event ids, which consumers drop.
        twice = await up.check_every_acknowledged_turn_is_logged()
        print(f"records on the log twice (the same event ids): {twice}")
    finally:
        await up.close()


async def test_over_its_byte_cap_the_spool_refuses_new_turns_until_it_drains(
    tmp_path: Path, template: ChatTemplate
) -> None:
    up = Stack(template, tmp_path / "spool.db", tmp_path / "log.db", max_bytes=6_000)
    await up.start()
    try:
        with exclusive_lock(tmp_path / "log.db"):
            statuses = [(await up.chat(f"question {index}")).status_code for index in range(TURNS)]
            assert statuses[0] == 200 and statuses[-1] == 503, statuses
            refused = await up.chat("one more")
            assert refused.status_code == 503 and refused.headers["retry-after"], refused.headers
            assert refused.json()["error"]["code"] == "spool_full", refused.text
            feedback = await up.client.post(
                "/v1/feedback",
                json={"session_id": "s1", "thumbs": 1},
                headers={"authorization": f"Bearer {KEY}"},
            )
            assert feedback.status_code == 503 and feedback.json()["error"]["code"] == "spool_full"
            readiness = await up.readiness()
            assert "cap" in readiness["reason"], readiness
        print(f"lock released: drained in {await up.drained_after_clearing():.2f} s")
        assert up.spool.queued_bytes == 0
        assert (await up.chat("after the drain")).status_code == 200
        assert await up.check_every_acknowledged_turn_is_logged() == 0
    finally:
        await up.close()


async def test_the_server_exits_non_zero_when_its_drain_task_ends() -> None:
    async def drain_that_dies() -> None:
        await asyncio.sleep(0.3)
        raise RuntimeError("a bug in the drainer")

    async def hello(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    port = free_port()
    http = uvicorn.Server(uvicorn.Config(hello, host="127.0.0.1", port=port, log_level="warning"))
    code = await asyncio.wait_for(
        _serve_until_background_ends(http, asyncio.create_task(drain_that_dies())), timeout=30
    )
    assert code == 1
    with pytest.raises(httpx.ConnectError):  # the listener is closed
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
