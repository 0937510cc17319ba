"""One shard of a reuse replay, pure: recorded records in, the encoded records to write out.

A reuse replay (pipeline/history/replay.py) deals the sessions of the history between shards by record key,
the session id, as the live pipeline's partitions do: a shard sees every event of its sessions and
none of the others'. A shard splices each recorded event into the target namespace (only
`envelope.namespace` changes, the bytes are not re-encoded), decodes it once and feeds it to the
pure stages in memory (pipeline/runtime/memory_runner.py); what the stages emit is encoded beside the copy.
Recorded teacher scores are re-attached to the replayed HintSelected of their turn.
The replay driver does all reading and writing; the shards run in its process or in worker
processes (pipeline/history/replay_workers.py), with the same calls.
Reads and writes no topics.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from orl.pipeline.history.namespace_io import (
    VOTE_TYPES,
    EncodedEvent,
    encoded,
    envelope_head,
    in_namespace,
    vote_fields,
    with_namespace,
)
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, Processor
from orl.pipeline.runtime.memory_runner import MemoryRunner
from orl.schemas.codec import decode, encode, event_type_of, payload_forgotten
from orl.schemas.event_constructors import teacher_scored
from orl.schemas.event_types import HintVoteCast, JudgeVoteCast, TeacherScored
from orl.schemas.events import EventOrigin
from orl.schemas.sealing import PayloadForgotten
from orl.schemas.topics import topic_for_event

Event = dict[str, Any]
RawRecord = tuple[bytes | None, bytes]  # (key, encoded event) as on the log
HELD_VOTE_BYTES = 256 * 2**20  # per shard: about 120,000 turns of 3 votes


def shard_of(key: bytes | None, shards: int) -> int:
    """The shard of a record key (records without a key all go to shard 0). CRC-32's low bits barely
    change between keys such as "s0" and "s3", so it is mixed first (Fibonacci hashing)."""
    if not key:
        return 0
    return (((zlib.crc32(key) * 2654435761) & 0xFFFFFFFF) >> 16) % shards


def split_by_shard(batch: Sequence[RawRecord], shards: int) -> list[list[RawRecord]]:
    """The batch dealt by key, order kept within each part."""
    if shards == 1:
        return [list(batch)]
    parts: list[list[RawRecord]] = [[] for _ in range(shards)]
    for record in batch:
        parts[shard_of(record[0], shards)].append(record)
    return parts


@dataclass(frozen=True)
class RecordedVotes:
    """What recorded votes say about the live judge: m per vote type, and its config versions."""

    counts: dict[str, int]  # "JudgeVoteCast" / "HintVoteCast" -> llm votes per judgement
    versions: frozenset[str]

    @staticmethod
    def merge(parts: Iterable[RecordedVotes]) -> RecordedVotes:
        counts: dict[str, int] = {}
        versions: set[str] = set()
        for part in parts:
            for event_type, count in part.counts.items():
                counts[event_type] = max(counts.get(event_type, 1), count)
            versions |= part.versions
        return RecordedVotes(counts, frozenset(versions))


def count_votes(values: Iterable[bytes]) -> RecordedVotes:
    """m is the largest llm vote_index + 1, read from the votes' leading fields (no full decode)."""
    counts: dict[str, int] = {}
    versions: set[str] = set()
    for value in values:
        fields = vote_fields(value)
        if fields is None:
            if event_type_of(value) not in VOTE_TYPES:
                continue  # a hint decision on the hints topic
            try:  # sealed, or an older writer schema
                event = cast(JudgeVoteCast | HintVoteCast, decode(value))
            except PayloadForgotten:
                continue
            fields = (
                event["envelope"]["event_type"], event["judge_kind"], event["judge_config_version"],
                int(event["vote_index"]),
            )  # fmt: skip
        event_type, judge_kind, version, vote_index = fields
        versions.add(version)
        if judge_kind == "llm":
            counts[event_type] = max(counts.get(event_type, 1), vote_index + 1)
    return RecordedVotes(counts, frozenset(versions))


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


@dataclass
class Splicer:
    """Recorded events moved into the target namespace, minus what a replay re-derives or re-attaches."""

    target: str
    teacher_scores: list[Event] = field(default_factory=list)  # TeacherScored, to re-attach
    watermark_ms: int = 0  # the latest occurred_at seen
    forgotten: int = 0  # events left out: their payloads were forgotten (`orl forget`)

    def splice(self, batch: Iterable[RawRecord]) -> list[EncodedEvent]:
        """The batch in the target namespace, minus HintSelected / HintRejected (re-derived) and
        TeacherScored (kept in `teacher_scores`), minus events whose payloads were forgotten. Only
        `envelope.namespace` changes: the bytes are spliced, not decoded and re-encoded (an event of
        an older writer schema is upcast; a sealed one keeps its seal, so forgetting its session
        later shreds the copy too)."""
        kept = []
        for key, value in batch:
            if payload_forgotten(value):
                self.forgotten += 1
                continue
            head = envelope_head(value)
            if head is None:  # an older writer schema: decode (upcast) and re-encode
                value = encode(decode(value))
                head = envelope_head(value)
                assert head is not None
            self.watermark_ms = max(self.watermark_ms, head.occurred_at)
            if head.event_type == "TeacherScored":
                self.teacher_scores.append(in_namespace(decode(value), self.target))
            elif head.event_type not in ("HintSelected", "HintRejected"):
                spliced = with_namespace(value, head, self.target)
                kept.append(EncodedEvent(head.event_id, head.event_type, key, spliced))
        return kept


def teacher_events(scores: list[Event], selected: dict[str, str]) -> list[Event]:
    """Recorded TeacherScored re-attached to the replayed HintSelected of the same turn (turn id ->
    the first HintSelected id); a score whose turn has no selected hint in the replay is dropped."""
    events: list[Event] = []
    for score in scores:
        recorded = cast(TeacherScored, score)
        envelope = recorded["envelope"]
        hint_id = None if envelope["turn_id"] is None else selected.get(envelope["turn_id"])
        if hint_id is None:
            continue
        origin = EventOrigin(
            namespace=envelope["namespace"],
            producer=envelope["producer"],
            occurred_at_ms=envelope["occurred_at"],
            id_parts=(hint_id, recorded["teacher_kind"]),  # as pipeline/effects/teacher_stage.py names it
            session_id=envelope["session_id"],
            turn_id=envelope["turn_id"],
        )
        event = teacher_scored(
            origin,
            hint_event_id=hint_id,
            teacher_kind=recorded["teacher_kind"],
            teacher_prompt_token_ids=recorded["teacher_prompt_token_ids"],
            response_token_ids=recorded["response_token_ids"],
            teacher_logprobs=recorded["teacher_logprobs"],
            policy_version=recorded["policy_version"],
            temperature=recorded["temperature"],
            teacher_top_ids=recorded["teacher_top_ids"],
            teacher_top_logprobs=recorded["teacher_top_logprobs"],
        )
        events.append(dict(event))
    return events


class ReplayShard:
    """The sessions of one shard: copy and pure stages, in one pass over the recorded events.

    Calls, in order: `count_votes` for each batch of the vote topics, `start` (with the merged vote
    counts), `feed_held` once per counted batch when every shard held its votes, `feed` for each
    batch of the other topics (of all topics when not), `watermark`, then `finish`. A shard holds
    the vote batches it counts, up to HELD_VOTE_BYTES, so that they are read from the log once.
    `stages` are in topological order; None marks where the recorded teacher scores still waiting
    for their hint are re-attached at the end (after hint_selector's flush tick, before
    sample_builder's). Memory grows with the shard's history (about 5 KB per turn: the sessions'
    states).
    """

    def __init__(
        self, stages: Sequence[Processor | None], config: PipelineConfig, target: str, hold_votes: bool = True
    ) -> None:
        self.stages = list(stages)
        self.config = config
        self.splicer = Splicer(target)
        self.runner: MemoryRunner | None = None
        self.selected: dict[str, str] = {}  # turn id -> its first HintSelected in the replay
        self.waiting: list[Event] = []  # teacher scores whose hint is not selected yet
        self.held: deque[list[RawRecord]] | None = deque() if hold_votes else None
        self.held_bytes = 0

    def count_votes(self, batch: list[RawRecord]) -> RecordedVotes:
        """m and the config versions of a batch of votes, held for `feed_held` within the budget."""
        if self.held is not None:
            self.held_bytes += sum(len(value) for _, value in batch)
            if self.held_bytes <= HELD_VOTE_BYTES:
                self.held.append(batch)
            else:
                self.held = None  # too many: the driver reads them again
        return count_votes(value for _, value in batch)

    def holds_votes(self) -> bool:
        return self.held is not None

    def start(self, vote_counts: dict[str, int], use_held: bool) -> None:
        """Stages configured with the recorded m; the held votes are dropped unless `use_held`."""
        self.config = replace(
            reuse_config(self.config, vote_counts), compact_states=False
        )  # never serialised
        self.runner = MemoryRunner([stage for stage in self.stages if stage is not None], self.config)
        if not use_held:
            self.held = None

    def feed_held(self) -> list[EncodedEvent]:
        """`feed` of the oldest held vote batch."""
        if not self.held:
            raise RuntimeError("ReplayShard.feed_held: no vote batch is held")
        return self.feed(self.held.popleft())

    def feed(self, batch: list[RawRecord]) -> list[EncodedEvent]:
        """The batch's copy and, after it, everything the stages emit from it (encoded)."""
        runner = self._runner()
        kept = self.splicer.splice(batch)
        emits = []
        for item in kept:
            emits += runner.feed(topic_for_event(item.event_type), decode(item.value))
        scores, self.splicer.teacher_scores = self.splicer.teacher_scores, []
        self.waiting += [score for score in scores if score["envelope"]["turn_id"] not in self.selected]
        ready = [score for score in scores if score["envelope"]["turn_id"] in self.selected]
        return kept + [encoded(event) for event in self._outputs(emits) + self._attach(ready)]

    def watermark(self) -> int:
        return self.splicer.watermark_ms

    def forgotten(self) -> int:
        """Events of this shard left out because their payloads were forgotten."""
        return self.splicer.forgotten

    def finish(self, flush_ms: int | None) -> list[EncodedEvent]:
        """The waiting teacher scores re-attached and, with a flush time, each stage's timeouts fired
        then, in topological order."""
        runner = self._runner()
        events: list[Event] = []
        for stage in self.stages:
            if stage is None:
                events += self._attach(self.waiting)
                self.waiting = []
            elif flush_ms is not None:
                events += self._outputs(runner.tick(stage, flush_ms))
        return [encoded(event) for event in events]

    def _runner(self) -> MemoryRunner:
        if self.runner is None:
            raise RuntimeError("ReplayShard.start must be called before feeding it")
        return self.runner

    def _outputs(self, emits: list[Emit]) -> list[Event]:
        for emit in emits:
            envelope = emit.event["envelope"]
            if envelope["event_type"] == "HintSelected":
                self.selected.setdefault(envelope["turn_id"], envelope["event_id"])
        return [emit.event for emit in emits]

    def _attach(self, scores: list[Event]) -> list[Event]:
        """The TeacherScored of the scores whose hint is selected, and what they lead to."""
        teacher = teacher_events(scores, self.selected)
        runner = self._runner()
        return teacher + self._outputs(
            [emit for event in teacher for emit in runner.feed("teacher_scores", event)]
        )
