"""The DeadLettered event for an input record that cannot be decoded, the same on every runtime.

Written to `<source topic>.dlq` with the original bytes, so nothing is lost and it can be replayed
after a fix. Reads and writes no topics itself.
"""

from __future__ import annotations

from typing import Any

from schemas.events import make_event

PRODUCER = "pipeline/0.1.0"


def dead_letter_event(
    namespace: str, topic: str, partition: int, offset: int, value: bytes, error: str, timestamp_ms: int
) -> dict[str, Any]:
    return make_event(
        "DeadLettered",
        namespace=namespace,
        producer=PRODUCER,
        occurred_at_ms=timestamp_ms,
        id_parts=[topic, partition, offset],
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        original_bytes=value,
        error=error,
    )
