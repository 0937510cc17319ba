"""faust-streaming 0.15.3's defects that rebalances between workers hit, and what works around them.

Everything here subclasses or leans on faust-streaming's private internals (its aiokafka consumer
thread, consumer and transport), so the version is pinned (pyproject.toml) and checked when a worker
starts (`check_faust_version`): another version fails loudly rather than silently losing records.
tests/integration/test_faust_multiworker.py shows each defect; docs/faust-notes.md writes them up for upstream. One of them loses records: faust can
drop records it fetched while a rebalance seeks the partitions and then commit past them. The
consumer tells the agents every offset it fetches (`PipelineConsumer`); an agent that sees a gap
holding fetched offsets it never handled reads those records from the broker and handles them
first (`InputProgress`, `SkippedRecordReader`).

Reads: input topics directly, for skipped records. Writes nothing itself.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalOperation
from faust.transport.consumer import RecordMap
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP
from orl.connectors.event_log.base import ConsumedRecord
from orl.schemas.errors import ConfigError

logger = logging.getLogger(__name__)

FAUST_STREAMING_VERSION = "0.15.3"  # the version these patches were written and tested against


def check_faust_version(installed: str | None = None) -> None:
    """Raise ConfigError unless the installed faust-streaming is the one these patches fit."""
    found = installed or importlib.metadata.version("faust-streaming")
    if found != FAUST_STREAMING_VERSION:
        raise ConfigError(
            f"the faust runtime needs faust-streaming=={FAUST_STREAMING_VERSION} (its consumer is patched "
            f"against that version's internals), found {found}: pip install "
            f"faust-streaming=={FAUST_STREAMING_VERSION}"
        )


class InputProgress:
    """Which records of one partition an agent handled, and which its consumer fetched (pure bookkeeping).

    faust-streaming 0.15.3 can drop records it fetched while a rebalance seeks partitions, and its
    commit then passes them (it tolerates one missing record at the committed offset, and checks
    nothing in a partition without a committed offset). A dropped record was fetched and never
    handled; a transaction marker takes an offset but is never fetched. The consumer numbers its
    fetches (rounds) and hands records to an agent's stream in fetch order, so a fetched record
    that is not handled was skipped once the agent handles a later record of its partition, or
    any record from a later fetch round. `last` is the offset last handled in `generation`.
    """

    def __init__(self) -> None:
        self.generation: int | None = None
        self.last = -1
        self.fetched: dict[int, tuple[int, int]] = {}  # offset -> (generation, round), until handled

    def note_fetched(self, offsets: Sequence[int], generation: int, fetch_round: int) -> None:
        for offset in offsets:
            self.fetched[offset] = (generation, fetch_round)

    def begin(self, generation: int) -> None:
        """A new consumer generation starts over: faust delivers nothing fetched before it and seeks anew."""
        if generation != self.generation:
            self.generation, self.last = generation, -1
            self.fetched = {o: seen for o, seen in self.fetched.items() if seen[0] == generation}

    def is_redelivery(self, offset: int) -> bool:
        if offset <= self.last:
            self.fetched.pop(offset, None)
            return True
        return False

    def fetch_round(self, offset: int) -> int | None:
        seen = self.fetched.get(offset)
        return None if seen is None else seen[1]

    def skipped_before(self, offset: int) -> list[int]:
        """Offsets before `offset` fetched and never handled: skipped (forgotten here, the caller handles them)."""
        if offset == self.last + 1:
            return []
        return self._take(lambda o, _: o < offset)

    def skipped_in_rounds_before(self, fetch_round: int) -> list[int]:
        """Offsets fetched in a round before `fetch_round` and never handled: skipped (forgotten here)."""
        return self._take(lambda _, seen: seen[1] < fetch_round)

    def handled(self, offset: int) -> None:
        self.last = max(self.last, offset)
        self.fetched.pop(offset, None)

    def _take(self, chosen: Callable[[int, tuple[int, int]], bool]) -> list[int]:
        taken = sorted(o for o, seen in self.fetched.items() if chosen(o, seen))
        for offset in taken:
            del self.fetched[offset]
        return [o for o in taken if o > self.last]


class SkippedRecordReader:
    """Reads a range of one partition straight from the broker (read_committed), for records a stream skipped.

    One consumer without a group, started on first use and shared by a worker's agents.
    """

    def __init__(self, broker_url: str, timeout_s: float = 60.0) -> None:
        self.bootstrap = broker_url.replace(";", ",")
        self.timeout_s = timeout_s
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[ConsumedRecord]:
        """The records of `topic`[`partition`] with offsets in [start, end), in offset order."""
        async with self._lock:
            consumer = await self._started()
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, start)
            records: list[ConsumedRecord] = []
            deadline = time.monotonic() + self.timeout_s
            while await consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"reading {topic}[{partition}] offsets {start}..{end - 1} took over {self.timeout_s} s"
                    )
                batch = await consumer.getmany(tp, timeout_ms=500)
                records += [
                    ConsumedRecord(
                        r.topic, r.partition, r.offset, r.key, r.value or b"", timestamp_ms=r.timestamp
                    )
                    for r in batch.get(tp, [])
                    if start <= r.offset < end
                ]
            return records

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
                auto_offset_reset="earliest",
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None


class PipelineConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    async def _highwaters(self, partitions: list[Any]) -> Any:
        """Changelog highwaters from the broker's last stable offset, not from the last fetch.

        Under exactly_once, faust-streaming 0.15.3 takes them from the consumer's cached last stable
        offset, None until the partition has been fetched since the assignment, so recovery sees
        highwater -1: a worker holding a standby offset then crashes (ConsistencyError "persisted
        offset ... is higher than the last offset", faust-streaming/faust#158; seen here), and by
        the recovery code a new owner would skip restoring the partition's Table. `end_offsets` on
        this read_committed consumer asks the broker; under at_least_once faust does that already.
        """
        return await self._ensure_consumer().end_offsets(partitions)


class PipelineApp(faust.App):
    """faust.App with the agents to tell about every fetch (ProcessorAgent.note_fetched)."""

    def __init__(self, id: str, **options: Any) -> None:
        super().__init__(id, **options)
        self.fetch_listeners: list[Callable[[str, int, Sequence[int], int], None]] = []


class PipelineConsumer(faust_aiokafka.Consumer):
    fetch_round = 0
    _fetched: dict[TP, set[int]] | None = None  # per partition: fetched offsets not yet committed past

    async def _wait_next_records(self, timeout: float) -> tuple[RecordMap | None, set[TP] | None]:
        """faust's fetch, then every fetched offset to the agents (with this fetch's number), before any is delivered."""
        records, active_partitions = await super()._wait_next_records(timeout)
        if records:
            self.fetch_round += 1
            listeners = cast(PipelineApp, self.app).fetch_listeners
            for tp, batch in records.items():
                offsets = [record.offset for record in batch]
                self.fetched_offsets(tp).update(offsets)
                for listener in listeners:
                    listener(tp.topic, tp.partition, offsets, self.fetch_round)
        return records, active_partitions

    def fetched_offsets(self, tp: TP) -> set[int]:
        if self._fetched is None:
            self._fetched = {}
        return self._fetched.setdefault(tp, set())

    def _new_offset(self, tp: TP) -> int | None:
        """faust's next commit offset for `tp`, unless it would pass a fetched record that no agent handled.

        The head-gap defect (docs/faust-notes.md): faust-streaming 0.15.3 commits past ONE missing
        offset at the head of the acknowledged ones (meant for a transaction's commit marker, which
        takes an offset and is never fetched) and checks the head not at all in a partition with no
        committed offset (or one committed at 0). A data record fetched there and dropped by a
        rebalance was then committed past and lost. Fetched offsets are known here, so the commit
        waits until such a record is handled (the agents re-read it: InputProgress). Called by faust
        before it mutates its acknowledged list, so returning None keeps every acknowledgement.
        """
        acked = self._acked[tp]
        if acked:
            committed = self._committed_offset[tp]
            fetched = self.fetched_offsets(tp)
            start = committed if committed is not None else min(fetched, default=min(acked))
            gap = self._gap[tp]
            head = min(acked)
            unhandled = [
                o
                for o in range(start, head)
                if o in fetched and o not in self._acked_index[tp] and not gap[o]
            ]
            if unhandled:
                logger.warning(
                    "%s: not committing past fetched offsets %s that no agent handled yet", tp, unhandled[:10]
                )
                return None
        offset = cast(int | None, super()._new_offset(tp))
        if offset is not None:
            fetched = self.fetched_offsets(tp)
            fetched.difference_update([o for o in fetched if o < offset])
        return offset

    def acknowledge(self, topic: str, partition: int, offsets: Sequence[int]) -> None:
        """Mark records an agent handled outside faust's stream as acknowledged, as `Consumer.ack` does.

        Without this, faust's commit of the partition would stop at the first of them for good.
        """
        tp = TopicPartition(topic, partition)  # what faust's messages carry, and what aiokafka commits
        committed = self._committed_offset[tp]
        for offset in offsets:  # on the event loop's thread, as faust's own acks from the agents
            if (committed is None or offset >= committed) and offset not in self._acked_index[tp]:
                self._acked_index[tp].add(offset)
                self._acked[tp].append(offset)
                self._n_acked += 1

    async def _commit_offsets(self, offsets: Any, start_new_transaction: bool = True) -> bool:
        """Send every buffered Table write before the offsets commit (docs/faust-notes.md, section 5).

        A Table write (`table[key] = value`) only queues its changelog record in faust's producer
        buffer. faust-streaming 0.15.3 flushes that buffer before an at_least_once commit but not
        before a transactional one, so under load (the buffer holds over 100 writes) the offsets of
        records commit in one transaction and their state changes go into the next. If a rebalance
        then moves the partition, the new owner's producer fences this one, that next transaction
        aborts, and the new owner restores a state without those changes and starts after their
        records: they are lost (seen on real Kafka: 6-10 of 1,000 sessions lost their first turn with
        two workers). Flushed first, the writes are in the transaction that commits their offsets.
        """
        await self.app.producer.buffer.flush()
        return cast(bool, await super()._commit_offsets(offsets, start_new_transaction=start_new_transaction))

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return PipelineConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def commit_and_end_transactions(self) -> None:
        """The last commit at stop, which must not stop the worker from leaving its group.

        faust-streaming 0.15.3 ends the transactions twice on stop (the app's wait for streams, then
        the consumer's): offsets of records processed in between have no open transaction, the
        commit raises IllegalOperation and the consumer never sends LeaveGroup, so its partitions
        wait for the session timeout. Those records' Table writes failed with the same error; the
        partitions' next owner processes them again from the committed offsets.
        """
        try:
            await super().commit_and_end_transactions()
        except IllegalOperation as error:
            logger.warning("last offsets not committed at stop, the next owner reprocesses them: %s", error)


class PipelineTransport(faust_aiokafka.Transport):
    Consumer = PipelineConsumer
