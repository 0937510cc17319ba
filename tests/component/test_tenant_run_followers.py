"""A tenant's own run (--tenant-adapters) beside the main run: its follower follows its checkpoints
while the main one follows the main run's, and /admin pin, unpin and rollback of it leave the main
run alone.

Real SQLite log, real checkpoints published with the trainer's `publish_checkpoint` into a local object
store and announced with its CheckpointPublished events, real checkpoint followers (one for the main
run, one for the tenant run, as `orl serve --tenant-adapters` starts them) and the real app's admin
routes, over the echo backend that holds tenant runs' versions as a real backend does.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
from orl.connectors.checkpoint_store import latest_checkpoint, publish_checkpoint
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
from orl.trainer.resume import append_step_events

from benchmarks.echo_backend import EchoBackend

NAMESPACE, MAIN, ALICE = "ns", "home", "home.alice"


async def publish(log: SqliteEventLog, store: LocalObjectStore, tmp: Path, run: str, version: int) -> None:
    weights = tmp / f"{run}-v{version}"
    weights.mkdir()
    (weights / "adapter.bin").write_bytes(f"{run} weights v{version}".encode())
    publish_checkpoint(
        store, run, version, weights, parent_version=version - 1 or None, kind="lora",
        base_model="base", consumed_offsets=[], sample_ids=[], metrics={},
    )  # fmt: skip
    manifest = latest_checkpoint(store, run)
    assert manifest is not None and manifest.version == version
    await append_step_events(log, manifest, NAMESPACE, f"file://{manifest.manifest_key}")


async def started_log(tmp_path: Path) -> SqliteEventLog:
    log = SqliteEventLog(tmp_path / "log.db")
    await log.start()
    await log.create_topics(
        [TopicSpec(f"{NAMESPACE}.checkpoints", 1), TopicSpec(f"{NAMESPACE}.train_steps", 1)]
    )
    return log


async def test_both_followers_follow_their_runs_checkpoints_at_once(tmp_path: Path) -> None:
    log = await started_log(tmp_path)
    store, backend, spool = (
        LocalObjectStore(tmp_path / "objects"),
        EchoBackend(),
        EventSpool(tmp_path / "spool.db"),
    )
    recorder = EventRecorder(spool, NAMESPACE, clock_ms=lambda: int(time.time() * 1000))
    followers = [
        CheckpointFollower(
            backend,
            store,
            recorder,
            Metrics(),
            run,
            "srv",
            tmp_path / "served",
            log,
            NAMESPACE,
            tenant_run=run != MAIN,
        )  # fmt: skip
        for run in (MAIN, ALICE, "home.bob")
    ]
    following = [asyncio.create_task(f.follow()) for f in followers]
    try:
        while not all(f.caught_up for f in followers):
            await asyncio.sleep(0.05)
        await publish(log, store, tmp_path, ALICE, 1)
        await publish(log, store, tmp_path, MAIN, 1)
        await publish(log, store, tmp_path, ALICE, 2)
        deadline = time.monotonic() + 20
        while (backend.version_of(""), backend.version_of(ALICE)) != (1, 2):
            assert time.monotonic() < deadline, [f.served_version for f in followers]
            await asyncio.sleep(0.05)
        assert (
            backend.version_of("home.bob") is None
        )  # bob's run published nothing: the main policy answers him
    finally:
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
        await log.close()
        spool.close()


async def test_a_tenant_run_is_pinned_rolled_back_and_unpinned_on_its_own(
    base_model_dir: Path, tmp_path: Path
) -> None:
    log = SqliteEventLog(tmp_path / "log.db")
    await log.start()
    await log.create_topics(
        [TopicSpec(f"{NAMESPACE}.checkpoints", 1), TopicSpec(f"{NAMESPACE}.train_steps", 1)]
    )
    store, backend, spool = (
        LocalObjectStore(tmp_path / "objects"),
        EchoBackend(),
        EventSpool(tmp_path / "spool.db"),
    )
    recorder = EventRecorder(spool, NAMESPACE, clock_ms=lambda: int(time.time() * 1000))

    def follower(run: str, tenant_run: bool) -> CheckpointFollower:
        return CheckpointFollower(
            backend, store, recorder, Metrics(), run, "srv", tmp_path / "served", log, NAMESPACE,
            tenant_run=tenant_run,
        )  # fmt: skip

    main, alice = follower(MAIN, False), follower(ALICE, True)
    for version in (1, 2, 3):  # each served in turn, as the followers would follow them
        if version < 3:
            await publish(log, store, tmp_path, MAIN, version)
            await main.activate_latest()
        await publish(log, store, tmp_path, ALICE, version)
        await alice.activate_latest()
    settings = ServeSettings(
        api_keys=("client",), tenant_keys=("alice=alice-key",), admin_key="admin", run_id=MAIN
    )
    state = ServerState(
        settings=settings,
        backend=backend,
        template=ChatTemplate.from_dir(base_model_dir),
        recorder=recorder,
        metrics=Metrics(),
        admin_routes=admin_routes(main, [alice]),
    )
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=build_app(state)),
        base_url="http://orl",
        headers={"authorization": "Bearer admin"},
    )

    async def versions() -> tuple[int, int | None]:
        policy = (await client.get("/admin/policy")).json()
        return policy["policy_version"], policy["tenant_runs"][ALICE]

    assert await versions() == (2, 3)
    rolled = await client.post("/admin/rollback", json={"run": ALICE})
    assert rolled.status_code == 200, rolled.text
    assert rolled.json()["run_id"] == ALICE and rolled.json()["pinned"] == 2
    assert await versions() == (2, 2)  # the main run is untouched
    pinned = await client.post("/admin/pin", json={"run": ALICE, "version": 1})
    assert pinned.status_code == 200 and pinned.json()["policy_version"] == 1
    assert (await client.post("/admin/unpin", json={"run": ALICE})).json()["pinned"] is None
    assert main.pinned is None and alice.pinned is None
    # no body: the main run, as before tenant runs existed
    assert (await client.post("/admin/rollback")).json() == {
        "run_id": MAIN, "policy_version": 1, "pinned": 1, "served_versions": [1, 2, 1],
    }  # fmt: skip
    assert await versions() == (1, 1)
    unknown = await client.post("/admin/rollback", json={"run": "home.mallory"})
    assert unknown.status_code == 400 and "home.mallory" in unknown.text and ALICE in unknown.text
    await client.aclose()
    await log.close()
    spool.close()
