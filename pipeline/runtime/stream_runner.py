"""Runs one pipeline stage over the event log, exactly once, on any EventLog implementation.

A stage is a pure processor (pipeline/processors/contract.py) or an effect stage (pipeline/effects/contract.py),
whose planned calls are performed concurrently (at most `effect_concurrency` at a time) before
the records that asked for them are committed. Calls are performed in rounds of
`EFFECT_CALLS_PER_ROUND * effect_concurrency`, and once a batch has spent
`effect_commit_interval_s` on them, what it has handled so far is committed: a slow judge (an LLM
on a CPU, minutes per batch) then loses at most that much work to a crash, and progress shows.

For each batch of input records the runner decodes the events (undecodable bytes become
DeadLettered events on `<topic>.dlq`), calls the processor with the session's state, and then, in
ONE `append_and_commit`, appends the output events, the changed state and the new input offsets.
State lives on a changelog topic `<namespace>.<processor>.changelog` (last value per session key; an
empty value deletes it), so after a crash the state, the outputs and the offsets all agree: on the
embedded log this is one SQLite transaction, on Kafka one transaction. A changed state is written
once per batch however many of the batch's events touched it, so under a backlog larger batches
(up to `max_poll_records`) cost fewer state writes and fewer commits per event.

Runners in one process may share decodes (pipeline/runtime/shared_decodes.py): a record that several stages
read is decoded once.

Reads: the processor's input topics and its changelog. Writes: its output topics, its changelog,
the dead-letter topics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from connectors.event_log.base import (
    ConsumedRecord,
    Consumer,
    EventLog,
    OutgoingRecord,
    TopicPartition,
    TopicSpec,
)
from connectors.event_log.reading import reached, read_to_end
from connectors.metrics import Metrics
from pipeline.effects.contract import EffectCall, EffectStage
from pipeline.processors.config import PipelineConfig
from pipeline.processors.contract import Emit, Processor
from pipeline.runtime.dead_letters import dead_letter_event
from pipeline.runtime.shared_decodes import SharedDecodes
from schemas.codec import encode
from schemas.errors import EventDecodeError
from schemas.topics import dlq_topic, topic_name

logger = logging.getLogger(__name__)
EFFECT_CALLS_PER_ROUND = 8  # rounds of this many calls per concurrent slot


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class StreamRunner:
    log: EventLog
    processor: Processor | EffectStage
    config: PipelineConfig
    namespace: str
    metrics: Metrics = field(default_factory=Metrics)
    clock_ms: Callable[[], int] = wall_clock_ms
    # decided once: a Protocol isinstance check costs ~40 us, too much per record
    _effect: EffectStage | None = None
    _pure: Processor | None = None
    _watermark_ms: int | None = None  # the newest occurred_at read, and when (monotonic) it was read
    _watermark_read_s: float = 0.0
    tick_interval_s: float = 1.0
    partitions: int = 1
    effect_concurrency: int = 4
    effect_commit_interval_s: float = 5.0
    # Told after each commit how many input records it covered, and the backlog the current
    # run_until_idle (or a replay's drain) found when it started: a replay's progress bars.
    on_commit: Callable[[int, int], None] | None = None
    backlog: int = 0
    states: dict[str, Any] = field(default_factory=dict)
    # Under a backlog, large batches write each touched state once per batch, not once per 500 records.
    # With many sessions interleaved a batch touches almost one session per record, so the poll size
    # grows (next_poll_size) up to max_poll_records_cap while full batches keep doing that.
    max_poll_records: int = 2000
    max_poll_records_cap: int = 16000
    _poll_size: int = 0
    # None: a private cache, so the decode path is the same whether or not decodes are shared
    decodes: SharedDecodes | None = None
    _last_tick_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.processor, EffectStage):
            self._effect = self.processor
        else:
            self._pure = self.processor
        self._poll_size = self.max_poll_records
        if self.decodes is None:
            self.decodes = SharedDecodes()
        self.decodes.subscribe(self._full(t) for t in self.processor.inputs)

    @property
    def group_id(self) -> str:
        return f"{self.namespace}.{self.processor.name}"

    @property
    def changelog(self) -> str:
        return f"{self.namespace}.{self.processor.name}.changelog"

    def _full(self, topic: str) -> str:
        return topic_name(self.namespace, topic)

    async def prepare(self) -> None:
        """Create every topic this processor touches, then rebuild its state from the changelog."""
        names = [self._full(t) for t in (*self.processor.inputs, *self.processor.outputs)]
        names += [dlq_topic(self._full(t)) for t in self.processor.inputs]
        specs = [TopicSpec(n, self.partitions) for n in names] + [TopicSpec(self.changelog, self.partitions)]
        await self.log.create_topics(specs)
        self.states = await read_changelog(self.log, self.changelog, f"{self.group_id}.restore")
        logger.info("%s: restored %d session states", self.processor.name, len(self.states))

    async def run(self, stop: asyncio.Event) -> None:
        """Process until `stop` is set (the embedded `orl pipeline` loop)."""
        await self.prepare()
        consumer = self.log.consumer(self.group_id, [self._full(t) for t in self.processor.inputs])
        async with consumer:
            while not stop.is_set():
                records = await consumer.poll(max_records=self._poll_size, timeout_s=0.2)
                if records:
                    await self.handle(records)
                await self.maybe_tick(consumer)

    async def caught_up(self, consumer: Consumer) -> bool:
        """Whether the consumer owns partitions and has read all of them (no backlog).

        Until the first event is read, ticks would use the wall clock, and restored sessions whose
        last events are old would look idle although a backlog may still hold their next events
        (after a restart, a killed process's partitions stay with it for the session timeout). So
        the first tick waits for the first event or for the end of the input.
        """
        assignment = await consumer.assignment()
        if not assignment:
            return False
        for topic in {tp.topic for tp in assignment}:
            owned = sorted(tp for tp in assignment if tp.topic == topic)
            if not await reached(consumer, owned, await self.log.end_offsets(topic)):
                return False
        return True

    async def run_until_idle(self, idle_polls: int = 2) -> int:
        """Process everything available now, then return how many records were handled (tests, replay)."""
        await self.prepare()
        handled, idle = 0, 0
        async with self.log.consumer(
            self.group_id, [self._full(t) for t in self.processor.inputs]
        ) as consumer:
            while idle < idle_polls:
                records = await consumer.poll(max_records=self._poll_size, timeout_s=0.2)
                idle = 0 if records else idle + 1
                if records:
                    if not handled:
                        await self.count_backlog(consumer)
                    await self.handle(records)
                    handled += len(records)
        return handled

    async def count_backlog(self, consumer: Consumer) -> None:
        """Remember how many records the group has left (call it after a poll: Kafka assigns
        partitions in the first one) and tell `on_commit` (0 records done yet)."""
        if self.on_commit is not None:
            self.backlog = sum((await consumer.lag()).values())
            self.on_commit(0, self.backlog)

    async def handle(self, records: list[ConsumedRecord]) -> None:
        pending = _Pending()
        calls: list[EffectCall] = []
        round_calls = EFFECT_CALLS_PER_ROUND * self.effect_concurrency
        since_s = time.monotonic()
        states_written = 0
        decodes = self.decodes
        assert decodes is not None
        for record in records:
            pending.records += 1
            pending.next_offsets[(record.topic, record.partition)] = record.offset + 1
            try:
                event = decodes.decode(record)
            except EventDecodeError as error:
                pending.outputs.append(self._dead_letter(record, str(error)))
                continue
            self._advance_watermark(event)
            key = (record.key or b"").decode() or str(event["envelope"].get("session_id") or "")
            new_state, emits, planned = self._step(self.states.get(key), event)
            self._apply(key, new_state, pending.dirty)
            pending.emits.extend(emits)
            if planned:
                calls.extend(planned)
                if len(calls) >= round_calls:
                    pending.emits.extend(await self._perform(calls))
                    calls = []
                    if time.monotonic() - since_s >= self.effect_commit_interval_s:
                        states_written += await self._commit(pending)  # the states are this prefix's
                        pending, since_s = _Pending(), time.monotonic()
        if calls:
            pending.emits.extend(await self._perform(calls))
        states_written += await self._commit(pending)
        self.metrics.count("records_processed", len(records), processor=self.processor.name)
        self._poll_size = next_poll_size(
            self._poll_size, len(records), states_written, self.max_poll_records, self.max_poll_records_cap
        )

    async def _commit(self, pending: _Pending) -> int:
        """Outputs, changed states and input offsets of the records handled so far, in one
        append_and_commit; returns the number of states written."""
        outputs = pending.outputs + self._encode(pending.emits) + self._changelog_records(pending.dirty)
        offsets = {
            TopicPartition(topic, partition): offset
            for (topic, partition), offset in pending.next_offsets.items()
        }
        await self.log.append_and_commit(outputs, self.group_id, offsets)
        if self.on_commit is not None:
            self.on_commit(pending.records, self.backlog)
        return len(pending.dirty)

    def _step(self, state: Any, event: dict[str, Any]) -> tuple[Any, list[Emit], list[EffectCall]]:
        """One event through the stage: (new state, emits, calls to perform)."""
        if self._effect is not None:
            new_state, calls = self._effect.plan(state, event, self.config)
            return new_state, [], calls
        assert self._pure is not None
        new_state, emits = self._pure.process(state, event, self.config)
        return new_state, emits, []

    async def _perform(self, calls: list[EffectCall]) -> list[Emit]:
        stage = self._effect
        assert stage is not None
        limit = asyncio.Semaphore(self.effect_concurrency)

        async def one(call: EffectCall) -> list[Emit]:
            async with limit:
                return await stage.perform(call)

        results = await asyncio.gather(*(one(call) for call in calls))
        self.metrics.count("effect_calls", len(calls), processor=stage.name)
        return [emit for emits in results for emit in emits]

    async def maybe_tick(self, consumer: Consumer) -> None:
        """A tick once per `tick_interval_s`; none before the first event is read unless caught up."""
        now_s = time.monotonic()
        if now_s - self._last_tick_s < self.tick_interval_s:
            return
        if self._watermark_ms is None and not await self.caught_up(consumer):
            return
        self._last_tick_s = now_s
        await self.tick(self.event_time_ms())

    def event_time_ms(self) -> int:
        """The time ticks see: the newest event time read plus the wall time since it was read.

        Live, that is the wall clock; in a replay of old events it follows the events, so sessions
        are not closed as idle just because their events are old. Before any event was read in this
        process, it is the wall clock.
        """
        if self._watermark_ms is None:
            return self.clock_ms()
        return self._watermark_ms + int((time.monotonic() - self._watermark_read_s) * 1000)

    def _advance_watermark(self, event: dict[str, Any]) -> None:
        occurred_at = int(event["envelope"]["occurred_at"])
        if self._watermark_ms is None or occurred_at > self._watermark_ms:
            self._watermark_ms, self._watermark_read_s = occurred_at, time.monotonic()

    async def tick(self, now_ms: int) -> None:
        """Time-based work (idle timeouts) for every stored session, committed like a batch."""
        emits_all: list[Emit] = []
        dirty: set[str] = set()
        for key, state in list(self.states.items()):
            # The contract (pipeline/processors/contract.py): a tick that changes a state emits something or
            # returns another object, so unchanged states are recognised without serialising them.
            new_state, emits = self.processor.on_tick(state, now_ms, self.config)
            if emits or new_state is not state:
                self._apply(key, new_state, dirty)
            emits_all.extend(emits)
        if emits_all or dirty:
            outputs = self._encode(emits_all) + self._changelog_records(dirty)
            await self.log.append_and_commit(outputs, self.group_id, {})

    def _apply(self, key: str, new_state: Any, dirty: set[str]) -> None:
        if new_state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = new_state
        dirty.add(key)

    def _encode(self, emits: Iterable[Emit]) -> list[tuple[str, OutgoingRecord]]:
        out = []
        per_topic: dict[str, int] = {}
        for emit in emits:
            session = emit.event["envelope"].get("session_id")
            record = OutgoingRecord(value=encode(emit.event), key=session.encode() if session else None)
            out.append((self._full(emit.topic), record))
            per_topic[emit.topic] = per_topic.get(emit.topic, 0) + 1
        for topic, count in per_topic.items():  # one metric update per topic, not per event
            self.metrics.count("events_emitted", count, topic=topic, processor=self.processor.name)
        return out

    def _changelog_records(self, dirty: set[str]) -> list[tuple[str, OutgoingRecord]]:
        records = []
        for key in sorted(dirty):
            state = self.states.get(key)
            value = b"" if state is None else state_bytes(state)
            records.append((self.changelog, OutgoingRecord(value=value, key=key.encode())))
        return records

    def _dead_letter(self, record: ConsumedRecord, error: str) -> tuple[str, OutgoingRecord]:
        self.metrics.count("dead_lettered", topic=record.topic, processor=self.processor.name)
        logger.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, error)
        event = dead_letter_event(
            self.namespace,
            record.topic,
            record.partition,
            record.offset,
            record.value,
            error,
            record.timestamp_ms,
        )
        return dlq_topic(record.topic), OutgoingRecord(value=encode(event), key=record.key)


@dataclass
class _Pending:
    """What a batch has handled and not yet committed."""

    records: int = 0
    outputs: list[tuple[str, OutgoingRecord]] = field(default_factory=list)
    emits: list[Emit] = field(default_factory=list)
    dirty: set[str] = field(default_factory=set)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)  # plain tuples: cheap per record


def next_poll_size(size: int, records: int, states_written: int, floor: int, cap: int) -> int:
    """The next poll's size after a batch of `records` (asked: `size`) that wrote `states_written` states.

    Doubled (up to `cap`) after a full batch that wrote a state for more than a quarter of its
    records: many sessions are interleaved, and a larger batch writes each of them once for more
    records. Halved (down to `floor`) after a batch that was less than half full (no backlog: keep
    batches, and so latency, small) or that wrote states for less than a tenth of its records.
    """
    if records >= size and states_written * 4 > records:
        return min(size * 2, cap)
    if records * 2 < size or states_written * 10 < records:
        return max(size // 2, floor)
    return size


async def read_changelog(log: EventLog, topic: str, group_id: str) -> dict[str, Any]:
    """The last state per key on a changelog topic (empty value = deleted), read from the beginning."""
    states: dict[str, Any] = {}
    for record in await read_to_end(log, topic, group_id):
        key = (record.key or b"").decode()
        if record.value:
            states[key] = json.loads(record.value)
        else:
            states.pop(key, None)
    return states


def state_bytes(state: Any) -> bytes:
    """A changelog value. Keys keep their insertion order (no sort), so a restored state is the same
    dict, order included, as the one that was stored; sorting would also cost a fifth more."""
    return json.dumps(state, separators=(",", ":"), check_circular=False).encode()
