"""Hot swap: follow the trainer's checkpoints, verify each one, and swap it in between requests.

Reads: the `checkpoints` topic (CheckpointPublished) as this server's own consumer group, and the
checkpoint files in the object store. Writes: `policy_activations` (PolicyActivated /
PolicyRejected). The log is the source of truth: a version is served only if a CheckpointPublished
on the log announces it, and its manifest must have the hash that event recorded (at start-up and on
`pin` too, never the manifest as found in the store). A checkpoint is downloaded and verified
(manifest hash, every file's sha256) before the backend sees it; a tampered or incomplete one is
refused and the old policy keeps serving. A backend that cannot be reached during a swap is retried
with backoff (TRANSIENT_SWAP_ATTEMPTS times before the version is refused). The backend swaps
between requests, so nothing is refused while it happens. An operator can pin a version (stop
following) and roll back to the previous one. With `promoted_only` (behind the promotion gate,
`orl gate`) the server follows PolicyGated promotions instead of publications: it reads
`checkpoints` from its beginning and serves the newest promoted version. A server with
--tenant-adapters runs one follower per named tenant's own run (`tenant_run`) beside the main one.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from orl.connectors.checkpoint_store import MANIFEST_NAME, download_and_verify, version_prefix
from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.reading import reached, read_to_end
from orl.connectors.metrics import Metrics
from orl.connectors.object_store.base import ObjectStore
from orl.rules.gate_decisions import GateDecisions
from orl.schemas.codec import decode
from orl.schemas.errors import CheckpointError, EventDecodeError, ServiceUnavailable
from orl.schemas.event_types import CheckpointPublished
from orl.schemas.topics import topic_name
from orl.serving.capture import EventRecorder
from orl.serving.policy.base import MAIN_RUN, PolicyBackend

logger = logging.getLogger(__name__)
KEPT_DOWNLOADS = 3  # served checkpoints kept on disk: the last activated ones (and a pinned one)
TRANSIENT_SWAP_ATTEMPTS = 5  # swaps of one version that found the backend unreachable before it is refused


@dataclass(frozen=True)
class CheckpointRef:
    run_id: str
    version: int
    kind: str
    manifest_key: str
    manifest_sha256: str  # as the CheckpointPublished on the log recorded it
    published_at_ms: int | None = None


@dataclass
class CheckpointFollower:
    backend: PolicyBackend
    store: ObjectStore
    recorder: EventRecorder
    metrics: Metrics
    run_id: str
    server_id: str
    download_dir: Path
    log: EventLog
    namespace: str
    pinned: int | None = None
    history: list[CheckpointRef] = field(default_factory=list)  # activated checkpoints, oldest first
    refused: set[int] = field(default_factory=set)  # versions this server refused (not tried again)
    unreachable_swaps: dict[int, int] = field(default_factory=dict)  # version -> swaps the backend missed
    caught_up: bool = False  # the newest version the log had when following began is served (or refused)
    promoted_only: bool = False  # activate only versions the promotion gate promoted
    tenant_run: bool = (
        False  # a tenant's own run (orl.schemas.ids.tenant_run): the backend holds it beside the main
    )
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def backend_run(self) -> str:
        """The run the backend serves this run's checkpoints as ("" = its main policy)."""
        return self.run_id if self.tenant_run else MAIN_RUN

    @property
    def consumer_group(self) -> str:
        """This follower's group on the checkpoints topic: one per run, so that a tenant run's follower
        reads every record beside the main one's (in one group they would share the topic's records)."""
        group = f"{self.namespace}.serve.{self.server_id}"
        return f"{group}.{self.run_id}" if self.tenant_run else group

    @property
    def served_version(self) -> int:
        """The version of this run being served (0 = none of its checkpoints yet, or the base model)."""
        return self.backend.version_of(self.backend_run) or 0

    async def activate_latest(self) -> None:
        """At start (and after a failure to follow): serve the newest published checkpoint that verifies.

        Versions the log announces are tried newest first, down to the one being served. One that is
        refused (a file that fails its hash, a manifest that is not the published one) is recorded as
        PolicyRejected and the next older one is tried, so a corrupt newest checkpoint costs one
        version, never the whole run.
        """
        published = await self.published_checkpoints()
        for version in sorted(published, reverse=True):
            if version <= self.served_version:
                return
            if version not in self.refused and await self.activate(published[version]):
                return

    async def published_checkpoints(self) -> dict[int, CheckpointRef]:
        """Every version of this run that a CheckpointPublished on the log announces, with its hash."""
        records = await read_to_end(self.log, topic_name(self.namespace, "checkpoints"))
        refs = (_checkpoint_ref(record.value) for record in records)
        return {ref.version: ref for ref in refs if ref is not None and ref.run_id == self.run_id}

    async def follow(self, max_backoff_s: float = 10.0) -> None:
        """Apply every newer CheckpointPublished of our run, forever.

        Any failure (the log, the object store or the backend unreachable) is logged, counted in
        `checkpoint_follow_errors` and retried with backoff. Each pass first activates the newest
        published checkpoint, so one whose download or swap failed halfway, or one published before
        this server's consumer started, is not missed. The server keeps serving meanwhile.
        A checkpoint that fails verification is not an error here: activate() refuses it for good.
        """
        backoff = 0.5
        while True:
            try:
                if self.promoted_only:
                    await self._follow_promotions()  # reads the topic from its start
                    continue
                if self.pinned is None:
                    await self.activate_latest()  # what was published before the consumer reads
                self.caught_up = True
                await self._follow_once()
            except Exception:  # noqa: BLE001 - whatever broke, following must resume
                self.metrics.count("checkpoint_follow_errors")
                logger.exception("following checkpoints failed; retrying in %.1f s", backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, max_backoff_s)

    async def _follow_once(self) -> None:
        topic = topic_name(self.namespace, "checkpoints")
        async with self.log.consumer(self.consumer_group, [topic], auto_offset_reset="latest") as consumer:
            while True:
                for record in await consumer.poll(max_records=50, timeout_s=1.0):
                    ref = _checkpoint_ref(record.value)
                    if (
                        ref is not None
                        and ref.run_id == self.run_id
                        and self.pinned is None
                        and ref.version > self.served_version
                        and ref.version not in self.refused
                    ):
                        await self.activate(ref)
                await consumer.commit()

    async def _follow_promotions(self) -> None:
        """Serve the newest promoted version, forever: every record of `checkpoints` from the first (a
        restarted server finds the newest promotion); versions promoted within one poll batch are
        passed over for the newest."""
        topic = topic_name(self.namespace, "checkpoints")
        published: dict[int, CheckpointRef] = {}
        decisions = GateDecisions(self.run_id)
        async with self.log.consumer(
            f"{self.namespace}.serve.{self.server_id}.{uuid.uuid4().hex[:8]}", [topic]
        ) as consumer:
            await consumer.seek_to_beginning()
            ends, topic_partitions = await self.log.end_offsets(topic), sorted(await consumer.assignment())
            while True:
                promoted_before = decisions.promoted
                for record in await consumer.poll(max_records=500, timeout_s=1.0):
                    event = _decoded(record.value)
                    if event is None or event.get("run_id") != self.run_id:
                        continue
                    ref = _published_ref(event)
                    if ref is not None:
                        published[ref.version] = ref
                    else:
                        decisions.read(event)
                # a promotion read in this batch (as after a pin and unpin, the server waits for the next one)
                newest = decisions.promoted if decisions.promoted > promoted_before else self.served_version
                if self.pinned is None and newest > self.served_version and newest not in self.refused:
                    if newest in published:
                        await self.activate(published[newest])
                    else:  # its CheckpointPublished is gone (retention): nothing to check it against
                        self._refuse(newest, _manifest_key(self.run_id, newest), _UNPUBLISHED)
                if not self.caught_up:  # every promotion the topic held when this began is read
                    self.caught_up = await reached(consumer, topic_partitions, ends)

    async def activate(self, ref: CheckpointRef) -> bool:
        """Download, verify and swap in a checkpoint; PolicyActivated or PolicyRejected either way."""
        async with self._lock:
            started = time.perf_counter()
            dest = self.download_dir / ref.run_id / f"{ref.version:08d}"
            try:
                await asyncio.to_thread(_fresh_download, self.store, ref, dest)
                await self.backend.load_checkpoint(dest, ref.version, ref.kind, self.backend_run)  # type: ignore[arg-type]
            except CheckpointError as error:  # the store's verdict or the backend's refusal
                self._refuse(ref.version, ref.manifest_key, str(error))
                return False
            except ServiceUnavailable as error:  # the backend was not there: not a verdict on the checkpoint
                missed = self.unreachable_swaps[ref.version] = self.unreachable_swaps.get(ref.version, 0) + 1
                if missed < TRANSIENT_SWAP_ATTEMPTS:
                    raise  # retried with backoff (follow), or a 503 to the operator (pin)
                self._refuse(
                    ref.version, ref.manifest_key, f"{missed} swaps found the backend unreachable: {error}"
                )
                return False
            latency_ms = (time.perf_counter() - started) * 1000
            if ref.published_at_ms is not None:
                latency_ms = max(latency_ms, self.recorder.clock_ms() - ref.published_at_ms)
            self.history.append(ref)
            self.metrics.count("checkpoints_activated")
            self.metrics.observe("swap_latency_seconds", latency_ms / 1000)
            self.recorder.policy_activated(
                self.server_id, ref.run_id, ref.version, self._uri(ref), latency_ms
            )
            logger.info("now serving %s v%d (swap %.0f ms)", ref.run_id, ref.version, latency_ms)
            await asyncio.to_thread(self._prune_downloads)
            return True

    def _prune_downloads(self) -> None:
        """Delete the downloaded checkpoints of this run but the last KEPT_DOWNLOADS activated and a
        pinned one (a rollback to an older one downloads it again; the backends hold what they serve
        in memory, not on these files)."""
        kept = {ref.version for ref in self.history[-KEPT_DOWNLOADS:]} | {self.pinned}
        run_dir = self.download_dir / self.run_id
        for folder in run_dir.iterdir() if run_dir.is_dir() else ():
            if folder.is_dir() and folder.name.isdigit() and int(folder.name) not in kept:
                shutil.rmtree(folder, ignore_errors=True)

    async def pin(self, version: int) -> bool:
        """Serve exactly `version` of the run and stop following newer ones."""
        ref = next((r for r in self.history if r.version == version), None)
        if ref is None:
            ref = (await self.published_checkpoints()).get(version)
        if ref is None:
            raise CheckpointError(f"run {self.run_id!r} has no v{version} on the log: {_UNPUBLISHED}")
        self.pinned = version
        if version == self.served_version:
            return True
        return await self.activate(ref)

    def unpin(self) -> None:
        self.pinned = None

    async def rollback(self) -> int:
        """Pin the checkpoint served before the current one (the base model is version 0)."""
        previous = [r for r in self.history if r.version < self.served_version]
        if not previous:
            raise CheckpointError("nothing to roll back to: no earlier checkpoint was served")
        await self.pin(previous[-1].version)
        return previous[-1].version

    def _refuse(self, version: int, manifest_key: str, reason: str) -> None:
        logger.warning("refused checkpoint %s v%d: %s", self.run_id, version, reason)
        self.refused.add(version)
        self.metrics.count("checkpoints_rejected")
        self.recorder.policy_rejected(
            self.server_id, self.run_id, version, self.store.uri(manifest_key), reason
        )

    def _uri(self, ref: CheckpointRef) -> str:
        return self.store.uri(ref.manifest_key)


_UNPUBLISHED = "no CheckpointPublished announces it, so there is no published hash to check it against"


def _manifest_key(run_id: str, version: int) -> str:
    return f"{version_prefix(run_id, version)}{MANIFEST_NAME}"


def _fresh_download(store: ObjectStore, ref: CheckpointRef, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    download_and_verify(
        store, ref.manifest_key, dest, expected_manifest_sha256=ref.manifest_sha256, trainer_state=False
    )


def _checkpoint_ref(value: bytes) -> CheckpointRef | None:
    event = _decoded(value)
    return _published_ref(event) if event is not None else None


def _decoded(value: bytes) -> dict | None:
    try:
        return decode(value)
    except EventDecodeError as error:
        logger.warning("skipping an undecodable checkpoint event: %s", error)
        return None


def _published_ref(event: dict) -> CheckpointRef | None:
    """The checkpoint a CheckpointPublished event announces (None for the topic's other events)."""
    if event["envelope"]["event_type"] != "CheckpointPublished":
        return None
    published = cast(CheckpointPublished, event)
    return CheckpointRef(
        published["run_id"],
        published["version"],
        published["kind"],
        published["manifest_key"],
        published["manifest_sha256"],
        published["envelope"]["occurred_at"],
    )
