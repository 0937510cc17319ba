"""`orl export`: a namespace as JSON lines, one decoded event per line, for analysis.

Each line is `{"topic", "partition", "offset", "timestamp_ms", "event"}` with the event decoded by
the codec (an event whose payload was forgotten, `orl forget`, as `{"envelope": ..., "payload_forgotten":
true}`); bytes fields (a dead letter's original bytes) become base64 strings. Topics are
written in catalog order, records in offset order per partition.
Reads: the catalog topics of the namespace (and their dead-letter topics with `dead_letters`).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import IO, Any

from orl.connectors.event_log.base import EventLog
from orl.pipeline.history.namespace_io import catalog_topics, read_batches
from orl.schemas.codec import decode_or_forgotten
from orl.schemas.topics import dlq_topic


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value


async def export_namespace(
    log: EventLog,
    namespace: str,
    out: IO[str],
    dead_letters: bool = True,
    progress: Callable[[int], None] = lambda n: None,
) -> int:
    """Write every event of the namespace to `out`; returns the number of lines."""
    lines = 0
    topics = catalog_topics(namespace)
    if dead_letters:
        topics += [dlq_topic(t) for t in catalog_topics(namespace)]
    for topic in topics:
        async for records in read_batches(log, topic):
            for r in records:
                row = {
                    "topic": r.topic,
                    "partition": r.partition,
                    "offset": r.offset,
                    "timestamp_ms": r.timestamp_ms,
                    "event": jsonable(decode_or_forgotten(r.value)),
                }
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
            lines += len(records)
            progress(len(records))
    return lines
