"""The training loop of `orl train`: consume, batch, loss, step, publish. The same for every backend.

Reads `<namespace>.samples` and the gate's decisions on `<namespace>.checkpoints`. Each step writes
`checkpoints/<run>/<version:08d>/` (weights, then the manifest last), then TrainStepCompleted on
`train_steps` and CheckpointPublished on `checkpoints`, then commits the group's offsets (informational).

Exactly-once training without transactions: the manifest of version v records, per partition, the
offset after the last record its step covered. A restarted trainer loads the newest manifest's
weights and reads on from exactly those offsets (`orl.trainer.sample_stream`), so a kill -9 anywhere
(before, during or after a checkpoint write) neither repeats nor skips a sample; a half-uploaded
version has no manifest and is deleted on start; events missing after a crash between the manifest
and the append are re-emitted from the manifest (`orl.trainer.resume`). One trainer process per run.

A `StepRunner` (`orl.trainer.steps`) takes and publishes each step: `orl.trainer.torch_backend` in
this process, `orl.trainer.megatron_backend.loop` across a torchrun job, so batching, resume and the
events cannot drift apart between backends. When to go back to earlier weights (a gate hold, a
rollback), wait for the gate, or stop is `orl.trainer.control`'s; this loop carries it out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from orl.connectors.event_log.base import EventLog, TopicPartition
from orl.connectors.key_store import tenant_sessions_kept
from orl.connectors.metrics import Metrics
from orl.connectors.object_store.base import ObjectStore
from orl.rules.gate_decisions import GateDecisions
from orl.schemas.topics import topic_name
from orl.trainer.batching import Batch, SampleBatcher
from orl.trainer.checkpointing import append_rollback_event, folder_uri, recent_lineage, restore_version
from orl.trainer.control import Restore, TrainerControl, stopped_by_rollback
from orl.trainer.flush_request import FlushRequest
from orl.trainer.gate_holds import follow_gate
from orl.trainer.resume import ResumePoint, append_step_events
from orl.trainer.rollback import RollbackWatch
from orl.trainer.sample_stream import SampleStream
from orl.trainer.settings import TrainSettings
from orl.trainer.steps import StepResult, StepRunner, count_step, log_step

log = logging.getLogger(__name__)
GATE_CATCH_UP_S = 10.0  # at start, how long to wait for the gate's decisions so far (trainer/gate_holds.py)
POLL_MAX_RECORDS = 256


async def consume_and_train(
    settings: TrainSettings,
    log_: EventLog,
    store: ObjectStore,
    runner: StepRunner,
    point: ResumePoint,
    metrics: Metrics,
    flush: FlushRequest | None = None,
) -> int:
    """Consume, batch, step, publish from `point` until `max_steps` (or idle exit); returns the steps taken."""
    if stopped_by_rollback(point.manifest.metrics if point.manifest else None, settings.rollback_action):
        await stay_stopped(settings, point.version)
        return 0
    holds, caught_up = GateDecisions(settings.run_id), asyncio.Event()
    gate = asyncio.create_task(
        follow_gate(log_, topic_name(settings.namespace, "checkpoints"), holds, caught_up)
    )
    try:
        try:
            await asyncio.wait_for(caught_up.wait(), GATE_CATCH_UP_S)
        except TimeoutError:
            log.warning(
                "the promotion gate's decisions were not read within %.0f s; going on", GATE_CATCH_UP_S
            )
        control = TrainerControl(
            holds,
            await rollback_watch(settings, store),
            restores_for_gate=settings.backend == "torch",
            follow_promoted=settings.follow_promoted,
            max_staleness=settings.max_staleness,
            stop_after_rollback=settings.rollback_action == "stop",
        )
        kept = tenant_sessions_kept(settings.effective_key_store(), settings.tenant, settings.private_tenants)
        with kept as trains_session:
            batcher = SampleBatcher(
                settings.batch_size,
                settings.max_staleness,
                point.consumed_offsets,
                point.trained_ids,
                holdout_share=settings.held_out(),
                run_id=settings.run_id,
                trains_session=trains_session,
            )
            async with log_.consumer(
                settings.group_id(), [topic_name(settings.namespace, "samples")]
            ) as consumer:
                stream = SampleStream(consumer, point.consumed_offsets)
                loop = TrainingLoop(
                    settings, log_, store, runner, point, metrics, flush, control, batcher, stream
                )
                return await loop.run()
    finally:
        gate.cancel()
        await asyncio.gather(gate, return_exceptions=True)


@dataclass
class TrainingLoop:
    """One run of the loop: its collaborators, and the version it is at."""

    settings: TrainSettings
    log_: EventLog
    store: ObjectStore
    runner: StepRunner
    point: ResumePoint
    metrics: Metrics
    flush: FlushRequest | None
    control: TrainerControl
    batcher: SampleBatcher
    stream: SampleStream
    version: int = -1  # set from `point`
    last_offsets: dict[TopicPartition, int] = field(default_factory=dict)  # the newest published version's
    idle_since: float = field(default_factory=time.monotonic)
    waiting_logged: bool = False
    finished: bool = False  # idle exit

    def __post_init__(self) -> None:
        self.version = self.point.version
        self.last_offsets = dict(self.point.consumed_offsets)

    async def run(self) -> int:
        steps = 0
        while not self.finished and (self.settings.max_steps == 0 or steps < self.settings.max_steps):
            restore = self.control.gate_restore(self.version)
            if restore is not None:
                await self.carry_out(restore)
            batch = await self.take_or_poll()
            if batch is None:
                continue
            restore = self.control.judged(batch.samples)
            if restore is not None:
                await self.carry_out(restore)
                if self.control.stop_after_rollback:
                    await stay_stopped(self.settings, self.version)
                    return steps
            await self.step(batch)
            steps += 1
        return steps

    async def take_or_poll(self) -> Batch | None:
        """The next batch if N effective samples are pending (or fewer, once the stream is quiet or a flush
        is requested); else one poll of the samples topic, and None."""
        settings, now = self.settings, time.monotonic()
        quiet = (
            bool(settings.partial_batch_after_s) and now - self.idle_since >= settings.partial_batch_after_s
        )
        waiting = self.control.waits_for_gate(self.version)
        if waiting and not self.waiting_logged:
            log.info(
                "at v%d, waiting for the promotion gate: the servers serve the promoted v%d, and "
                "training beyond v%d would make its samples stale",
                self.version, self.control.holds.promoted, self.version,
            )  # fmt: skip
        self.waiting_logged = waiting
        if not waiting:
            batch = self.batcher.take(self.version, partial=quiet)
            # A flush request: read to the end of the topic, then train whatever is pending.
            if batch is None and self.flush is not None and self.flush.requested and await self.drained():
                batch = self.batcher.take(self.version, partial=True)
                self.flush.clear()
            if batch is not None:
                return batch
        await self.runner.waiting()
        records = await self.stream.poll(POLL_MAX_RECORDS, settings.poll_timeout_s)
        self.batcher.add(records)
        if records:
            self.idle_since = time.monotonic()
            return None
        idle = bool(settings.idle_exit_s) and time.monotonic() - self.idle_since >= settings.idle_exit_s
        # not drained yet: a partition is not ours yet (a dead member's session is expiring)
        if idle and await self.drained():
            log.info("no new samples for %.0f s; exiting at version %d", settings.idle_exit_s, self.version)
            self.finished = True
        return None

    async def step(self, batch: Batch) -> None:
        """Loss, backward, optimizer step (the runner keeps the consumer heartbeating meanwhile); then
        publish: weights and manifest (the resume point), then the events, then the group offsets."""
        step = await self.runner.train(batch)
        if self.point.init_from is not None:  # every version of the run records where the run started
            step = StepResult({**step.metrics, "init_from": dict(self.point.init_from)})
        # The next version is above every published one, a refused newer checkpoint's too.
        parent_version, self.version = self.version, max(self.version, self.point.newest_version) + 1
        publish_started = time.perf_counter()
        manifest = await self.runner.publish(self.version, parent_version, batch, step)
        await append_step_events(
            self.log_, manifest, self.settings.namespace, folder_uri(self.store, manifest)
        )
        await self.stream.commit(batch.consumed_offsets)
        self.control.published(self.version, parent_version)
        self.last_offsets = dict(batch.consumed_offsets)
        count_step(self.metrics, self.version, batch, step)
        log_step(self.version, batch, step, time.perf_counter() - publish_started)

    async def carry_out(self, restore: Restore) -> None:
        """Republish the restored version's weights as the next version and train on from it."""
        replaced, settings = restore.replaced, self.settings
        new_version = await restore_version(
            settings, self.log_, self.store, self.runner, replaced.to_version, restore.manifest_note,
            self.version, self.point, self.last_offsets,
        )  # fmt: skip
        self.control.restored(restore, new_version)
        self.version = new_version
        if restore.by_gate:
            log.warning(
                "the promotion gate held v%d (%s); republished the promoted v%d's weights as v%d to train on",
                replaced.from_version, restore.gate_reason, replaced.to_version, new_version,
            )  # fmt: skip
            return
        log.warning(
            "rollback: v%d's approval %.2f is below its parent v%d's %.2f by more than %.2f over %d judged turns "
            "each; republished v%d's weights as v%d",
            replaced.from_version, replaced.from_approval, replaced.to_version, replaced.to_approval,
            settings.rollback_margin, settings.rollback_window, replaced.to_version, new_version,
        )  # fmt: skip
        await append_rollback_event(settings, self.log_, replaced, new_version)

    async def drained(self) -> bool:
        """Whether the stream has read the samples topic to its current end."""
        topic = topic_name(self.settings.namespace, "samples")
        ends = await self.log_.end_offsets(topic)
        return await self.stream.read_up_to({TopicPartition(topic, p): end for p, end in ends.items()})


async def rollback_watch(settings: TrainSettings, store: ObjectStore) -> RollbackWatch:
    """The rollback watch, with the run's recent published versions (it compares a version with its parent)."""
    watch = RollbackWatch(settings.rollback_window, settings.rollback_margin)
    if watch.window:
        for published, parent in await asyncio.to_thread(recent_lineage, store, settings.run_id):
            watch.published(published, parent)
    return watch


async def stay_stopped(settings: TrainSettings, version: int) -> None:
    """--rollback-action stop: train no more. Waits (forever, or --idle-exit-s) rather than exit, which
    `orl up` would answer with a restart."""
    log.error(
        "the run is stopped: v%d restored an earlier version's weights after a rollback and "
        "--rollback-action is stop; servers serve v%d. Start the trainer with --rollback-action restore "
        "to train on from it.",
        version,
        version,
    )
    if settings.idle_exit_s:
        await asyncio.sleep(settings.idle_exit_s)
        return
    await asyncio.Event().wait()
