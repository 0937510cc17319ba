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
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orl.connectors.event_log.base import (
    ConsumedRecord,
    Consumer,
    EventLog,
    EventLogError,
    OutgoingRecord,
    RecordRefused,
    TopicPartition,
    TopicSpec,
)
from orl.connectors.event_log.reading import reached, read_to_end
from orl.connectors.metrics import Metrics
from orl.pipeline.effects.contract import EffectCall, EffectStage
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, Processor
from orl.pipeline.runtime.host import (
    Output,
    ProcessorHost,
    Step,
    wall_clock_ms,
)
from orl.pipeline.runtime.shared_decodes import SharedDecodes
from orl.schemas.errors import ServiceUnavailable

logger = logging.getLogger(__name__)
EFFECT_CALLS_PER_ROUND = 8  # rounds of this many calls per concurrent slot
MAX_RESTART_PAUSE_S = 10.0  # after a log failure, the longest pause before the stage starts again
STABLE_RUN_S = 60.0  # a start that ran this long before the log failed begins a new row of failures


@dataclass
class StreamRunner:
    log: EventLog
    processor: Processor | EffectStage
    config: PipelineConfig
    namespace: str
    metrics: Metrics = field(default_factory=Metrics)
    clock_ms: Callable[[], int] = wall_clock_ms
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
    decodes: SharedDecodes | None = None  # shared by the runners of one process (None: a private cache)
    _last_tick_s: float = 0.0
    host: ProcessorHost = field(init=False)

    def __post_init__(self) -> None:
        self.host = ProcessorHost(self.processor, self.config, self.namespace, self.metrics, self.decodes)
        self._poll_size = self.max_poll_records

    @property
    def group_id(self) -> str:
        return f"{self.namespace}.{self.processor.name}"

    @property
    def changelog(self) -> str:
        return f"{self.namespace}.{self.processor.name}.changelog"

    async def prepare(self) -> None:
        """Create every topic this processor touches, then rebuild its state from the changelog."""
        host = self.host
        names = [*host.input_topics, *host.output_topics, *host.dead_letter_topics, self.changelog]
        await self.log.create_topics([TopicSpec(name, self.partitions) for name in names])
        restore_group = f"{self.group_id}.restore"
        self.states = await read_changelog(self.log, self.changelog, restore_group, self.host)
        logger.info("%s: restored %d session states", self.processor.name, len(self.states))

    async def run(self, stop: asyncio.Event) -> None:
        """Process until `stop` is set (the embedded `orl pipeline` loop), riding out log outages.

        When the log fails (EventLogError: a Kafka call that gave up, say while brokers fail over;
        ServiceUnavailable: no broker answered a connect or a group join within its bound),
        the stage starts again in place, as a restart of its process by `orl up` would (same pauses):
        the uncommitted batch is dropped, the state is rebuilt from the changelog and the consumer
        joins its group anew, so outputs, state and offsets still agree. The pause before each new
        start grows by a second per failure in a row, up to 10 s; a start that ran a minute begins a
        new row. A record the log refuses for good (RecordRefused) is not an outage: it raises.
        """
        failures = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self._run_once(stop)
                return
            except RecordRefused:
                raise
            except (EventLogError, ServiceUnavailable) as error:
                failures = 1 if time.monotonic() - started > STABLE_RUN_S else failures + 1
                pause_s = min(float(failures), MAX_RESTART_PAUSE_S)
                logger.warning(
                    "%s: the event log failed (%s); starting the stage again in place in %.0f s",
                    self.processor.name, error, pause_s,
                )  # fmt: skip
                self.metrics.count("stage_restarts", processor=self.processor.name)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause_s)

    async def _run_once(self, stop: asyncio.Event) -> None:
        await self.prepare()
        async with self.log.consumer(self.group_id, self.host.input_topics) as consumer:
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
        async with self.log.consumer(self.group_id, self.host.input_topics) as consumer:
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
        host, states = self.host, self.states
        pending = _Pending()
        calls: list[EffectCall] = []
        round_calls = EFFECT_CALLS_PER_ROUND * self.effect_concurrency
        since_s = time.monotonic()
        states_written = 0
        for record in records:
            pending.records += 1
            pending.next_offsets[(record.topic, record.partition)] = record.offset + 1
            step = host.handle(record, states.get)
            if not step.processed:
                pending.outputs.extend(step.outputs)
                continue
            self._advance_watermark(step)
            self._apply(step.key, step.state, pending.dirty)
            pending.outputs.extend(step.outputs)
            if step.calls:
                calls.extend(step.calls)
                if len(calls) >= round_calls:
                    pending.outputs.extend(host.encode(await self._perform(calls)))
                    calls = []
                    if time.monotonic() - since_s >= self.effect_commit_interval_s:
                        states_written += await self._commit(pending)  # the states are this prefix's
                        pending, since_s = _Pending(), time.monotonic()
        if calls:
            pending.outputs.extend(host.encode(await self._perform(calls)))
        states_written += await self._commit(pending)
        host.report_metrics(len(records))
        self._poll_size = next_poll_size(
            self._poll_size, len(records), states_written, self.max_poll_records, self.max_poll_records_cap
        )

    async def _commit(self, pending: _Pending) -> int:
        """Outputs, changed states and input offsets of the records handled so far, in one
        append_and_commit; returns the number of states written."""
        outputs = pending.outputs + self._changelog_records(pending.dirty)
        offsets = {
            TopicPartition(topic, partition): offset
            for (topic, partition), offset in pending.next_offsets.items()
        }
        await self.log.append_and_commit(outputs, self.group_id, offsets)
        if self.on_commit is not None:
            self.on_commit(pending.records, self.backlog)
        return len(pending.dirty)

    async def _perform(self, calls: list[EffectCall]) -> list[Emit]:
        stage = self.host.effect
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

    def _advance_watermark(self, step: Step) -> None:
        occurred_at = step.occurred_at
        if self._watermark_ms is None or occurred_at > self._watermark_ms:
            self._watermark_ms, self._watermark_read_s = occurred_at, time.monotonic()

    async def tick(self, now_ms: int) -> None:
        """Time-based work (idle timeouts) for every stored session, committed like a batch."""
        changed, emits = self.host.tick(list(self.states.items()), now_ms)
        dirty: set[str] = set()
        for key, new_state in changed.items():
            self._apply(key, new_state, dirty)
        if emits or dirty:
            outputs = self.host.encode(emits) + self._changelog_records(dirty)
            await self.log.append_and_commit(outputs, self.group_id, {})
            self.host.report_metrics(0)

    def _apply(self, key: str, new_state: Any, dirty: set[str]) -> None:
        if new_state is None:
            self.states.pop(key, None)
        else:
            self.states[key] = new_state
        dirty.add(key)

    def _changelog_records(self, dirty: set[str]) -> list[Output]:
        records = []
        for key in sorted(dirty):
            state = self.states.get(key)
            value = b"" if state is None else self.host.state_bytes(key, state)
            records.append((self.changelog, OutgoingRecord(value=value, key=key.encode())))
        return records


@dataclass
class _Pending:
    """What a batch has handled and not yet committed."""

    records: int = 0
    outputs: list[Output] = field(default_factory=list)
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


async def read_changelog(log: EventLog, topic: str, group_id: str, host: ProcessorHost) -> dict[str, Any]:
    """The last state per key on a changelog topic (empty value = deleted; a forgotten session's
    state reads as deleted), read from the beginning."""
    states: dict[str, Any] = {}
    for record in await read_to_end(log, topic, group_id):
        key = (record.key or b"").decode()
        state = host.state_from_bytes(key, record.value) if record.value else None
        if state is not None:
            states[key] = state
        else:
            states.pop(key, None)
    return states
