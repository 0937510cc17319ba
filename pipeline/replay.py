"""Replay: re-run the pipeline over recorded history into a NEW namespace (history is never overwritten).

Sources: a namespace on the log, the same namespace from the archive (pipeline/archive.py), or
events imported from OpenClaw-RL's JSONL files (pipeline/openclaw_import.py).

Modes:
- `reuse`: the recorded requests, responses, next states, session ends, judge votes and hint votes
  are copied (same event ids, only `envelope.namespace` changes) and only the pure stages run
  (vote_tally, hint_selector, sample_builder). Recorded teacher scores are re-attached to the
  replayed HintSelected (the id a teacher stage would give them there). Same inputs + same pure
  logic = the same samples: their payloads equal the original's except the ids derived in the new
  namespace (reward, hint, teacher lineage ids and the envelope).
- `rejudge`: requests, responses, next states and session ends are copied; the judge stage runs
  with the judge configured in the settings (new votes, its config version), then the pure stages
  and (for opd / combined) the teacher stage. The source namespace is only read.

Re-running the same replay (same source, mode and settings; recorded in `<target>.replay`) adds
nothing: copies skip event ids already present, and each stage resumes from its committed offsets.
A different replay into a non-empty namespace is refused. With `flush` (default) time is then
advanced past every timeout, as the live pipeline's ticks would have done (decisions taken on a
timeout carry their deadline as time, so the outputs do not depend on when the flush runs).
Reads: the source topics. Writes: every catalog topic of the target namespace, `<target>.replay`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from connectors.event_log.base import EventLog, OutgoingRecord, TopicSpec
from connectors.event_log.reading import read_to_end
from connectors.object_store.base import ObjectStore
from pipeline.archive import ArchiveError, archived_records, load_index
from pipeline.config import PipelineConfig
from pipeline.effects import EffectStage
from pipeline.namespace_io import (
    NamespaceWriter,
    catalog_topics,
    envelope_head,
    in_namespace,
    read_batches,
    record_count,
    with_namespace,
)
from pipeline.processor import Processor
from pipeline.stream_runner import StreamRunner
from schemas.codec import decode, encode, event_type_of
from schemas.errors import ConfigError
from schemas.events import make_event
from schemas.topics import topic_name

logger = logging.getLogger(__name__)
Event = dict[str, Any]
Stage = Processor | EffectStage
VOTE_MODES = ("reuse", "rejudge")
REUSE_TOPICS = ("requests", "responses", "next_states", "sessions", "judge_votes", "hints", "teacher_scores")
REJUDGE_TOPICS = ("requests", "responses", "next_states", "sessions")
REUSE_STAGES = ("vote_tally", "hint_selector", "teacher", "sample_builder")
REJUDGE_STAGES = ("judge", "vote_tally", "hint_selector", "teacher", "sample_builder")
Progress = Callable[[int], None]
PURE_BATCH_RECORDS = 20_000
RawRecord = tuple[bytes | None, bytes]  # (key, encoded event) as on the log


@dataclass(frozen=True)
class ReplayPlan:
    target: str
    votes: str
    source: str  # what is replayed, for the manifest: "log:live", "archive:live", "openclaw:<sha>"
    settings_version: str  # a hash of the settings that change outputs
    flush: bool = True
    partitions: int = 1
    copy_teacher: bool = True  # reuse: re-attach recorded teacher scores (False: run the teacher stage)

    @property
    def fingerprint(self) -> str:
        body = json.dumps([self.source, self.votes, self.settings_version], sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class ReplayReport:
    target: str
    copied: int
    skipped: int
    samples_ready: int
    samples_rejected: int
    vote_config_versions: tuple[str, ...]


def manifest_topic(namespace: str) -> str:
    return f"{namespace}.replay"


async def claim_namespace(log: EventLog, plan: ReplayPlan, source_namespace: str | None) -> None:
    """Refuse a non-empty target unless it holds this very replay; record the replay otherwise."""
    topic_name(plan.target, "requests")  # validates the name
    if plan.target == source_namespace:
        raise ConfigError(f"--target-namespace {plan.target!r} is the source: replay writes a new namespace")
    topic = manifest_topic(plan.target)
    await log.create_topics([TopicSpec(topic, 1)])
    manifests = [json.loads(r.value) for r in await read_to_end(log, topic)]
    if manifests:
        if manifests[0]["fingerprint"] != plan.fingerprint:
            raise ConfigError(
                f"namespace {plan.target!r} holds another replay ({manifests[0]['source']}, votes "
                f"{manifests[0]['votes']}): choose a new --target-namespace"
            )
        return
    for name in catalog_topics(plan.target):
        if await record_count(log, name):
            raise ConfigError(f"namespace {plan.target!r} already has events on {name}: choose a new one")
    body = {"fingerprint": plan.fingerprint, "source": plan.source, "votes": plan.votes}
    await log.append(topic, OutgoingRecord(value=json.dumps(body, sort_keys=True).encode()))


async def log_source(log: EventLog, namespace: str, topics: Sequence[str]) -> AsyncIterator[list[RawRecord]]:
    for topic in topics:
        async for records in read_batches(log, topic_name(namespace, topic)):
            yield [(r.key, r.value) for r in records]


async def event_source(events: list[Event]) -> AsyncIterator[list[RawRecord]]:
    """Events built in memory (an import), encoded as they will be stored."""
    for first in range(0, len(events), 5000):
        batch = events[first : first + 5000]
        yield [((e["envelope"].get("session_id") or "").encode() or None, encode(e)) for e in batch]


async def archive_source(
    store: ObjectStore, namespace: str, topics: Sequence[str]
) -> AsyncIterator[list[RawRecord]]:
    found = False
    for topic in topics:
        index = load_index(store, namespace, topic_name(namespace, topic))
        if index is None:
            continue
        found = True
        async for records in archived_records(store, index):
            yield [(r.key, r.value) for r in records]
    if not found:
        raise ArchiveError(f"no archive for namespace {namespace!r} in the object store")


async def source_size(log: EventLog, store: ObjectStore | None, namespace: str, topics: Sequence[str]) -> int:
    total = 0
    for topic in topics:
        full = topic_name(namespace, topic)
        if store is None:
            total += await record_count(log, full)
        else:
            index = load_index(store, namespace, full)
            total += sum(s["records"] for s in index.segments) if index else 0
    return total


@dataclass
class Copier:
    """Copies source events into the target, holding back what replay re-derives or re-attaches."""

    writer: NamespaceWriter
    votes: str
    progress: Progress
    teacher_scores: list[Event]
    vote_counts: dict[str, int]
    vote_versions: set[str]
    watermark_ms: int = 0

    async def copy(self, batches: AsyncIterator[list[RawRecord]]) -> None:
        """Only `envelope.namespace` changes: the bytes are spliced, not decoded and re-encoded."""
        target = self.writer.namespace
        async for batch in batches:
            keep = []
            for key, value in batch:
                head = envelope_head(value)
                if head is None:  # an older writer schema: decode (upcast) and re-encode
                    event = in_namespace(decode(value), target)
                    value, head = encode(event), envelope_head(encode(event))
                    assert head is not None
                self.watermark_ms = max(self.watermark_ms, head.occurred_at)
                if head.event_type in ("JudgeVoteCast", "HintVoteCast"):
                    self._count_vote(decode(value))
                elif head.event_type == "TeacherScored":
                    self.teacher_scores.append(decode(value))
                    continue
                elif head.event_type in ("HintSelected", "HintRejected"):
                    continue
                keep.append((head, key, with_namespace(value, head, target)))
            await self.writer.write_raw(keep)
            self.progress(len(batch))

    def _count_vote(self, event: Event) -> None:
        self.vote_versions.add(event["judge_config_version"])
        if event["judge_kind"] == "llm":
            kind = event["envelope"]["event_type"]
            self.vote_counts[kind] = max(self.vote_counts.get(kind, 1), int(event["vote_index"]) + 1)


def reuse_config(config: PipelineConfig, vote_counts: dict[str, int]) -> PipelineConfig:
    """The recorded votes decide how many make a judgement (m is not a setting of a reuse replay)."""
    return replace(
        config,
        tally=replace(
            config.tally,
            votes_per_judgement=vote_counts.get("JudgeVoteCast", config.tally.votes_per_judgement),
        ),
        hints=replace(
            config.hints,
            votes_per_judgement=vote_counts.get("HintVoteCast", config.hints.votes_per_judgement),
        ),
    )


def flush_time_ms(watermark_ms: int, config: PipelineConfig) -> int:
    longest_s = max(
        config.tally.vote_timeout_s,
        config.hints.vote_timeout_s,
        config.samples.settle_timeout_s,
        config.linker.idle_timeout_s,
    )
    return watermark_ms + int(longest_s * 1000) + 1


async def attach_teacher_scores(writer: NamespaceWriter, log: EventLog, scores: list[Event]) -> int:
    """Recorded TeacherScored re-attached to the replayed HintSelected of the same turn."""
    selected: dict[str, str] = {}
    async for records in read_batches(log, topic_name(writer.namespace, "hints")):
        for record in records:
            event = decode(record.value)
            if event["envelope"]["event_type"] == "HintSelected":
                selected.setdefault(event["envelope"]["turn_id"], event["envelope"]["event_id"])
    events = []
    for score in scores:
        envelope = score["envelope"]
        hint_id = selected.get(envelope["turn_id"])
        if hint_id is None:
            continue
        payload = {k: v for k, v in score.items() if k != "envelope"}
        payload["hint_event_id"] = hint_id
        events.append(
            make_event(
                "TeacherScored",
                namespace=writer.namespace,
                producer=envelope["producer"],
                occurred_at_ms=envelope["occurred_at"],
                id_parts=(hint_id, payload["teacher_kind"]),  # as pipeline/teacher_stage.py names it
                session_id=envelope["session_id"],
                turn_id=envelope["turn_id"],
                **payload,
            )
        )
    return await writer.write(events)


async def run_stages(
    log: EventLog,
    stages: Sequence[Stage | None],
    config: PipelineConfig,
    plan: ReplayPlan,
    flush_ms: int | None,
    teacher_copy: Callable[[], Any] | None,
) -> None:
    """Each stage in topological order over everything the previous ones wrote, then its flush tick."""
    for stage in stages:
        if stage is None:
            if teacher_copy is not None:
                await teacher_copy()
            continue
        runner = StreamRunner(log, stage, config, plan.target, partitions=plan.partitions)
        if isinstance(stage, EffectStage):
            await runner.run_until_idle(idle_polls=1)
        else:
            await drain(runner)
        if flush_ms is not None and not isinstance(stage, EffectStage):
            await runner.tick(flush_ms)


async def drain(runner: StreamRunner, batch_records: int = PURE_BATCH_RECORDS) -> int:
    """Everything on a pure stage's inputs now, in large batches (one commit each: fewer fsyncs)."""
    await runner.prepare()
    inputs = [topic_name(runner.namespace, t) for t in runner.processor.inputs]
    handled = 0
    async with runner.log.consumer(runner.group_id, inputs) as consumer:
        while records := await consumer.poll(max_records=batch_records, timeout_s=0.05):
            await runner.handle(records)
            handled += len(records)
    return handled


async def count_samples(log: EventLog, namespace: str) -> tuple[int, int]:
    ready = rejected = 0
    async for records in read_batches(log, topic_name(namespace, "samples")):
        for record in records:
            if event_type_of(record.value) == "SampleReady":  # the header says it: no decode
                ready += 1
            else:
                rejected += 1
    return ready, rejected


def select_stages(stages: Sequence[Stage], votes: str, copy_teacher: bool = True) -> list[Stage | None]:
    """The stages a replay runs, in topological order; None marks where a reuse replay re-attaches
    the recorded teacher scores. The turn linker never runs: its next states are copied."""
    by_name: dict[str, Stage | None] = {stage.name: stage for stage in stages}
    if votes == "reuse" and copy_teacher and "teacher" in by_name:
        by_name["teacher"] = None
    wanted = REUSE_STAGES if votes == "reuse" else REJUDGE_STAGES
    return [by_name[name] for name in wanted if name in by_name]


async def replay(
    log: EventLog,
    plan: ReplayPlan,
    batches: AsyncIterator[list[RawRecord]],
    stages: Sequence[Stage],
    config: PipelineConfig,
    progress: Progress = lambda n: None,
    source_namespace: str | None = None,
) -> ReplayReport:
    """Copy the source into `plan.target`, then run the replay's stages there."""
    if plan.votes not in VOTE_MODES:
        raise ConfigError(f"--votes must be reuse or rejudge, not {plan.votes!r}")
    await claim_namespace(log, plan, source_namespace)
    writer = NamespaceWriter(log, plan.target, plan.partitions)
    await writer.prepare()
    copier = Copier(writer, plan.votes, progress, [], {}, set())
    await copier.copy(batches)
    if plan.votes == "reuse":
        config = reuse_config(config, copier.vote_counts)
    flush_ms = flush_time_ms(copier.watermark_ms, config) if plan.flush else None
    chosen = select_stages(stages, plan.votes, plan.copy_teacher)

    async def teacher_copy() -> None:
        await attach_teacher_scores(writer, log, copier.teacher_scores)

    await run_stages(log, chosen, config, plan, flush_ms, teacher_copy if plan.votes == "reuse" else None)
    ready, rejected = await count_samples(log, plan.target)
    return ReplayReport(
        plan.target, writer.written, writer.skipped, ready, rejected, tuple(sorted(copier.vote_versions))
    )
