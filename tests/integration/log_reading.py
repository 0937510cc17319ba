"""Read every event of a topic back from a real event log (tests only)."""

from __future__ import annotations

import uuid
from typing import Any

from connectors.event_log.factory import open_event_log
from schemas.codec import decode


async def read_events(log_url: str, topic: str) -> list[dict[str, Any]]:
    """All events on `topic`, decoded, in offset order per partition."""
    async with open_event_log(log_url) as log:
        ends = await log.end_offsets(topic)
        if not any(ends.values()):
            return []
        events: list[dict[str, Any]] = []
        async with log.consumer(f"test-reader-{uuid.uuid4().hex}", [topic]) as consumer:
            positions = dict.fromkeys(ends, 0)
            while any(positions[p] < ends[p] for p in ends):
                for record in await consumer.poll(max_records=1000, timeout_s=1.0):
                    positions[record.partition] = record.offset + 1
                    events.append(decode(record.value))
        return events
