"""SampleStream: every sample read once, from the manifest's offsets, whatever the consumer delivers.

The consumer is scripted: each poll returns the records the test queued (as a rebalance or a
transactional topic would deliver them), and the test checks what the stream accepted and where
it sought.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from orl.connectors.event_log.base import ConsumedRecord, Consumer, TopicPartition
from orl.trainer.sample_stream import SampleStream

TOPIC = "live.samples"
P0, P1 = TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)


class ScriptedConsumer(Consumer):
    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = set(assigned)
        self.batches: list[list[ConsumedRecord]] = []
        self.seeks: list[tuple[TopicPartition, int | str]] = []

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[ConsumedRecord]:
        return self.batches.pop(0) if self.batches else []

    async def position(self, tp: TopicPartition) -> int:
        return 0

    async def lag(self) -> dict[TopicPartition, int]:
        return {}

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None: ...

    async def committed(self, tp: TopicPartition) -> int | None:
        return None

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    async def seek_to_beginning(self, tps: Sequence[TopicPartition] | None = None) -> None:
        self.seeks += [(tp, "beginning") for tp in tps or ()]

    async def seek_to_timestamp(
        self, timestamp_ms: int, tps: Sequence[TopicPartition] | None = None
    ) -> None: ...


def records(tp: TopicPartition, *offsets: int) -> list[ConsumedRecord]:
    return [ConsumedRecord(tp.topic, tp.partition, offset, b"k", b"v%d" % offset) for offset in offsets]


def offsets(accepted: list[ConsumedRecord]) -> list[tuple[int, int]]:
    return [(record.partition, record.offset) for record in accepted]


def test_partitions_start_at_the_manifest_offsets_or_the_beginning() -> None:
    consumer = ScriptedConsumer({P0, P1})
    stream = SampleStream(consumer, {P0: 5})
    consumer.batches = [records(P0, 5, 6) + records(P1, 0, 1)]
    accepted = asyncio.run(stream.poll(100, 0.1))
    assert consumer.seeks == [(P0, 5), (P1, "beginning")]
    assert offsets(accepted) == [(0, 5), (0, 6), (1, 0), (1, 1)]


def test_a_redelivery_below_the_expected_offset_is_dropped_and_sought_past() -> None:
    consumer = ScriptedConsumer({P0})
    stream = SampleStream(consumer, {P0: 5})

    async def run() -> list[list[ConsumedRecord]]:
        consumer.batches = [records(P0, 5, 6), records(P0, 3, 4, 5, 6, 7), records(P0, 7, 8)]
        return [await stream.poll(100, 0.1) for _ in range(3)]

    first, redelivered, after = asyncio.run(run())
    assert offsets(first) == [(0, 5), (0, 6)]
    assert redelivered == []  # the rest of that partition's batch is not trusted either
    assert consumer.seeks[-1] == (P0, 7)
    assert offsets(after) == [(0, 7), (0, 8)]


def test_offsets_that_hold_no_record_are_skipped_over() -> None:
    """On Kafka each transaction's commit marker takes an offset: the next record is further on."""
    consumer = ScriptedConsumer({P0})
    stream = SampleStream(consumer, {P0: 0})
    consumer.batches = [records(P0, 0, 1, 3, 4, 6)]
    assert offsets(asyncio.run(stream.poll(100, 0.1))) == [(0, 0), (0, 1), (0, 3), (0, 4), (0, 6)]


def test_a_partition_handed_over_between_polls_is_positioned_before_it_is_read() -> None:
    consumer = ScriptedConsumer({P0})
    stream = SampleStream(consumer, {P0: 2, P1: 10})

    async def run() -> list[list[ConsumedRecord]]:
        consumer.batches = [records(P0, 2)]
        first = await stream.poll(100, 0.1)
        consumer.assigned.add(P1)  # a rebalance: the group's committed offset for P1 trails the manifest
        consumer.batches = [records(P1, 7, 8) + records(P0, 3), records(P1, 10, 11)]
        return [first, await stream.poll(100, 0.1), await stream.poll(100, 0.1)]

    first, handed_over, positioned = asyncio.run(run())
    assert offsets(first) == [(0, 2)]
    assert offsets(handed_over) == [(0, 3)] and consumer.seeks[1:] == [(P1, 10), (P1, 10)]
    assert offsets(positioned) == [(1, 10), (1, 11)]


def test_records_of_a_partition_assigned_during_the_poll_wait_for_its_positioning() -> None:
    consumer = ScriptedConsumer({P0})
    stream = SampleStream(consumer, {P0: 0, P1: 4})
    consumer.batches = [records(P0, 0) + records(P1, 1, 2), records(P1, 4)]
    real_poll = consumer.poll

    async def poll_with_rebalance(max_records: int = 500, timeout_s: float = 1.0) -> list[ConsumedRecord]:
        consumer.assigned.add(P1)  # assigned while the poll ran, read from the group's offset 1
        return await real_poll(max_records, timeout_s)

    consumer.poll = poll_with_rebalance  # type: ignore[method-assign]

    async def run() -> list[list[ConsumedRecord]]:
        return [await stream.poll(100, 0.1), await stream.poll(100, 0.1)]

    racing, positioned = asyncio.run(run())
    assert offsets(racing) == [(0, 0)]  # P1's records are not trusted: it was not positioned
    assert (P1, 4) in consumer.seeks and offsets(positioned) == [(1, 4)]
