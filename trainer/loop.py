"""The training loop of `orl train`: consume, batch, loss, step, publish.

Reads `<namespace>.samples` (SampleReady / SampleRejected) and `checkpoints/<run>/` (to resume).
Writes `checkpoints/<run>/<version:08d>/` (weights, then the manifest last), then one
TrainStepCompleted on `<namespace>.train_steps` and one CheckpointPublished on
`<namespace>.checkpoints` per step, then commits the group's offsets (informational).

Exactly-once training without transactions: the manifest of version v records, per partition, the
offset after the last record its step covered. A restarted trainer loads the newest manifest's
weights and reads on from exactly those offsets (`orl.trainer.sample_stream`), so a kill -9 anywhere
(before, during or after a checkpoint write) neither repeats nor skips a sample; a half-uploaded
version has no manifest and is deleted on start; events missing after a crash between the manifest
and the append are re-emitted from the manifest (`orl.trainer.resume`). One trainer process per run.
The torch backend checkpoints AdamW's state too (`trainer_state/optimizer.pt`), so a resumed run
takes the same steps as an uninterrupted one; the megatron backend's moments start from zero after
a restart (weights and data position are exact). A run with no checkpoint starts from the base model, or from another run's
checkpoint with `--init-from` (`orl.trainer.resume.find_init_point`); its manifests record that start.

The loop itself (`consume_and_train`) is the same for every backend: a `StepRunner` takes and
publishes one step (`TorchStepRunner` here; `orl.trainer.megatron_backend.loop` runs it across a torchrun
job), so batching, resume and the events cannot drift apart between backends.
"""

from __future__ import annotations

import asyncio
import io
import logging
import math
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from orl.compute.machine import CoreBoard, available_cores, resolved_numerics
from orl.connectors.checkpoint_store import (
    MANIFEST_NAME,
    TRAINER_STATE_DIR,
    Manifest,
    complete_versions,
    download_and_verify,
    publish_checkpoint,
    read_manifest,
    version_prefix,
)
from orl.connectors.event_log.base import EventLog, OutgoingRecord, TopicPartition
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.metrics import Metrics
from orl.connectors.object_store.base import ObjectStore
from orl.rules.gate_decisions import GateDecisions
from orl.schemas.codec import encode
from orl.schemas.errors import CheckpointError, ConfigError, OrlError
from orl.schemas.events import make_event
from orl.schemas.topics import topic_name
from orl.trainer.batch_loss import LossConfig, batch_loss
from orl.trainer.batching import Batch, SampleBatcher
from orl.trainer.core_sharing import fit_threads_every_layer
from orl.trainer.flush_request import FlushRequest
from orl.trainer.gate_holds import ahead_of_gate, follow_gate, restore_for
from orl.trainer.policy_model import LoraSettings, PolicyKind, PolicyModel, load_policy
from orl.trainer.resume import (
    PRODUCER,
    ResumePoint,
    append_step_events,
    find_init_point,
    find_resume_point,
    record_refusals,
    reemit_missing_events,
)
from orl.trainer.rollback import Rollback, RollbackWatch
from orl.trainer.sample_stream import SampleStream
from orl.trainer.settings import TrainSettings

log = logging.getLogger(__name__)
GATE_CATCH_UP_S = 10.0  # at start, how long to wait for the gate's decisions so far (trainer/gate_holds.py)

OPTIMIZER_STATE = "optimizer.pt"  # the torch backend's file under TRAINER_STATE_DIR

POLL_MAX_RECORDS = 256


class TrainingError(OrlError):
    """A step could not be taken (non-finite loss or gradient): not applied, the worker stops loudly.

    Raised by every backend's step (torch here, `orl.trainer.megatron_backend.step`)."""


@dataclass(frozen=True)
class StepResult:
    metrics: dict[str, Any]  # what the manifest and TrainStepCompleted record about the step


def loss_config(settings: TrainSettings, device: str = "cpu") -> LossConfig:
    """The loss settings; `precision` auto becomes the machine's choice for `device` (logged once)."""
    return LossConfig(
        beta_kl=settings.beta_kl,
        kl_estimator=settings.kl_estimator,
        eps_low=settings.eps_low,
        eps_high=settings.eps_high,
        w_opd=settings.w_opd,
        w_rl=settings.w_rl,
        center_rewards=settings.center_rewards,
        prompt_baseline=settings.prompt_baseline,
        opd_anchor=settings.opd_anchor,
        old_logprobs=settings.old_logprobs,
        autocast=resolved_numerics(settings.precision, device).autocast,
        train_temperature=settings.train_temperature,
        opd_loss=settings.opd_loss,
        loss_reduction=settings.loss_reduction,
        opd_advantage_clip=settings.opd_advantage_clip,
    )


def train_step(
    policy: PolicyModel, optimizer: torch.optim.Optimizer, batch: Batch, settings: TrainSettings
) -> StepResult:
    """Loss, backward, clip, AdamW step on one batch (synchronous: the loop runs it in a thread)."""
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    result = batch_loss(policy, batch.samples, loss_config(settings))
    if not math.isfinite(result.stats.loss):
        raise TrainingError(f"non-finite loss {result.stats.loss} on samples {batch.sample_ids}")
    result.loss.backward()
    max_norm = settings.grad_clip if settings.grad_clip > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), max_norm))
    if not math.isfinite(grad_norm):
        raise TrainingError(f"non-finite gradient norm on samples {batch.sample_ids}")
    optimizer.step()
    duration_s = time.perf_counter() - started
    stats = {
        **asdict(result.stats),
        "opd_advantage_mean": result.opd_advantage_mean,
        "distill_kl": result.distill_kl,
        "reward_mean": result.reward_mean,
    }
    return StepResult(step_metrics(batch, stats, grad_norm, duration_s, optimizer.param_groups[0]["lr"]))


def step_metrics(
    batch: Batch, stats: Mapping[str, float], grad_norm: float, duration_s: float, lr: float
) -> dict[str, Any]:
    """What the manifest and TrainStepCompleted record about a step: the same keys for every backend.

    `stats` holds the whole batch's loss, pg_loss, kl, clip_fraction, advantage_mean,
    opd_advantage_mean, distill_kl (top-K distillation: mean KL(student || teacher) per distilled token, nan
    when none), reward_mean and tokens.
    """
    tokens = int(stats["tokens"])
    return {
        "sample_ids": batch.sample_ids,
        "loss": stats["loss"],
        "pg_loss": stats["pg_loss"],
        "kl": stats["kl"],
        "clip_fraction": stats["clip_fraction"],
        "advantage_mean": stats["advantage_mean"],
        "opd_advantage_mean": stats["opd_advantage_mean"],
        "distill_kl": stats["distill_kl"],
        "reward_mean": stats["reward_mean"],
        "grad_norm": grad_norm,
        "tokens": tokens,
        "duration_s": duration_s,
        "tokens_per_s": tokens / duration_s if duration_s > 0 else 0.0,
        "dropped_stale": batch.skipped.get("stale", 0),
        "mean_staleness": batch.mean_staleness,
        "skipped": batch.skipped,
        "methods": dict(sorted(Counter(s.method for s in batch.samples).items())),
        "lr": lr,
    }


class Checkpointable(Protocol):
    """What `publish_step` saves: a PolicyModel, or the megatron backend's gathered weights."""

    @property
    def kind(self) -> str: ...

    def save(self, out_dir: Path) -> list[Path]: ...


def publish_step(
    store: ObjectStore,
    settings: TrainSettings,
    policy: Checkpointable,
    version: int,
    parent_version: int,
    batch: Batch,
    step: StepResult,
    work_dir: Path,
    trainer_state: Mapping[str, bytes] | None = None,
) -> Manifest:
    """Save the policy to a temp folder and publish it as `version`, trained from `parent_version` (0: the
    base model), files first, manifest last. `trainer_state` (file name -> bytes, the optimizer's
    state) goes along under TRAINER_STATE_DIR, so a resume continues exactly."""
    with tempfile.TemporaryDirectory(prefix=f"v{version:08d}-", dir=work_dir) as tmp:
        policy.save(Path(tmp))
        for name, data in (trainer_state or {}).items():
            state_file = Path(tmp) / TRAINER_STATE_DIR / name
            state_file.parent.mkdir(exist_ok=True)
            state_file.write_bytes(data)
        return publish_checkpoint(
            store,
            settings.run_id,
            version,
            Path(tmp),
            parent_version=parent_version,
            kind=policy.kind,
            base_model=settings.model,
            consumed_offsets=[
                {"topic": tp.topic, "partition": tp.partition, "offset": offset}
                for tp, offset in sorted(batch.consumed_offsets.items())
            ],
            sample_ids=batch.sample_ids,
            metrics={"step": version, **step.metrics},
        )


def folder_uri(store: ObjectStore, manifest: Manifest) -> str:
    """The URI of the checkpoint's folder (keys cannot end in '/', so derived from the manifest's)."""
    return store.uri(manifest.manifest_key).rsplit("/", 1)[0] + "/"


def check_resumable(settings: TrainSettings, point: ResumePoint) -> None:
    """ConfigError unless the run's newest checkpoint has this kind and base model."""
    if point.manifest is None:
        return
    if point.manifest.kind != settings.kind:
        raise ConfigError(
            f"run {settings.run_id!r} trains kind {point.manifest.kind!r}: pass --kind "
            f"{point.manifest.kind} or a new --run-id"
        )
    if point.manifest.base_model != settings.model:
        raise ConfigError(
            f"run {settings.run_id!r} was trained from --model {point.manifest.base_model!r}, "
            f"not {settings.model!r}: pass that model or a new --run-id"
        )


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> bytes:
    """The optimizer's state_dict as torch.save writes it (tensors and numbers: loads with weights_only)."""
    buffer = io.BytesIO()
    torch.save(optimizer.state_dict(), buffer)
    return buffer.getvalue()


def restore_optimizer(optimizer: torch.optim.Optimizer, checkpoint_dir: Path | None, name: str) -> bool:
    """Load `checkpoint_dir`'s TRAINER_STATE_DIR/`name` into `optimizer`; False if there is none.

    A checkpoint written before optimizer states were saved has none (nor does a run's start from
    another run's checkpoint, `--init-from`): the moments then start from zero, which is logged.
    """
    if checkpoint_dir is None:
        return False
    state_file = checkpoint_dir / TRAINER_STATE_DIR / name
    if not state_file.is_file():
        log.warning("%s has no %s: AdamW's moments start from zero", checkpoint_dir, name)
        return False
    optimizer.load_state_dict(torch.load(state_file, weights_only=True))
    log.info("optimizer state restored from %s", state_file)
    return True


def load_resumed_policy(settings: TrainSettings, model_dir: Path, point: ResumePoint) -> PolicyModel:
    check_resumable(settings, point)
    lora = LoraSettings(r=settings.lora_r, alpha=settings.lora_alpha)
    kind: PolicyKind = "full" if settings.kind == "full" else "lora"
    return load_policy(model_dir, kind, lora=lora, init_dir=point.checkpoint_dir)


def log_step(version: int, batch: Batch, step: StepResult, publish_s: float) -> None:
    m = step.metrics
    log.info(
        "step v%d: loss %.4f (pg %.4f) reward %.3f kl %.4f clip %.3f grad %.3f | %d samples %d tokens "
        "%.2f s %.0f tok/s | staleness %.2f dropped %s | publish %.2f s",
        version,
        m["loss"],
        m["pg_loss"],
        m["reward_mean"],
        m["kl"],
        m["clip_fraction"],
        m["grad_norm"],
        len(batch.samples),
        m["tokens"],
        m["duration_s"],
        m["tokens_per_s"],
        m["mean_staleness"],
        batch.skipped or "none",
        publish_s,
    )


def count_step(metrics: Metrics, version: int, batch: Batch, step: StepResult) -> None:
    for reason, count in batch.skipped.items():
        metrics.count("samples_skipped", count, reason=reason)
    metrics.count("samples_trained", len(batch.samples))
    metrics.count("tokens_trained", step.metrics["tokens"])
    metrics.set("policy_version", version)
    metrics.observe("step_duration_s", step.metrics["duration_s"])


async def drained(log_: EventLog, stream: SampleStream, topic: str) -> bool:
    ends = await log_.end_offsets(topic)
    return await stream.read_up_to({TopicPartition(topic, p): end for p, end in ends.items()})


async def create_trainer_topics(log_: EventLog, namespace: str, partitions: int) -> None:
    topics = ("samples", "train_steps", "checkpoints", "policy_activations")
    await create_catalog_topics(log_, namespace, partitions, topics)


async def prepare_resume(
    settings: TrainSettings, log_: EventLog, store: ObjectStore, work_dir: Path
) -> ResumePoint:
    """Create the topics, find the newest checkpoint that verifies, re-emit its events if they are missing.

    Newer checkpoints that fail verification are skipped and recorded as PolicyRejected (server_id
    "trainer"), with the reason.

    A run without one starts at version 0: from the base model, or from the `--init-from` checkpoint.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    await create_trainer_topics(log_, settings.namespace, settings.topic_partitions)
    samples_topic = topic_name(settings.namespace, "samples")
    point = await asyncio.to_thread(find_resume_point, store, settings.run_id, samples_topic, work_dir)
    await record_refusals(log_, point, settings.namespace, settings.run_id)
    if point.manifest is not None:
        await reemit_missing_events(
            log_, point.manifest, settings.namespace, folder_uri(store, point.manifest)
        )
        if settings.init_from:
            log.warning(
                "run %s already has checkpoints (newest v%d): --init-from %s is ignored (a start point, "
                "not an override)",
                settings.run_id,
                point.version,
                settings.init_from,
            )
    elif settings.init_from:
        point = await asyncio.to_thread(
            find_init_point, store, settings.init_from, settings.kind, settings.model, work_dir
        )
        start = (point.init_from or {}).get("manifest_key")
        log.info(
            "run %s starts from %s (--init-from %s), not --model", settings.run_id, start, settings.init_from
        )
    return point


def recent_lineage(store: ObjectStore, run_id: str, count: int = 16) -> list[tuple[int, int]]:
    """(version, parent) of the run's newest `count` published versions, oldest first (unreadable ones left out)."""
    lineage = []
    for version in complete_versions(store, run_id)[-count:]:
        try:
            manifest = read_manifest(store, version_prefix(run_id, version) + MANIFEST_NAME)
        except CheckpointError:
            continue
        lineage.append((version, manifest.parent_version or 0))
    return lineage


async def restore_version(
    settings: TrainSettings,
    log_: EventLog,
    store: ObjectStore,
    runner: StepRunner,
    to_version: int,
    metrics: Mapping[str, Any],
    version: int,
    point: ResumePoint,
    offsets: Mapping[TopicPartition, int],
) -> int:
    """Republish `to_version`'s weights (0: the base model's) as the next version and continue from them;
    returns it. The restored version covers no new sample (its offsets are the newest published
    version's), so a restart resumes where the trainer was. Appends its TrainStepCompleted and
    CheckpointPublished; `metrics` go into its manifest (why it was restored)."""
    if to_version > 0:
        key = version_prefix(settings.run_id, to_version) + MANIFEST_NAME
        with tempfile.TemporaryDirectory(prefix=f"restore-{to_version:08d}-") as folder:
            await asyncio.to_thread(download_and_verify, store, key, Path(folder))
            await runner.restore(Path(folder))  # loads into memory: the folder may go
    else:
        await runner.restore(None)
    new_version = max(version, point.newest_version) + 1
    empty = Batch((), dict(offsets), {}, ())
    manifest = await runner.publish(new_version, to_version, empty, StepResult(dict(metrics)))
    await append_step_events(log_, manifest, settings.namespace, folder_uri(store, manifest))
    return new_version


async def roll_back(
    settings: TrainSettings,
    log_: EventLog,
    store: ObjectStore,
    runner: StepRunner,
    rollback: Rollback,
    version: int,
    point: ResumePoint,
    offsets: Mapping[TopicPartition, int],
) -> int:
    """`restore_version` of the rolled-back version's parent, then PolicyRolledBack with the figures."""
    restored = {"rollback_of": rollback.from_version, "restored": rollback.to_version}
    new_version = await restore_version(
        settings, log_, store, runner, rollback.to_version, restored, version, point, offsets
    )
    log.warning(
        "rollback: v%d's approval %.2f is below its parent v%d's %.2f by more than %.2f over %d judged turns "
        "each; republished v%d's weights as v%d",
        rollback.from_version, rollback.from_approval, rollback.to_version, rollback.to_approval,
        settings.rollback_margin, settings.rollback_window, rollback.to_version, new_version,
    )  # fmt: skip
    event = make_event(
        "PolicyRolledBack",
        id_parts=[settings.run_id, rollback.from_version, new_version],
        namespace=settings.namespace,
        producer=PRODUCER,
        occurred_at_ms=int(time.time() * 1000),
        run_id=settings.run_id,
        from_version=rollback.from_version,
        to_version=rollback.to_version,
        new_version=new_version,
        window=settings.rollback_window,
        margin=settings.rollback_margin,
        from_approval=rollback.from_approval,
        to_approval=rollback.to_approval,
    )
    topic = topic_name(settings.namespace, "checkpoints")
    await log_.append(topic, OutgoingRecord(value=encode(event), key=settings.run_id.encode()))
    return new_version


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


class StepRunner(Protocol):
    """How a backend takes one step and publishes it; `consume_and_train` does everything else."""

    async def train(self, batch: Batch) -> StepResult: ...

    async def publish(
        self, version: int, parent_version: int, batch: Batch, step: StepResult
    ) -> Manifest: ...

    async def restore(self, checkpoint_dir: Path | None) -> None:
        """Continue from a published version's weights and optimizer state (None: the base model)."""

    async def waiting(self) -> None:
        """Called on every loop turn without a batch (megatron: keeps the other ranks' collective alive)."""


@dataclass
class TorchStepRunner:
    """The torch backend: one process; each step and publish in a thread (the consumer keeps heartbeating).

    The process is marked busy on the core board while a step computes, so a server on the same
    machine gives it a fair share of the cores; hooks on the policy's layers (`orl.trainer.core_sharing`)
    re-fit the step's threads as the server starts or stops computing."""

    settings: TrainSettings
    store: ObjectStore
    policy: PolicyModel
    optimizer: torch.optim.Optimizer
    work_dir: Path
    board: CoreBoard

    async def train(self, batch: Batch) -> StepResult:
        self.board.busy()
        changes = self.board.thread_changes
        try:
            return await asyncio.to_thread(train_step, self.policy, self.optimizer, batch, self.settings)
        finally:
            self.board.idle()
            log.info(
                "core board: threads re-fitted %d times during the step",
                self.board.thread_changes - changes,
            )

    async def publish(self, version: int, parent_version: int, batch: Batch, step: StepResult) -> Manifest:
        return await asyncio.to_thread(
            publish_step,
            self.store,
            self.settings,
            self.policy,
            version,
            parent_version,
            batch,
            step,
            self.work_dir,
            {OPTIMIZER_STATE: optimizer_state_bytes(self.optimizer)},
        )

    async def restore(self, checkpoint_dir: Path | None) -> None:
        policy = await asyncio.to_thread(
            load_policy,
            self.policy.base_dir,
            self.policy.kind,
            lora=LoraSettings(r=self.settings.lora_r, alpha=self.settings.lora_alpha),
            init_dir=checkpoint_dir,
        )
        optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=self.settings.effective_lr(),
            betas=(0.9, 0.999),
            weight_decay=0.0,
        )
        restore_optimizer(optimizer, checkpoint_dir, OPTIMIZER_STATE)
        fit_threads_every_layer(policy.module, self.board)
        self.policy, self.optimizer = policy, optimizer

    async def waiting(self) -> None:
        return None


async def run_trainer(
    settings: TrainSettings,
    log_: EventLog,
    store: ObjectStore,
    model_dir: Path,
    work_dir: Path,
    metrics: Metrics | None = None,
) -> int:
    """Train until `max_steps` (or idle exit); returns the number of steps this call took."""
    flush = FlushRequest()
    flush.listen_for_sigusr1()  # first: before this, SIGUSR1 would end the process
    # Resume: newest complete checkpoint (weights, version, offsets), or the base model at version 0.
    point = await prepare_resume(settings, log_, store, work_dir)
    torch.manual_seed(settings.seed)
    policy = await asyncio.to_thread(load_resumed_policy, settings, model_dir, point)
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=settings.effective_lr(), betas=(0.9, 0.999), weight_decay=0.0
    )
    if point.manifest is not None:  # a resume (not a start from --init-from)
        restore_optimizer(optimizer, point.checkpoint_dir, OPTIMIZER_STATE)
    board = CoreBoard(settings.data_dir / "cores", settings.threads or available_cores())
    fit_threads_every_layer(policy.module, board)
    log.info(
        "trainer computes in %s with %d threads alone, a fair share while other torch processes of %s compute",
        resolved_numerics(settings.precision).precision,
        board.cores,
        settings.data_dir,
    )
    runner = TorchStepRunner(settings, store, policy, optimizer, work_dir, board)
    return await consume_and_train(settings, log_, store, runner, point, metrics or Metrics(), flush)


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
    samples_topic = topic_name(settings.namespace, "samples")
    version = point.version
    last_offsets = dict(point.consumed_offsets)  # the newest published version's resume position
    watch = RollbackWatch(settings.rollback_window, settings.rollback_margin)
    if watch.window:
        for published, parent in await asyncio.to_thread(recent_lineage, store, settings.run_id):
            watch.published(published, parent)
    batcher = SampleBatcher(
        settings.batch_size,
        settings.max_staleness,
        point.consumed_offsets,
        point.trained_ids,
        holdout_share=settings.holdout_share,
    )
    steps = 0
    if (
        settings.rollback_action == "stop"
        and point.manifest is not None
        and "rollback_of" in point.manifest.metrics
    ):
        await stay_stopped(settings, point.version)  # the run stopped at a rollback before this restart
        return steps
    holds, caught_up = GateDecisions(settings.run_id), asyncio.Event()
    gate = asyncio.create_task(
        follow_gate(log_, topic_name(settings.namespace, "checkpoints"), holds, caught_up)
    )
    try:
        await asyncio.wait_for(caught_up.wait(), GATE_CATCH_UP_S)
    except TimeoutError:
        log.warning("the promotion gate's decisions were not read within %.0f s; going on", GATE_CATCH_UP_S)
    try:
        async with log_.consumer(settings.group_id(), [samples_topic]) as consumer:
            stream = SampleStream(consumer, point.consumed_offsets)
            idle_since = time.monotonic()
            logged_wait = False
            while settings.max_steps == 0 or steps < settings.max_steps:
                promoted = restore_for(holds, version) if settings.backend == "torch" else None
                if promoted is not None:  # see trainer/gate_holds.py
                    held = version
                    restored = {"held_by_gate": held, "restored": promoted}
                    version = await restore_version(
                        settings, log_, store, runner, promoted, restored, version, point, last_offsets
                    )
                    watch.rolled_back(Rollback(held, promoted, 0.0, 0.0), version)
                    log.warning(
                        "the promotion gate held v%d (%s); republished the promoted v%d's weights as v%d to train on",
                        held, holds.held[held], promoted, version,
                    )  # fmt: skip
                # Consume until N effective samples are pending (or fewer, once the stream is quiet).
                quiet = bool(settings.partial_batch_after_s) and (
                    time.monotonic() - idle_since >= settings.partial_batch_after_s
                )
                waiting = settings.follow_promoted and ahead_of_gate(
                    version, holds.promoted, settings.max_staleness
                )
                if waiting and not logged_wait:
                    log.info(
                        "at v%d, waiting for the promotion gate: the servers serve the promoted v%d, and "
                        "training beyond v%d would make its samples stale",
                        version, holds.promoted, version,
                    )  # fmt: skip
                logged_wait = waiting
                batch = None if waiting else batcher.take(version, partial=quiet)
                # A flush request: read to the end of the topic, then train whatever is pending.
                if (
                    not waiting
                    and batch is None
                    and flush is not None
                    and flush.requested
                    and await drained(log_, stream, samples_topic)
                ):
                    batch = batcher.take(version, partial=True)
                    flush.clear()
                if batch is None:
                    await runner.waiting()
                    records = await stream.poll(POLL_MAX_RECORDS, settings.poll_timeout_s)
                    batcher.add(records)
                    if records:
                        idle_since = time.monotonic()
                    elif settings.idle_exit_s and time.monotonic() - idle_since >= settings.idle_exit_s:
                        if not await drained(log_, stream, samples_topic):
                            continue  # a partition is not ours yet (a dead member's session is expiring)
                        log.info(
                            "no new samples for %.0f s; exiting at version %d", settings.idle_exit_s, version
                        )
                        break
                    continue

                for sample in batch.samples:
                    watch.judged(sample.policy_version, sample.reward, sample.promoted)
                rollback = watch.check()
                if rollback is not None:
                    version = await roll_back(
                        settings, log_, store, runner, rollback, version, point, last_offsets
                    )
                    watch.rolled_back(rollback, version)
                    if settings.rollback_action == "stop":
                        await stay_stopped(settings, version)
                        return steps

                # Loss, backward, optimizer step (the runner keeps the consumer heartbeating meanwhile).
                step = await runner.train(batch)
                if point.init_from is not None:  # every version of the run records where the run started
                    step = StepResult({**step.metrics, "init_from": dict(point.init_from)})
                # The next version is above every published one, a refused newer checkpoint's too.
                parent_version, version = version, max(version, point.newest_version) + 1

                # Publish: weights and manifest (the resume point), then the events, then the group offsets.
                publish_started = time.perf_counter()
                manifest = await runner.publish(version, parent_version, batch, step)
                await append_step_events(log_, manifest, settings.namespace, folder_uri(store, manifest))
                await stream.commit(batch.consumed_offsets)
                watch.published(version, parent_version)
                last_offsets = dict(batch.consumed_offsets)

                steps += 1
                count_step(metrics, version, batch, step)
                log_step(version, batch, step, time.perf_counter() - publish_started)
        return steps
    finally:
        gate.cancel()
        await asyncio.gather(gate, return_exceptions=True)
