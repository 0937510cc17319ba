"""Publishing and restoring the trainer's versions: checkpoints, resume, the optimizer's state.

Reads `checkpoints/<run>/` (to resume or restore a version) and `<namespace>.samples` (the resume
point's offsets). Writes `checkpoints/<run>/<version:08d>/` (weights, then the manifest last), and on
the log TrainStepCompleted, CheckpointPublished (`orl.trainer.resume`) and PolicyRolledBack.
"""

from __future__ import annotations

import asyncio
import io
import logging
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch
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
from orl.connectors.object_store.base import ObjectStore
from orl.schemas.codec import encode
from orl.schemas.errors import CheckpointError, ConfigError
from orl.schemas.event_constructors import policy_rolled_back
from orl.schemas.events import EventOrigin
from orl.schemas.topics import topic_name
from orl.trainer.batching import Batch
from orl.trainer.resume import (
    PRODUCER,
    ResumePoint,
    append_step_events,
    find_init_point,
    find_resume_point,
    record_refusals,
    reemit_missing_events,
)
from orl.trainer.rollback import Rollback
from orl.trainer.settings import TrainSettings
from orl.trainer.steps import StepResult, StepRunner

log = logging.getLogger(__name__)


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


async def append_rollback_event(
    settings: TrainSettings, log_: EventLog, rollback: Rollback, new_version: int
) -> None:
    """PolicyRolledBack on `checkpoints`: `rollback` was carried out as `new_version`, with the figures."""
    origin = EventOrigin(
        namespace=settings.namespace,
        producer=PRODUCER,
        occurred_at_ms=int(time.time() * 1000),
        id_parts=(settings.run_id, rollback.from_version, new_version),
    )
    event = policy_rolled_back(
        origin,
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
