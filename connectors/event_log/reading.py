"""Reading a whole topic, from its first record to its current end (tools, restores, tests)."""

from __future__ import annotations

import uuid

from orl.connectors.event_log.base import ConsumedRecord, Consumer, EventLog, TopicPartition


async def read_to_end(log: EventLog, topic: str, group_id: str | None = None) -> list[ConsumedRecord]:
    """Every record now on `topic`, in offset order per partition. Commits nothing."""
    ends = await log.end_offsets(topic)
    records: list[ConsumedRecord] = []
    if not any(ends.values()):
        return records
    async with log.consumer(group_id or f"reader-{uuid.uuid4().hex}", [topic]) as consumer:
        await consumer.seek_to_beginning()
        topic_partitions = sorted(await consumer.assignment())
        while not await reached(consumer, topic_partitions, ends):
            for record in await consumer.poll(max_records=5000, timeout_s=1.0):
                if record.offset < ends[record.partition]:
                    records.append(record)
    return records


async def reached(consumer: Consumer, topic_partitions: list[TopicPartition], ends: dict[int, int]) -> bool:
    """Whether the consumer's position is at or past `ends` in every partition. Positions, not the
    offsets of the records read: on Kafka a topic written in transactions ends in a commit marker,
    which no record has."""
    for tp in topic_partitions:
        if await consumer.position(tp) < ends[tp.partition]:
            return False
    return True
