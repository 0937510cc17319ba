"""The checkpoint follower survives an unreachable log, object store and backend, misses no checkpoint,
and serves only what the log published, with the hash the log recorded.

Real SQLite log, real files in a local object store, real checkpoints published with the trainer's
`publish_checkpoint` and announced with its CheckpointPublished events; only the outages are made
up: the log refuses the first consumer, the store refuses its first reads, the backend is away for
its first swaps.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from orl.connectors.checkpoint_store import latest_checkpoint, publish_checkpoint
from orl.connectors.event_log.base import Consumer, OutgoingRecord, TopicPartition, TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog, SqliteStore
from orl.connectors.metrics import Metrics
from orl.connectors.object_store.base import ObjectStoreError
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.schemas.codec import decode, encode
from orl.schemas.errors import CheckpointError, ServiceUnavailable
from orl.serving.capture import EventRecorder
from orl.serving.checkpoint_follower import TRANSIENT_SWAP_ATTEMPTS, CheckpointFollower
from orl.serving.policy.base import CheckpointKind
from orl.serving.spool import EventSpool
from orl.trainer.resume import append_step_events

from benchmarks.echo_backend import EchoBackend
from tests.unit.event_examples import example_event

NAMESPACE, RUN, SERVER = "ns", "run", "srv"
TOPIC = f"{NAMESPACE}.checkpoints"


class SwappingBackend(EchoBackend):
    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[int] = []

    @property
    def policy_version(self) -> int:
        return self.loaded[-1] if self.loaded else 0

    async def load_checkpoint(self, path: Path, version: int, kind: CheckpointKind, run: str = "") -> None:
        assert (path / "adapter.bin").read_bytes() == f"weights v{version}".encode()
        self.loaded.append(version)


class AwayBackendFirst(SwappingBackend):
    """The first `away` swaps find the backend unreachable, as an SGLang server restarting would."""

    def __init__(self, away: int) -> None:
        super().__init__()
        self.away = away

    async def load_checkpoint(self, path: Path, version: int, kind: CheckpointKind, run: str = "") -> None:
        if self.away > 0:
            self.away -= 1
            raise ServiceUnavailable("SGLang server at http://127.0.0.1:1 is unreachable (test outage)")
        await super().load_checkpoint(path, version, kind, run)


class UnreachableStoreFirst(LocalObjectStore):
    """Every read fails while `failures` lasts, as an S3 endpoint that is down would."""

    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def get(self, key: str) -> bytes:
        if self.failures > 0:
            self.failures -= 1
            raise ObjectStoreError(f"cannot reach the object store to read {key!r} (test outage)")
        return super().get(key)


class UnreachableLogFirst(SqliteEventLog):
    """The first consumer cannot be created, as a Kafka broker that is down would refuse it."""

    refused = 0

    def consumer(self, group_id: str, topics: list[str], *, auto_offset_reset: str = "earliest") -> Consumer:  # type: ignore[override]
        if self.refused == 0:
            self.refused += 1
            raise ObjectStoreError("event log unreachable (test outage)")
        return super().consumer(group_id, topics, auto_offset_reset=auto_offset_reset)


def publish(root: Path, tmp: Path, version: int, weights_bytes: bytes | None = None) -> None:
    weights = tmp / f"v{version}-{root.name}"
    weights.mkdir()
    (weights / "adapter.bin").write_bytes(weights_bytes or f"weights v{version}".encode())
    publish_checkpoint(
        LocalObjectStore(root), RUN, version, weights, parent_version=version - 1 or None, kind="lora",
        base_model="base", consumed_offsets=[], sample_ids=[], metrics={},
    )  # fmt: skip


async def announce(log: SqliteEventLog, root: Path, version: int) -> None:
    manifest = latest_checkpoint(LocalObjectStore(root), RUN)
    assert manifest is not None and manifest.version == version
    await append_step_events(log, manifest, NAMESPACE, f"file://{manifest.manifest_key}")


async def started_log(tmp_path: Path, log_class: type[SqliteEventLog] = SqliteEventLog) -> SqliteEventLog:
    log = log_class(tmp_path / "log.db")
    await log.start()
    await log.create_topics([TopicSpec(TOPIC, 1), TopicSpec(f"{NAMESPACE}.train_steps", 1)])
    return log


def follower_on(
    backend: SwappingBackend, root: Path, log: SqliteEventLog, tmp_path: Path, spool_name: str
) -> tuple[CheckpointFollower, EventSpool]:
    """A follower of RUN over the local store at `root` and `log`, recording into its own spool."""
    spool = EventSpool(tmp_path / spool_name)
    recorder = EventRecorder(spool, NAMESPACE, clock_ms=lambda: int(time.time() * 1000))
    follower = CheckpointFollower(
        backend, LocalObjectStore(root), recorder, Metrics(), RUN, SERVER, tmp_path / "served", log, NAMESPACE
    )
    return follower, spool


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def test_outages_of_log_and_store_are_retried_and_no_checkpoint_is_missed(tmp_path: Path) -> None:
    root = tmp_path / "objects"

    async def scenario() -> None:
        log = await started_log(tmp_path, UnreachableLogFirst)
        backend = SwappingBackend()
        spool = EventSpool(tmp_path / "spool.db")
        recorder = EventRecorder(spool, NAMESPACE, clock_ms=lambda: int(time.time() * 1000))
        metrics = Metrics()
        store = UnreachableStoreFirst(root, failures=2)
        follower = CheckpointFollower(
            backend, store, recorder, metrics, RUN, SERVER, tmp_path / "served", log, NAMESPACE
        )
        publish(root, tmp_path, 1)  # published before the server's consumer could read: found on retry
        await announce(log, root, 1)
        following = asyncio.create_task(follower.follow(max_backoff_s=0.2))
        try:
            await until(lambda: backend.loaded == [1])
            assert follower.caught_up
            group, partition = f"{NAMESPACE}.serve.{SERVER}", TopicPartition(TOPIC, 0)

            async def committed() -> int | None:
                return await log.call(SqliteStore.committed, group, partition)

            deadline = time.monotonic() + 20
            while await committed() is None:  # the follower's consumer is now reading the topic
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            publish(root, tmp_path, 2)
            await announce(log, root, 2)
            await until(lambda: backend.loaded == [1, 2])
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            await log.close()
        errors = metrics.registry.get_sample_value("orl_checkpoint_follow_errors_total")
        assert errors is not None and errors >= 3  # the log once, the store twice
        outcomes = [decode(e.value)["envelope"]["event_type"] for e in spool.oldest(100)]
        assert outcomes == ["PolicyActivated", "PolicyActivated"]  # an outage is never a rejection
        spool.close()

    asyncio.run(scenario())


def test_a_server_starting_serves_the_newest_published_checkpoint_that_verifies_against_the_log(
    tmp_path: Path,
) -> None:
    root = tmp_path / "objects"

    async def scenario() -> list[tuple[str, int, str]]:
        log = await started_log(tmp_path)
        for version in (1, 2, 3, 4):
            publish(root, tmp_path, version)
            await announce(log, root, version)
        publish(root, tmp_path, 5)  # in the store, never announced (a trainer that crashed before it)
        # v4 replaced whole in the store: other weights and a manifest that lists them, consistent in
        # itself; only the hash on the log tells
        publish(tmp_path / "forged", tmp_path, 4, weights_bytes=b"forged weights")
        shutil.rmtree(root / "checkpoints" / RUN / "00000004")
        shutil.copytree(
            tmp_path / "forged" / "checkpoints" / RUN / "00000004", root / "checkpoints" / RUN / "00000004"
        )
        (root / "checkpoints" / RUN / "00000003" / "adapter.bin").write_bytes(
            b"weights v9"
        )  # one byte changed
        backend = SwappingBackend()
        follower, spool = follower_on(backend, root, log, tmp_path, "spool.db")
        await follower.activate_latest()
        assert backend.loaded == [2]  # not the base model: v4 and v3 are refused, v2 verifies; v5 unknown
        await follower.activate_latest()  # as after a failure to follow: the refused are not tried again
        assert backend.loaded == [2]
        with pytest.raises(CheckpointError, match="no v5 on the log"):
            await follower.pin(5)
        assert follower.pinned is None and backend.loaded == [2]
        await log.close()
        events = [decode(e.value) for e in spool.oldest(100)]
        spool.close()
        return [(e["envelope"]["event_type"], e["version"], e.get("reason", "")) for e in events]

    outcomes = asyncio.run(scenario())
    assert [(kind, version) for kind, version, _ in outcomes] == [
        ("PolicyRejected", 4),
        ("PolicyRejected", 3),
        ("PolicyActivated", 2),
    ]
    assert "manifest hash mismatch" in outcomes[0][2] and "sha256" in outcomes[1][2]


def test_a_backend_away_during_a_swap_is_retried_and_refused_only_after_repeated_misses(
    tmp_path: Path,
) -> None:
    root = tmp_path / "objects"

    async def follow_until(
        backend: AwayBackendFirst, spool_name: str, condition: Callable[[], bool]
    ) -> list[str]:
        follower, spool = follower_on(backend, root, log, tmp_path, spool_name)
        following = asyncio.create_task(follower.follow(max_backoff_s=0.05))
        try:
            await until(lambda: condition() or follower.refused != set())
            await until(lambda: follower.caught_up)
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        outcomes = [decode(e.value)["envelope"]["event_type"] for e in spool.oldest(100)]
        spool.close()
        return outcomes

    async def scenario() -> tuple[list[str], list[str]]:
        nonlocal log
        log = await started_log(tmp_path)
        publish(root, tmp_path, 1)
        await announce(log, root, 1)
        back_soon = AwayBackendFirst(away=TRANSIENT_SWAP_ATTEMPTS - 1)
        retried = await follow_until(back_soon, "spool-1.db", lambda: back_soon.loaded == [1])
        assert back_soon.loaded == [1]
        never_back = AwayBackendFirst(away=10**6)
        refused = await follow_until(never_back, "spool-2.db", lambda: False)
        await log.close()
        return retried, refused

    log: SqliteEventLog
    retried, refused = asyncio.run(scenario())
    assert retried == ["PolicyActivated"]  # four misses, then served: never a rejection
    assert refused == ["PolicyRejected"]  # the fifth miss: refused, and the server keeps serving v0


async def gate(log: SqliteEventLog, version: int, decision: str) -> None:
    """What `orl gate` appends after evaluating `version` (the figures do not matter here)."""
    event = example_event("PolicyGated")
    event.update(run_id=RUN, version=version, decision=decision)
    event["envelope"]["event_id"] = f"gated-{version}"
    await log.append(TOPIC, OutgoingRecord(value=encode(event), key=RUN.encode()))


def test_a_server_behind_the_gate_serves_the_newest_promoted_version_only(tmp_path: Path) -> None:
    root = tmp_path / "objects"

    async def scenario() -> tuple[list[int], list[int]]:
        log = await started_log(tmp_path)
        for version in (1, 2, 3):
            publish(root, tmp_path, version)
            await announce(log, root, version)
        await gate(log, 1, "promoted")
        await gate(log, 2, "promoted")
        await gate(log, 3, "held")

        async def follower_run(backend: SwappingBackend, serves: int, promote_after: int | None) -> None:
            spool = EventSpool(tmp_path / f"spool-{promote_after}.db")
            recorder = EventRecorder(spool, NAMESPACE, clock_ms=lambda: int(time.time() * 1000))
            follower = CheckpointFollower(
                backend, LocalObjectStore(root), recorder, Metrics(), RUN, SERVER, tmp_path / "served",
                log, NAMESPACE, promoted_only=True,
            )  # fmt: skip
            following = asyncio.create_task(follower.follow())
            try:
                await until(lambda: backend.loaded[-1:] == [serves])
                await until(lambda: follower.caught_up)
                await asyncio.sleep(1.5)  # a poll or two more: v3 is published, but held
                assert backend.loaded[-1] == serves
                if promote_after is not None:
                    publish(root, tmp_path, promote_after)
                    await announce(log, root, promote_after)
                    await gate(log, promote_after, "promoted")
                    await until(lambda: backend.loaded[-1:] == [promote_after])
            finally:
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
                spool.close()

        first, restarted = SwappingBackend(), SwappingBackend()
        await follower_run(first, serves=2, promote_after=4)
        await follower_run(
            restarted, serves=4, promote_after=None
        )  # a restart finds the newest promotion: v4
        await log.close()
        return first.loaded, restarted.loaded

    first, restarted = asyncio.run(scenario())
    assert first == [2, 4]  # v1 passed over for v2 within one read; v3 never
    assert restarted == [4]


def test_served_checkpoints_on_disk_are_the_last_three_and_a_pinned_one(tmp_path: Path) -> None:
    root, served = tmp_path / "objects", tmp_path / "served"

    async def scenario() -> tuple[list[str], list[str], list[int]]:
        backend = SwappingBackend()
        spool = EventSpool(tmp_path / "spool.db")
        recorder = EventRecorder(spool, NAMESPACE, clock_ms=lambda: int(time.time() * 1000))
        log = await started_log(tmp_path)
        follower = CheckpointFollower(
            backend, LocalObjectStore(root), recorder, Metrics(), RUN, SERVER, served, log, NAMESPACE
        )
        for version in range(1, 6):
            publish(root, tmp_path, version)
            await announce(log, root, version)
            await follower.activate_latest()
        after_five = sorted(path.name for path in (served / RUN).iterdir())
        await follower.pin(1)  # downloaded again (a rollback), and kept while pinned
        pinned = sorted(path.name for path in (served / RUN).iterdir())
        await log.close()
        spool.close()
        return after_five, pinned, backend.loaded

    after_five, pinned, loaded = asyncio.run(scenario())
    assert loaded == [1, 2, 3, 4, 5, 1]
    assert after_five == ["00000003", "00000004", "00000005"]
    assert pinned == ["00000001", "00000004", "00000005"]  # the last three activated: 4, 5, 1
