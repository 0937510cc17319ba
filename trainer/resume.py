"""Where a (re)started trainer continues from, and the events that announce a published checkpoint.

Reads `checkpoints/<run>/...` (the newest complete manifest and its files) and the
`<namespace>.train_steps` / `<namespace>.checkpoints` topics; writes (re-emits) TrainStepCompleted
and CheckpointPublished there. A manifest is written before its events, so a crash between the two
leaves a published checkpoint nobody announced: on start the newest manifest's events are rebuilt
from the manifest alone (same deterministic ids, same payload, occurred_at = the manifest's
created_at, so byte-identical) and appended if the topics do not hold them yet. Only the newest can
be missing: a step starts only after the previous one's events were appended, or re-emitted here.

A run with no checkpoint starts at version 0 from the base model, or from another run's published
checkpoint (`--init-from <run>/<version>`, read from `checkpoints/<run>/<version>/`): downloaded and
verified like a resume, checked for the same kind and base model, and recorded as the run's
`init_from` lineage, which every manifest of the run carries on (`metrics["init_from"]`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from orl.connectors.checkpoint_store import (
    MANIFEST_NAME,
    CheckpointRejected,
    Manifest,
    clean_incomplete,
    complete_versions,
    download_and_verify,
    run_prefix,
    version_prefix,
)
from orl.connectors.event_log.base import EventLog, OutgoingRecord, TopicPartition
from orl.connectors.event_log.reading import reached
from orl.connectors.object_store.base import ObjectStore
from orl.schemas.codec import decode, encode
from orl.schemas.errors import ConfigError, EventDecodeError
from orl.schemas.event_constructors import checkpoint_published, policy_rejected, train_step_completed
from orl.schemas.event_types import CheckpointPublished, TrainStepCompleted
from orl.schemas.events import EventOrigin
from orl.schemas.sealing import PayloadForgotten
from orl.schemas.topics import topic_name
from orl.trainer.settings import parse_init_from

log = logging.getLogger(__name__)

PRODUCER = "trainer/0.1.0"


@dataclass(frozen=True)
class RefusedCheckpoint:
    """A published checkpoint the trainer could not resume from, and why (its files fail verification)."""

    version: int
    manifest_key: str
    uri: str
    reason: str


@dataclass(frozen=True)
class ResumePoint:
    """Version 0 at the beginning of the topic, or the newest verified manifest's version and offsets."""

    version: int = 0
    manifest: Manifest | None = None
    # verified local copy of the manifest's files (version 0: of the --init-from checkpoint, if any)
    checkpoint_dir: Path | None = None
    consumed_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    trained_ids: tuple[str, ...] = ()  # the newest step's sample ids (duplicate detection)
    init_from: Mapping[str, Any] | None = None  # the checkpoint the run started from (None: the base)
    # newer checkpoints that failed verification, newest first; the next step publishes above them all
    refused: tuple[RefusedCheckpoint, ...] = ()

    @property
    def newest_version(self) -> int:
        """The highest version published so far, refused ones included: a version number is never reused."""
        return max([self.version, *(r.version for r in self.refused)])


def find_resume_point(store: ObjectStore, run_id: str, samples_topic: str, work_dir: Path) -> ResumePoint:
    """Remove half-written checkpoints, then resume from the newest complete one that verifies (if any).

    A newer one that fails verification (a flipped byte, a lost file, a malformed manifest) is
    skipped with a warning and listed in `refused`; the run continues from the one before it, and its
    next step publishes above the refused version, so no version number is reused.
    """
    removed = clean_incomplete(store, run_id)
    if removed:
        log.warning("run %s: removed incomplete checkpoint versions %s", run_id, removed)
    refused: list[RefusedCheckpoint] = []
    for version in reversed(complete_versions(store, run_id)):
        manifest_key = version_prefix(run_id, version) + MANIFEST_NAME
        local = work_dir / f"resume-{version:08d}"
        try:
            manifest = download_and_verify(store, manifest_key, local)
        except CheckpointRejected as error:
            log.warning("run %s: cannot resume from v%d (%s); trying the one before", run_id, version, error)
            uri = store.uri(manifest_key).rsplit("/", 1)[0] + "/"
            refused.append(RefusedCheckpoint(version, manifest_key, uri, str(error)))
            continue
        offsets = {
            TopicPartition(o.topic, o.partition): o.offset
            for o in manifest.consumed_offsets
            if o.topic == samples_topic
        }
        log.info("run %s: resuming at version %d from offsets %s", run_id, manifest.version, offsets)
        ids = tuple(str(i) for i in manifest.metrics.get("sample_ids") or ())
        init_from = manifest.metrics.get("init_from")
        return ResumePoint(manifest.version, manifest, local, offsets, ids, init_from, tuple(refused))
    if refused:
        log.warning("run %s: no checkpoint verifies; starting again from version 0", run_id)
    else:
        log.info("run %s: no checkpoint yet; starting at version 0", run_id)
    return ResumePoint(refused=tuple(refused))


def _init_manifest(store: ObjectStore, spec: str) -> Manifest:
    """The manifest `--init-from spec` names; ConfigError listing the published versions if none."""
    run_id, wanted = parse_init_from(spec)
    versions = complete_versions(store, run_id)
    version = versions[-1] if wanted is None and versions else wanted
    if version is None or version not in versions:
        folder = store.uri(run_prefix(run_id) + MANIFEST_NAME).rsplit("/", 1)[0] + "/"
        name = f"{run_id}/latest" if version is None else f"{run_id}/{version:08d}"
        listed = ", ".join(f"{run_id}/{v:08d}" for v in versions) or "none"
        raise ConfigError(
            f"--init-from {spec}: no checkpoint {name} in {folder}: published versions are {listed}"
        )
    key = version_prefix(run_id, version) + MANIFEST_NAME
    try:
        return Manifest.from_json(store.get(key))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--init-from {spec}: checkpoint {key} has a malformed manifest: {exc!r}") from exc


def find_init_point(store: ObjectStore, spec: str, kind: str, base_model: str, work_dir: Path) -> ResumePoint:
    """Version 0 of a new run, starting from the published checkpoint `spec` (`--init-from`), verified.

    ConfigError naming the flag for an unknown run or version, another kind or base model, or a
    checkpoint that fails verification (the same checks serving makes before loading one).
    """
    manifest = _init_manifest(store, spec)
    name = f"{manifest.run_id}/{manifest.version:08d}"
    if manifest.kind != kind:
        raise ConfigError(
            f"--init-from {spec}: {name} is a {manifest.kind} checkpoint and this run trains --kind {kind}: "
            f"pass --kind {manifest.kind} or a {kind} checkpoint"
        )
    if manifest.base_model != base_model:
        raise ConfigError(
            f"--init-from {spec}: {name} was trained from --model {manifest.base_model!r}, not "
            f"{base_model!r}: pass that model or a checkpoint of this one"
        )
    local = work_dir / f"init-{manifest.run_id}-{manifest.version:08d}"
    try:
        download_and_verify(store, manifest.manifest_key, local, manifest.sha256, trainer_state=False)
    except CheckpointRejected as exc:
        raise ConfigError(f"--init-from {spec}: {exc}") from exc
    lineage = {
        "run_id": manifest.run_id,
        "version": manifest.version,
        "manifest_key": manifest.manifest_key,
        "manifest_sha256": manifest.sha256,
    }
    return ResumePoint(checkpoint_dir=local, init_from=lineage)


def _created_at_ms(manifest: Manifest) -> int:
    return int(datetime.fromisoformat(manifest.created_at).timestamp() * 1000)


def _number(metrics: Mapping[str, Any], name: str) -> float:
    value = metrics.get(name)
    return float("nan") if value is None else float(value)


def step_events(
    manifest: Manifest, namespace: str, uri: str
) -> list[tuple[str, TrainStepCompleted | CheckpointPublished]]:
    """(topic, event) of TrainStepCompleted and CheckpointPublished, rebuilt from the manifest alone."""
    m = manifest.metrics

    def origin(*id_parts: object) -> EventOrigin:
        return EventOrigin(
            namespace=namespace, producer=PRODUCER, occurred_at_ms=_created_at_ms(manifest), id_parts=id_parts
        )

    step = train_step_completed(
        origin(manifest.run_id, manifest.version),
        run_id=manifest.run_id,
        step=int(m.get("step", manifest.version)),
        policy_version=manifest.version,
        sample_ids=[str(i) for i in m.get("sample_ids", [])],
        loss=_number(m, "loss"),
        pg_loss=_number(m, "pg_loss"),
        kl=_number(m, "kl"),
        clip_fraction=_number(m, "clip_fraction"),
        grad_norm=_number(m, "grad_norm"),
        tokens=int(m.get("tokens", 0)),
        duration_s=_number(m, "duration_s"),
        tokens_per_s=_number(m, "tokens_per_s"),
        dropped_stale=int(m.get("dropped_stale", 0)),
        mean_staleness=_number(m, "mean_staleness"),
    )
    published = checkpoint_published(
        origin(manifest.run_id, manifest.version, manifest.sha256),
        run_id=manifest.run_id,
        version=manifest.version,
        parent_version=manifest.parent_version,
        kind=manifest.kind,
        uri=uri,
        manifest_key=manifest.manifest_key,
        manifest_sha256=manifest.sha256,
        base_model=manifest.base_model,
        consumed_offsets=[
            {"topic": o.topic, "partition": o.partition, "offset": o.offset}
            for o in manifest.consumed_offsets
        ],
        sample_id_digest=manifest.sample_id_digest,
    )
    return [(topic_name(namespace, "train_steps"), step), (topic_name(namespace, "checkpoints"), published)]


async def append_step_events(log_: EventLog, manifest: Manifest, namespace: str, uri: str) -> None:
    """Append the step's two events, keyed by run id (one partition: a run's steps stay in order)."""
    key = manifest.run_id.encode()
    for topic, event in step_events(manifest, namespace, uri):
        await log_.append(topic, OutgoingRecord(value=encode(event), key=key))


async def _event_ids(log_: EventLog, topic: str) -> set[str]:
    """Every event id on a topic, read from the beginning by a throwaway group (nothing committed)."""
    ends = await log_.end_offsets(topic)
    ids: set[str] = set()
    if not any(ends.values()):
        return ids
    async with log_.consumer(f"trainer-scan-{uuid.uuid4().hex}", [topic]) as consumer:
        await consumer.seek_to_beginning()
        topic_partitions = sorted(await consumer.assignment())
        while not await reached(consumer, topic_partitions, ends):
            for record in await consumer.poll(max_records=5000, timeout_s=1.0):
                try:
                    ids.add(str(decode(record.value)["envelope"]["event_id"]))
                except PayloadForgotten as forgotten:  # its id is in the clear envelope
                    ids.add(str(forgotten.envelope["event_id"]))  # type: ignore[index]
                except EventDecodeError:
                    continue  # not ours to judge here; its consumers dead-letter it
    return ids


TRAINER_CONSUMER_ID = "trainer"  # the PolicyRejected `server_id` of a refusal by the trainer's resume


async def record_refusals(log_: EventLog, point: ResumePoint, namespace: str, run_id: str) -> int:
    """A PolicyRejected (server_id "trainer") per checkpoint the resume refused, unless already on the log.

    The same refusal after another restart has the same event id, so it is recorded once.
    """
    topic = topic_name(namespace, "policy_activations")
    known = await _event_ids(log_, topic) if point.refused else set()
    appended = 0
    for refused in point.refused:
        origin = EventOrigin(
            namespace=namespace,
            producer=PRODUCER,
            occurred_at_ms=int(time.time() * 1000),
            id_parts=(TRAINER_CONSUMER_ID, run_id, refused.version, refused.reason),
        )
        event = policy_rejected(
            origin,
            server_id=TRAINER_CONSUMER_ID,
            run_id=run_id,
            version=refused.version,
            uri=refused.uri,
            reason=refused.reason,
        )
        if event["envelope"]["event_id"] in known:
            continue
        await log_.append(topic, OutgoingRecord(value=encode(event), key=run_id.encode()))
        appended += 1
    return appended


async def reemit_missing_events(log_: EventLog, manifest: Manifest, namespace: str, uri: str) -> int:
    """Append whichever of the manifest's two events the topics lack; returns how many were appended."""
    appended = 0
    for topic, event in step_events(manifest, namespace, uri):
        if event["envelope"]["event_id"] in await _event_ids(log_, topic):
            continue
        await log_.append(topic, OutgoingRecord(value=encode(event), key=manifest.run_id.encode()))
        log.warning("re-emitted %s %s for v%d", event["envelope"]["event_type"], topic, manifest.version)
        appended += 1
    return appended
