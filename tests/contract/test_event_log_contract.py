"""The event-log contract: every implementation (SQLite, Kafka on the Apache Kafka test broker) must pass it.

Each test uses fresh topic and group names, so tests share one broker without seeing each other.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
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
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.partitioner import partition_for_key
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.event_log.topic_policy import TopicPolicy

pytestmark = pytest.mark.timeout(60)

LogFactory = Callable[..., EventLog]  # keyword options go to the log's constructor


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> LogFactory:
    """Makes unstarted logs that all talk to the same store (one SQLite file or one broker)."""
    if request.param == "sqlite":
        return lambda **options: SqliteEventLog(tmp_path / "log.db", **options)
    bootstrap = request.getfixturevalue("kafka_bootstrap")
    return lambda **options: KafkaEventLog(bootstrap, **options)


@pytest.fixture
async def event_log(make_log: LogFactory) -> AsyncIterator[EventLog]:
    async with make_log() as log:
        yield log


def new_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def new_topic(log: EventLog, partitions: int = 1) -> str:
    topic = new_name("topic")
    await log.create_topics([TopicSpec(topic, partitions)])
    return topic


async def poll_until(consumer: Consumer, count: int, timeout_s: float = 20.0) -> list[ConsumedRecord]:
    """Poll until `count` records arrived (fail after timeout_s)."""
    records: list[ConsumedRecord] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count:
        assert time.monotonic() < deadline, f"got {len(records)} of {count} records in {timeout_s} s"
        records += await consumer.poll(max_records=count - len(records), timeout_s=0.5)
    return records


def sample_records(n: int) -> list[OutgoingRecord]:
    return [
        OutgoingRecord(
            f"value-{i}".encode(), key=f"key-{i % 7}".encode(), headers=(("i", str(i).encode()), ("e", b""))
        )
        for i in range(n)
    ]


async def test_append_then_read_back_identical(event_log: EventLog) -> None:
    topic = await new_topic(event_log, partitions=3)
    single = OutgoingRecord(
        b"\x00first\xff", key=b"k-0", headers=(("trace", b"\x01\x02"), ("trace", b"again"))
    )
    batch = sample_records(20) + [OutgoingRecord(b"no key, no headers")]
    positions = [await event_log.append(topic, single)] + await event_log.append_batch(topic, batch)
    async with event_log.consumer(new_name("group"), [topic]) as consumer:
        records = await poll_until(consumer, len(positions))
    by_position = {(r.partition, r.offset): r for r in records}
    assert len(by_position) == len(positions)
    for sent, position in zip([single, *batch], positions, strict=True):
        got = by_position[(position.partition, position.offset)]
        assert (got.topic, got.key, got.value, got.headers) == (topic, sent.key, sent.value, sent.headers)
        assert got.timestamp_ms > 0


async def test_same_key_same_partition_as_kafka_default_partitioner(event_log: EventLog) -> None:
    topic = await new_topic(event_log, partitions=5)
    keys = [f"session-{i}".encode() for i in range(30)]
    positions = await event_log.append_batch(topic, [OutgoingRecord(b"v", key=key) for key in keys * 2])
    assert [p.partition for p in positions] == [partition_for_key(key, 5) for key in keys * 2]
    assert len({p.partition for p in positions}) > 1


async def test_records_come_in_offset_order_per_partition(event_log: EventLog) -> None:
    topic = await new_topic(event_log, partitions=2)
    await event_log.append_batch(topic, sample_records(50))
    async with event_log.consumer(new_name("group"), [topic]) as consumer:
        records = await poll_until(consumer, 50)
    for partition in (0, 1):
        offsets = [r.offset for r in records if r.partition == partition]
        assert offsets == sorted(offsets) == list(range(len(offsets)))


async def test_new_member_resumes_at_committed_offset(event_log: EventLog) -> None:
    topic, group = await new_topic(event_log), new_name("group")
    tp = TopicPartition(topic, 0)
    await event_log.append_batch(topic, sample_records(10))
    async with event_log.consumer(group, [topic]) as first:
        assert await first.committed(tp) is None
        await poll_until(first, 10)
        await first.commit({tp: 4})
    async with event_log.consumer(group, [topic]) as second:
        assert await second.committed(tp) == 4
        records = await poll_until(second, 6)
        assert [r.offset for r in records] == list(range(4, 10))
        await second.commit()
        assert await second.committed(tp) == 10


async def wait_for_split(members: list[Consumer], all_tps: set[TopicPartition]) -> list[set[TopicPartition]]:
    """Poll every member until their assignments are non-empty, disjoint and cover all_tps."""
    deadline = time.monotonic() + 30
    while True:
        owned = [await member.assignment() for member in members]
        if all(owned) and sum(map(len, owned)) == len(all_tps) and set().union(*owned) == all_tps:
            return owned
        assert time.monotonic() < deadline, f"no clean split of {all_tps}: {owned}"
        for member in members:
            assert await member.poll(timeout_s=0.2) == []


async def test_two_members_split_partitions_and_see_each_record_once(make_log: LogFactory) -> None:
    async with make_log() as log_a, make_log() as log_b:
        topic, group = await new_topic(log_a, partitions=4), new_name("group")
        all_tps = {TopicPartition(topic, p) for p in range(4)}
        async with log_a.consumer(group, [topic]) as a, log_b.consumer(group, [topic]) as b:
            owned_a, owned_b = await wait_for_split([a, b], all_tps)
            sent = sample_records(40)
            await log_a.append_batch(topic, sent)
            seen: list[ConsumedRecord] = []
            deadline = time.monotonic() + 20
            while len(seen) < len(sent) and time.monotonic() < deadline:
                for member, owned in ((a, owned_a), (b, owned_b)):
                    batch = await member.poll(timeout_s=0.2)
                    assert {r.topic_partition for r in batch} <= owned
                    seen += batch
    assert sorted(r.value for r in seen) == sorted(r.value for r in sent)


async def test_seek_to_beginning_offset_and_timestamp(event_log: EventLog) -> None:
    topic = await new_topic(event_log)
    tp = TopicPartition(topic, 0)
    await event_log.append_batch(topic, sample_records(5))
    await asyncio.sleep(0.02)
    split_ms = time.time_ns() // 1_000_000
    await asyncio.sleep(0.02)
    await event_log.append_batch(topic, sample_records(5))
    async with event_log.consumer(new_name("group"), [topic]) as consumer:
        await poll_until(consumer, 10)
        await consumer.seek_to_beginning()
        assert [r.offset for r in await poll_until(consumer, 2)] == [0, 1]
        await consumer.seek(tp, 7)
        assert [r.offset for r in await poll_until(consumer, 3)] == [7, 8, 9]
        await consumer.seek_to_timestamp(split_ms)
        records = await poll_until(consumer, 5)
        assert [r.offset for r in records] == [5, 6, 7, 8, 9]
        assert all(r.timestamp_ms >= split_ms for r in records)
        await consumer.seek_to_timestamp(split_ms + 3_600_000)
        assert await consumer.poll(timeout_s=0.3) == []
        with pytest.raises(EventLogError):
            await consumer.seek(TopicPartition(topic, 9), 0)


async def test_end_offsets(event_log: EventLog) -> None:
    topic = await new_topic(event_log, partitions=3)
    assert await event_log.end_offsets(topic) == {0: 0, 1: 0, 2: 0}
    positions = await event_log.append_batch(topic, sample_records(25))
    expected = {p: 0 for p in range(3)}
    for position in positions:
        expected[position.partition] = max(expected[position.partition], position.offset + 1)
    assert await event_log.end_offsets(topic) == expected
    assert sum(expected.values()) == 25


async def test_lag(event_log: EventLog) -> None:
    topic = await new_topic(event_log)
    tp = TopicPartition(topic, 0)
    await event_log.append_batch(topic, sample_records(10))
    async with event_log.consumer(new_name("group"), [topic]) as consumer:
        assert await consumer.lag() == {tp: 10}
        await consumer.commit({tp: 4})
        assert await consumer.lag() == {tp: 6}
        await poll_until(consumer, 10)
        await consumer.commit()
        assert await consumer.lag() == {tp: 0}


async def test_append_and_commit_is_all_or_nothing(event_log: EventLog) -> None:
    source, sink, group = await new_topic(event_log), await new_topic(event_log, 2), new_name("group")
    tp = TopicPartition(source, 0)
    await event_log.append_batch(source, sample_records(6))
    with pytest.raises(EventLogError):  # the second output's topic does not exist: nothing may happen
        await event_log.append_and_commit(
            [(sink, OutgoingRecord(b"lost")), (new_name("missing"), OutgoingRecord(b"x"))], group, {tp: 3}
        )
    outputs = [(sink, OutgoingRecord(f"out-{i}".encode(), key=f"k{i}".encode())) for i in range(4)]
    await event_log.append_and_commit(outputs, group, {tp: 6})
    async with event_log.consumer(group, [source]) as processor:
        assert await processor.committed(tp) == 6
        assert await processor.poll(timeout_s=0.3) == []
    async with event_log.consumer(new_name("reader"), [sink]) as reader:
        records = await poll_until(reader, 4)
        assert await reader.poll(timeout_s=0.3) == []
    assert sorted(r.value for r in records) == [f"out-{i}".encode() for i in range(4)]


async def test_create_topics_is_idempotent(event_log: EventLog) -> None:
    first, second = new_name("topic"), new_name("topic")
    await event_log.create_topics([TopicSpec(first, 3)])
    await event_log.create_topics([TopicSpec(first, 3), TopicSpec(second, 2)])
    await event_log.create_topics([TopicSpec(first, 5)])
    assert await event_log.partitions_for(first) == 3
    assert await event_log.partitions_for(second) == 2


async def test_unknown_topic_is_refused(event_log: EventLog) -> None:
    missing = new_name("missing")
    with pytest.raises(EventLogError, match=missing):
        await event_log.partitions_for(missing)
    with pytest.raises(EventLogError, match=missing):
        await event_log.append(missing, OutgoingRecord(b"v"))
    with pytest.raises(EventLogError, match=missing):  # and the attempts did not create it
        await event_log.partitions_for(missing)


async def test_a_reader_reaches_the_end_of_a_topic_written_in_transactions(event_log: EventLog) -> None:
    """On Kafka a committed transaction ends in a marker that takes an offset but is no record: the
    end offset is one past the last record, and only the consumer's position says it was reached."""
    topic = await new_topic(event_log)
    tp = TopicPartition(topic, 0)
    for batch in range(3):
        outputs = [(topic, OutgoingRecord(f"b{batch}-{i}".encode(), key=b"k")) for i in range(2)]
        await event_log.append_and_commit(outputs, new_name("writer"), {})
    end = (await event_log.end_offsets(topic))[0]
    records = await asyncio.wait_for(read_to_end(event_log, topic), timeout=30)
    assert [r.value for r in records] == [f"b{b}-{i}".encode() for b in range(3) for i in range(2)]
    async with event_log.consumer(new_name("reader"), [topic]) as consumer:
        assert await consumer.position(tp) == 0
        await poll_until(consumer, 6)
        deadline = time.monotonic() + 20
        while await consumer.position(tp) < end:  # past the last marker once it is fetched
            assert time.monotonic() < deadline, f"position {await consumer.position(tp)}, end {end}"
            assert await consumer.poll(timeout_s=0.3) == []


async def test_a_record_over_the_limit_is_refused_and_the_others_of_its_batch_are_appended(
    make_log: LogFactory,
) -> None:
    async with make_log(policy=TopicPolicy(max_record_bytes=2048)) as log:
        topic = await new_topic(log)
        batch = [OutgoingRecord(b"a", b"k"), OutgoingRecord(b"x" * 2049, b"k"), OutgoingRecord(b"b", b"k")]
        with pytest.raises(RecordRefused, match="2049 bytes exceeds --max-record-bytes 2048") as refused:
            await log.append_batch(topic, batch)
        assert refused.value.topic == topic
        assert list(refused.value.refused) == [1]
        assert [position is None for position in refused.value.positions] == [False, True, False]
        assert [r.value for r in await read_to_end(log, topic)] == [b"a", b"b"]
        assert (await log.append(topic, OutgoingRecord(b"x" * 2048, b"k"))).offset >= 2  # at the limit: fine
