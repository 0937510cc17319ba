"""Replay: re-run the pipeline over recorded history into a NEW namespace (history is never overwritten).

Sources: a namespace on the log, the same namespace from the archive (pipeline/history/archive.py), or
events imported from OpenClaw-RL's JSONL files (pipeline/history/openclaw_import.py).

Modes:
- `reuse`: the recorded requests, responses, next states, session ends, judge votes and hint votes
  are copied (same event ids, only `envelope.namespace` changes) and only the pure stages run
  (vote_tally, hint_selector, sample_builder). Recorded teacher scores are re-attached to the
  replayed HintSelected (the id a teacher stage would give them there). Same inputs + same pure
  logic = the same samples: their payloads equal the original's except the ids derived in the new
  namespace (reward, hint, teacher lineage ids and the envelope). The pure stages run in memory in
  the same pass as the copy, each event decoded once, the sessions dealt between shards that run
  in worker processes (pipeline/history/replay_shard.py, replay_workers.py); the votes are first skimmed
  for m, the number of llm votes that makes a judgement.
- `rejudge`: requests, responses, next states and session ends are copied; the judge stage runs
  with the judge configured in the settings (new votes, its config version), then the pure stages
  and (for opd / combined) the teacher stage, each a StreamRunner over the target's topics. The
  source namespace is only read.

Re-running the same replay (same source, mode and settings; recorded in `<target>.replay`) adds
nothing: copies and outputs skip event ids already present (output ids are deterministic), and
each StreamRunner stage resumes from its committed offsets.
A different replay into a non-empty namespace is refused. With `flush` (default) time is then
advanced past every timeout, as the live pipeline's ticks would have done (decisions taken on a
timeout carry their deadline as time, so the outputs do not depend on when the flush runs).
Reads: the source topics. Writes: every catalog topic of the target namespace, `<target>.replay`.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import typing
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from orl.connectors.event_log.base import EventLog, OutgoingRecord, TopicSpec
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.object_store.base import ObjectStore
from orl.pipeline.effects.contract import EffectStage
from orl.pipeline.history.archive import ArchiveError, archived_records, load_index
from orl.pipeline.history.namespace_io import (
    EncodedEvent,
    NamespaceWriter,
    catalog_topics,
    read_batches,
    record_count,
)
from orl.pipeline.history.replay_shard import (
    RawRecord,
    RecordedVotes,
    ReplayShard,
    Splicer,
    reuse_config,
    split_by_shard,
)
from orl.pipeline.history.replay_workers import LocalShard, Shard, shard_pool
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Processor
from orl.pipeline.runtime.gc_tuning import tuned_for_streams
from orl.pipeline.runtime.stream_runner import StreamRunner
from orl.schemas.codec import encode, event_type_of
from orl.schemas.errors import ConfigError
from orl.schemas.event_types import Envelope
from orl.schemas.topics import record_key, topic_for_event, topic_name

logger = logging.getLogger(__name__)
Event = dict[str, Any]
Stage = Processor | EffectStage
VoteMode = Literal["reuse", "rejudge"]
VOTE_MODES: tuple[str, ...] = typing.get_args(VoteMode)
REUSE_TOPICS = ("requests", "responses", "next_states", "sessions", "judge_votes", "hints", "teacher_scores")
REJUDGE_TOPICS = ("requests", "responses", "next_states", "sessions")
REUSE_STAGES = ("vote_tally", "hint_selector", "teacher", "sample_builder", "group_advantage")
# A reuse replay in memory reads the votes first and the responses last: each turn's reward, hint
# and teacher scores are decided before its response is read, so the turn is settled then and
# sample_builder does not hold every response of the history at once.
VOTE_TOPICS = ("judge_votes", "hints")  # read first, to learn m
IN_MEMORY_ORDER = (
    "judge_votes",
    "hints",
    "teacher_scores",
    "sessions",
    "next_states",
    "requests",
    "responses",
)
REJUDGE_STAGES = ("judge", "vote_tally", "hint_selector", "teacher", "sample_builder", "group_advantage")


class Progress(Protocol):
    def __call__(self, phase: str, advanced: int, total: int) -> None:
        """`advanced` more records of `phase` done, of `total`: "replay" (a reuse replay's one
        pass), or "copy" and then each stage's name (a replay whose stages run over the log)."""


def no_progress(phase: str, advanced: int, total: int) -> None:
    pass


PURE_BATCH_RECORDS = 20_000
T = TypeVar("T")


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
    source_events: int  # recorded events replayed
    copied: int  # events this replay wrote through its writer (the copy, and a reuse replay's outputs)
    skipped: int  # of those, events the target already had (a re-run)
    samples_ready: int
    samples_rejected: int
    vote_config_versions: tuple[str, ...]
    forgotten: int = 0  # recorded events left out: their payloads were forgotten (`orl forget`)


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


@dataclass(frozen=True)
class ReplaySource:
    """Recorded events to replay, read topic by topic in batches of (key, encoded event); readable
    more than once (a reuse replay first counts the votes, then replays everything)."""

    topics: tuple[str, ...]
    read_topics: Callable[[Sequence[str]], AsyncIterator[list[RawRecord]]]
    count_records: Callable[[], Awaitable[int]]

    def batches(self, topics: Sequence[str] | None = None) -> AsyncIterator[list[RawRecord]]:
        """The batches of `topics` (default: all of the source's, in its order) that the source has."""
        return self.read_topics([t for t in (topics or self.topics) if t in self.topics])

    async def size(self) -> int:
        """How many records the source holds (its events to replay)."""
        return await self.count_records()


def log_source(log: EventLog, namespace: str, topics: Sequence[str]) -> ReplaySource:
    async def read(chosen: Sequence[str]) -> AsyncIterator[list[RawRecord]]:
        for topic in chosen:
            async for records in read_batches(log, topic_name(namespace, topic)):
                yield [(r.key, r.value) for r in records]

    async def count() -> int:
        return sum([await record_count(log, topic_name(namespace, topic)) for topic in topics])

    return ReplaySource(tuple(topics), read, count)


def event_source(events: list[Event]) -> ReplaySource:
    """Events built in memory (an import), encoded once, as they will be stored."""
    by_topic: dict[str, list[RawRecord]] = {}
    for event in events:
        envelope: Envelope = event["envelope"]
        key = (record_key(event) or "").encode() or None
        by_topic.setdefault(topic_for_event(envelope["event_type"]), []).append((key, encode(event)))

    async def read(chosen: Sequence[str]) -> AsyncIterator[list[RawRecord]]:
        for topic in chosen:
            records = by_topic[topic]
            for first in range(0, len(records), 5000):
                yield records[first : first + 5000]

    async def count() -> int:
        return len(events)

    return ReplaySource(tuple(by_topic), read, count)


def archive_source(store: ObjectStore, namespace: str, topics: Sequence[str]) -> ReplaySource:
    indexes = {topic: load_index(store, namespace, topic_name(namespace, topic)) for topic in topics}
    if not any(indexes.values()):
        raise ArchiveError(f"no archive for namespace {namespace!r} in the object store")

    async def read(chosen: Sequence[str]) -> AsyncIterator[list[RawRecord]]:
        for topic in chosen:
            index = indexes[topic]
            if index is None:
                continue
            async for records in archived_records(store, index):
                yield [(r.key, r.value) for r in records]

    async def count() -> int:
        return sum(sum(s["records"] for s in index.segments) for index in indexes.values() if index)

    return ReplaySource(tuple(topics), read, count)


async def copy(writer: NamespaceWriter, source: ReplaySource, progress: Progress, total: int) -> Splicer:
    """The source (`total` records) spliced into the writer's namespace (a replay whose stages then
    run over the log); returns the splicer (its watermark: the latest occurred_at copied)."""
    splicer = Splicer(writer.namespace)
    async for batch in source.batches():
        await writer.write_batch(splicer.splice(batch))
        progress("copy", len(batch), total)
    return splicer


async def in_order(
    calls: AsyncIterator[tuple[asyncio.Future[T], int]], depth: int = 2
) -> AsyncIterator[tuple[T, int]]:
    """The results of submitted calls, in order, keeping up to `depth` calls in flight (each with the
    number of source records it stands for); calls still in flight when this stops are cancelled."""
    waiting: deque[tuple[asyncio.Future[T], int]] = deque()
    try:
        async for call in calls:
            waiting.append(call)
            if len(waiting) >= depth:
                result, size = waiting.popleft()
                yield await result, size
        while waiting:
            result, size = waiting.popleft()
            yield await result, size
    finally:
        for result, _ in waiting:
            result.cancel()


def on_every(
    shards: Sequence[Shard], method: str, args: Sequence[tuple[Any, ...]]
) -> asyncio.Future[list[Any]]:
    """`method` submitted to each shard with its arguments; awaits to their results, in shard order."""
    return asyncio.gather(*(shard.submit(method, *a) for shard, a in zip(shards, args, strict=True)))


async def count_recorded_votes(
    source: ReplaySource, shards: Sequence[Shard]
) -> tuple[RecordedVotes, list[int]]:
    """The votes skimmed for m and the judge config versions, each batch dealt between the shards
    by key (which may hold them); returns the counts and the size of each batch."""
    sizes: list[int] = []

    async def calls() -> AsyncIterator[tuple[asyncio.Future[list[RecordedVotes]], int]]:
        async for batch in source.batches(VOTE_TOPICS):
            sizes.append(len(batch))
            yield on_every(shards, "count_votes", [(part,) for part in split_by_shard(batch, len(shards))]), 0

    counts = [part async for parts, _ in in_order(calls()) for part in parts]
    return RecordedVotes.merge(counts), sizes


async def replay_in_memory(
    writer: NamespaceWriter,
    source: ReplaySource,
    stages: Sequence[Processor | None],
    config: PipelineConfig,
    flush: bool,
    workers: int,
    progress: Progress,
    total: int,
) -> tuple[RecordedVotes, int]:
    """A replay whose stages are all pure: one pass over the source (`total` records), each event
    decoded once, the sessions dealt between `workers` shards (pipeline/history/replay_shard.py) by record key.

    The votes are first skimmed for m (and held by the shards, unless there are too many to hold).
    Then each batch, topics in IN_MEMORY_ORDER, is split between the shards, and what they return
    (the copy and the stages' outputs) is written in one append, skipping ids already there, while
    the next batches are read and computed. With `flush`, each stage's timeouts then fire at one
    flush time for all shards.
    """
    async with shard_pool(workers, stages, config, writer.namespace) as shards:
        votes, vote_batches = await count_recorded_votes(source, shards)
        held = all(await on_every(shards, "holds_votes", [()] * len(shards)))
        await on_every(shards, "start", [(votes.counts, held)] * len(shards))
        topics = [topic for topic in IN_MEMORY_ORDER if not held or topic not in VOTE_TOPICS]

        async def calls() -> AsyncIterator[tuple[asyncio.Future[list[list[EncodedEvent]]], int]]:
            for size in vote_batches if held else ():
                yield on_every(shards, "feed_held", [()] * len(shards)), size
            async for batch in source.batches(topics):
                parts = [(part,) for part in split_by_shard(batch, len(shards))]
                yield on_every(shards, "feed", parts), len(batch)

        # A batch is written while the next ones are read and computed: SQLite's work (and its
        # fsync) runs on the log's thread, the shards' in their processes.
        writing: asyncio.Task[int] | None = None
        try:
            async for parts, size in in_order(calls()):
                if writing is not None:
                    await writing
                writing = asyncio.create_task(writer.write_batch([item for part in parts for item in part]))
                progress("replay", size, total)
        finally:
            if writing is not None:
                await writing
        watermark = max(await on_every(shards, "watermark", [()] * len(shards)))
        flush_ms = flush_time_ms(watermark, config) if flush else None
        finals = await on_every(shards, "finish", [(flush_ms,)] * len(shards))
        await writer.write_batch([item for part in finals for item in part])
        forgotten = sum(await on_every(shards, "forgotten", [()] * len(shards)))
    return votes, forgotten


def flush_time_ms(watermark_ms: int, config: PipelineConfig) -> int:
    longest_s = max(
        config.tally.vote_timeout_s,
        config.hints.vote_timeout_s,
        config.samples.settle_timeout_s,
        config.linker.idle_timeout_s,
    )
    return watermark_ms + int(longest_s * 1000) + 1


async def run_stages(
    log: EventLog,
    stages: Sequence[Stage],
    config: PipelineConfig,
    plan: ReplayPlan,
    flush_ms: int | None,
    progress: Progress = no_progress,
    effect_concurrency: int = 4,
) -> None:
    """Each stage in topological order over everything the previous ones wrote, then its flush tick
    (the replays with an effect stage: the judge of a rejudge, or a teacher that scores anew); then
    once more each stage that reads what a later one wrote (sample_builder reads group_advantage's
    rewards)."""
    for stage in [*stages, *feedback_readers(stages)]:
        runner = StreamRunner(
            log, stage, config, plan.target, partitions=plan.partitions, effect_concurrency=effect_concurrency
        )
        runner.on_commit = functools.partial(progress, stage.name)
        if isinstance(stage, EffectStage):
            await runner.run_until_idle(idle_polls=1)
        else:
            await drain(runner)
        if flush_ms is not None and not isinstance(stage, EffectStage):
            await runner.tick(flush_ms)


def feedback_readers(stages: Sequence[Stage]) -> list[Stage]:
    """The stages that read a topic some later stage writes, in order."""
    return [
        stage
        for index, stage in enumerate(stages)
        if any(topic in later.outputs for later in stages[index + 1 :] for topic in stage.inputs)
    ]


async def drain(runner: StreamRunner, batch_records: int = PURE_BATCH_RECORDS) -> int:
    """Everything on a pure stage's inputs now, in large batches (one commit each: fewer fsyncs)."""
    await runner.prepare()
    inputs = [topic_name(runner.namespace, t) for t in runner.processor.inputs]
    handled = 0
    async with runner.log.consumer(runner.group_id, inputs) as consumer:
        while records := await consumer.poll(max_records=batch_records, timeout_s=0.05):
            if not handled:
                await runner.count_backlog(consumer)
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
    source: ReplaySource,
    stages: Sequence[Stage],
    config: PipelineConfig,
    progress: Progress = no_progress,
    source_namespace: str | None = None,
    workers: int = 1,
    effect_concurrency: int = 4,
) -> ReplayReport:
    """Copy the source into `plan.target` and run the replay's stages there: in memory when they
    are all pure (reuse; in `workers` processes when more than 1), else through the log with
    StreamRunner (a judge or teacher makes calls, `effect_concurrency` at a time)."""
    if plan.votes not in VOTE_MODES:
        raise ConfigError(f"--votes must be reuse or rejudge, not {plan.votes!r}")
    await claim_namespace(log, plan, source_namespace)
    writer = NamespaceWriter(log, plan.target, plan.partitions)
    await writer.prepare()
    chosen = select_stages(stages, plan.votes, plan.copy_teacher)
    total = await source.size()
    pure = [stage for stage in chosen if not isinstance(stage, EffectStage)]
    if config.rewards.group_advantage and workers > 1:
        # shards are dealt by session: a rollout group's sessions would be normalised apart
        logger.info("group advantages need every session of a group in one shard: replaying with 1 worker")
        workers = 1
    with tuned_for_streams():
        if len(pure) == len(chosen):
            votes, forgotten = await replay_in_memory(
                writer, source, pure, config, plan.flush, workers, progress, total
            )
        else:
            votes = RecordedVotes({}, frozenset())
            if plan.votes == "reuse":
                counter = LocalShard(ReplayShard([], config, plan.target, hold_votes=False))
                votes, _ = await count_recorded_votes(source, [counter])
                config = reuse_config(config, votes.counts)
            splicer = await copy(writer, source, progress, total)
            forgotten = splicer.forgotten
            flush_ms = flush_time_ms(splicer.watermark_ms, config) if plan.flush else None
            over_log = [stage for stage in chosen if stage is not None]
            await run_stages(log, over_log, config, plan, flush_ms, progress, effect_concurrency)
    ready, rejected = await count_samples(log, plan.target)
    return ReplayReport(
        plan.target, total, writer.written, writer.skipped, ready, rejected,
        tuple(sorted(votes.versions)), forgotten,
    )  # fmt: skip
