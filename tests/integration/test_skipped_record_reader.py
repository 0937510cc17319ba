"""SkippedRecordReader on the Kafka test broker: the records of an offset range, never markers or aborted ones.

A faust agent calls it for records its consumer fetched and its stream never delivered
(orl.pipeline.runtime.faust_patches.InputProgress), so it must return exactly the committed records of the
range: the range may also hold transaction markers (no record) or records of aborted
transactions (never handled). Writes the topic `sr.records` on the session's test broker.
"""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from orl.connectors.event_log.base import ConsumedRecord
from orl.pipeline.runtime.faust_patches import SkippedRecordReader

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

TOPIC = "sr.records"


async def write(bootstrap: str) -> dict[bytes, int]:
    """Partition 0: a, b (plain), c, d (committed transaction), x, y (aborted), e (plain): value -> offset."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(TOPIC, 1, 1)])
    finally:
        await admin.close()
    offsets: dict[bytes, int] = {}
    plain = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    transactional = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="sr-writer")
    await plain.start()
    await transactional.start()
    try:
        for value in (b"a", b"b"):
            offsets[value] = (await plain.send_and_wait(TOPIC, value, partition=0)).offset
        for values, commit in (((b"c", b"d"), True), ((b"x", b"y"), False)):
            await transactional.begin_transaction()
            for value in values:
                offsets[value] = (await (await transactional.send(TOPIC, value, partition=0))).offset
            if commit:
                await transactional.commit_transaction()
            else:
                await transactional.abort_transaction()
        offsets[b"e"] = (await plain.send_and_wait(TOPIC, b"e", partition=0)).offset
    finally:
        await transactional.stop()
        await plain.stop()
    return offsets


async def test_reads_the_committed_records_of_a_range_and_nothing_else(kafka_bootstrap: str) -> None:
    offsets = await write(kafka_bootstrap)
    # markers take offsets: the commit marker after d comes before x (a transaction begins once the
    # last one's markers are written); the abort marker after y is written when the abort completes,
    # so the plain e may land before or after it
    assert offsets[b"x"] == offsets[b"d"] + 2 and offsets[b"e"] > offsets[b"y"]
    reader = SkippedRecordReader(kafka_bootstrap, timeout_s=20)
    try:
        await check_ranges(reader, offsets)
    finally:
        await reader.close()


def values(records: list[ConsumedRecord]) -> list[bytes]:
    return [record.value for record in records]


async def check_ranges(reader: SkippedRecordReader, offsets: dict[bytes, int]) -> None:
    everything = await reader.read(TOPIC, 0, 0, offsets[b"e"] + 1)
    assert values(everything) == [b"a", b"b", b"c", b"d", b"e"]
    assert [r.offset for r in everything] == [offsets[v] for v in (b"a", b"b", b"c", b"d", b"e")]
    assert all(r.topic == TOPIC and r.partition == 0 and r.timestamp_ms > 0 for r in everything)
    # the gap an agent sees between d and e: a marker, an aborted transaction and another marker
    assert await reader.read(TOPIC, 0, offsets[b"d"] + 1, offsets[b"e"]) == []
    # a record skipped at the head of a range, and a range ending before the last record
    assert values(await reader.read(TOPIC, 0, offsets[b"b"], offsets[b"d"])) == [b"b", b"c"]
    # the reader is reused for every range (one consumer per worker)
    assert values(await reader.read(TOPIC, 0, 0, offsets[b"b"])) == [b"a"]
