"""Reading a whole topic, from its first record to its current end (tools, restores, tests)."""

from __future__ import annotations

import uuid

from connectors.event_log.base import ConsumedRecord, EventLog


async def read_to_end(log: EventLog, topic: str, group_id: str | None = None) -> list[ConsumedRecord]:
    """Every record now on `topic`, in offset order per partition. Commits nothing."""
    ends = await log.end_offsets(topic)
    records: list[ConsumedRecord] = []
    if not any(ends.values()):
        return records
    async with log.consumer(group_id or f"reader-{uuid.uuid4().hex}", [topic]) as consumer:
        await consumer.seek_to_beginning()
        positions = dict.fromkeys(ends, 0)
        while any(positions[p] < ends[p] for p in ends):
            for record in await consumer.poll(max_records=5000, timeout_s=1.0):
                if record.offset < ends[record.partition]:
                    positions[record.partition] = record.offset + 1
                    records.append(record)
    return records
