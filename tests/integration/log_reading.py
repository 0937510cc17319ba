"""Read every event of a topic back from a real event log (tests only)."""

from __future__ import annotations

from typing import Any

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.event_log.reading import read_to_end
from orl.schemas.codec import decode


async def read_events(log_url: str, topic: str) -> list[dict[str, Any]]:
    """All events on `topic`, decoded, in offset order per partition."""
    async with open_event_log(log_url) as log:
        return [decode(record.value) for record in await read_to_end(log, topic)]
