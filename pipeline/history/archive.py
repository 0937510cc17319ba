"""Archive: every topic of a namespace copied to the object store as Avro container files.

Object keys (one segment per topic, partition and offset range, plus one index per topic):
  archive/<namespace>/<topic>/<partition>/<first offset, 20 digits>-<last offset, 20 digits>.avro
  archive/<namespace>/<topic>/index.json
A segment holds the raw record bytes exactly as on the log (the Avro single-object encoded event)
plus its key, offset, timestamp and headers. The index lists the segments and is written after
them, so it is the truth about what is archived: a crash between a segment and its index leaves
an unlisted object that the next run overwrites. Archiving is incremental (each run continues
after the last archived offset per partition). `restore` appends the archived records back onto
a log, in offset order per partition (same values, keys and partitions; the log assigns new
timestamps), skipping what the target partition already holds.
Reads: every topic of the namespace (orl.pipeline.history.namespace_io.namespace_topics). Writes: archive/ keys.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastavro import parse_schema, reader, writer
from orl.connectors.event_log.base import ConsumedRecord, EventLog, OutgoingRecord, TopicSpec
from orl.connectors.object_store.base import ObjectNotFound, ObjectStore
from orl.pipeline.history.namespace_io import namespace_topics, partition_count, read_batches
from orl.schemas.errors import OrlError

ARCHIVE_PREFIX = "archive"
INDEX_NAME = "index.json"
SEGMENT_RECORDS = 50_000
SEGMENT_SCHEMA = parse_schema(
    {
        "type": "record",
        "name": "ArchivedRecord",
        "namespace": "orl.archive",
        "fields": [
            {"name": "topic", "type": "string"},
            {"name": "partition", "type": "int"},
            {"name": "offset", "type": "long"},
            {"name": "timestamp_ms", "type": "long"},
            {"name": "key", "type": ["null", "bytes"]},
            {"name": "value", "type": "bytes"},
            {
                "name": "headers",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Header",
                        "fields": [{"name": "name", "type": "string"}, {"name": "value", "type": "bytes"}],
                    },
                },
            },
        ],
    }
)


class ArchiveError(OrlError):
    """The archive is missing, inconsistent with its index, or cannot be restored onto the target."""


@dataclass
class TopicIndex:
    topic: str
    partitions: int
    segments: list[dict[str, Any]] = field(default_factory=list)

    def next_offsets(self) -> dict[int, int]:
        nexts: dict[int, int] = {}
        for seg in self.segments:
            nexts[seg["partition"]] = max(nexts.get(seg["partition"], 0), seg["last"] + 1)
        return nexts

    def to_json(self) -> bytes:
        body = {"topic": self.topic, "partitions": self.partitions, "segments": self.segments}
        return json.dumps(body, indent=1, sort_keys=True).encode()


@dataclass(frozen=True)
class ArchiveReport:
    topics: int
    segments: int
    records: int


def topic_prefix(namespace: str, topic: str) -> str:
    return f"{ARCHIVE_PREFIX}/{namespace}/{topic}"


def index_key(namespace: str, topic: str) -> str:
    return f"{topic_prefix(namespace, topic)}/{INDEX_NAME}"


def segment_key(namespace: str, topic: str, partition: int, first: int, last: int) -> str:
    return f"{topic_prefix(namespace, topic)}/{partition}/{first:020d}-{last:020d}.avro"


def load_index(store: ObjectStore, namespace: str, topic: str) -> TopicIndex | None:
    try:
        body = json.loads(store.get(index_key(namespace, topic)))
    except ObjectNotFound:
        return None
    return TopicIndex(body["topic"], int(body["partitions"]), list(body["segments"]))


def encode_segment(records: list[ConsumedRecord]) -> bytes:
    rows = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "offset": r.offset,
            "timestamp_ms": r.timestamp_ms,
            "key": r.key,
            "value": r.value,
            "headers": [{"name": n, "value": v} for n, v in r.headers],
        }
        for r in records
    ]
    out = io.BytesIO()
    writer(out, SEGMENT_SCHEMA, rows, codec="deflate")
    return out.getvalue()


def decode_segment(data: bytes) -> Iterator[ConsumedRecord]:
    for row in reader(io.BytesIO(data)):
        assert isinstance(row, dict)
        headers = tuple((h["name"], bytes(h["value"])) for h in row["headers"])
        key = None if row["key"] is None else bytes(row["key"])
        yield ConsumedRecord(
            row["topic"],
            row["partition"],
            row["offset"],
            key,
            bytes(row["value"]),
            headers,
            row["timestamp_ms"],
        )


async def archive_topic(
    log: EventLog, store: ObjectStore, namespace: str, topic: str, segment_records: int = SEGMENT_RECORDS
) -> tuple[int, int]:
    """Archive what is new on one topic; returns (segments written, records archived)."""
    partitions = await partition_count(log, topic)
    if partitions is None:
        return 0, 0
    index = load_index(store, namespace, topic) or TopicIndex(topic, partitions)
    index.partitions = partitions
    pending: dict[int, list[ConsumedRecord]] = {}
    segments = records = 0

    async def flush(partition: int) -> None:
        nonlocal segments, records
        chunk = pending.pop(partition, [])
        if not chunk:
            return
        data = encode_segment(chunk)
        key = segment_key(namespace, topic, partition, chunk[0].offset, chunk[-1].offset)
        await asyncio.to_thread(store.put, key, data)
        index.segments.append(
            {
                "partition": partition,
                "first": chunk[0].offset,
                "last": chunk[-1].offset,
                "records": len(chunk),
                "key": key,
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        segments, records = segments + 1, records + len(chunk)

    async for batch in read_batches(log, topic, index.next_offsets()):
        for record in batch:
            pending.setdefault(record.partition, []).append(record)
            if len(pending[record.partition]) >= segment_records:
                await flush(record.partition)
    for partition in sorted(pending):
        await flush(partition)
    if segments or load_index(store, namespace, topic) is None:
        await asyncio.to_thread(store.put, index_key(namespace, topic), index.to_json())
    return segments, records


async def archive_namespace(
    log: EventLog, store: ObjectStore, namespace: str, segment_records: int = SEGMENT_RECORDS
) -> ArchiveReport:
    """Archive every topic of the namespace that exists on the log (incremental)."""
    topics = segments = records = 0
    for topic in namespace_topics(namespace):
        if await partition_count(log, topic) is None:
            continue
        seg, rec = await archive_topic(log, store, namespace, topic, segment_records)
        topics, segments, records = topics + 1, segments + seg, records + rec
    return ArchiveReport(topics, segments, records)


def archived_topics(store: ObjectStore, namespace: str) -> list[TopicIndex]:
    """The indexes of every archived topic of a namespace."""
    prefix = f"{ARCHIVE_PREFIX}/{namespace}/"
    keys = [k for k in store.list(prefix) if k.endswith("/" + INDEX_NAME)]
    indexes = []
    for key in keys:
        topic = key[len(prefix) : -len("/" + INDEX_NAME)]
        index = load_index(store, namespace, topic)
        if index is not None:
            indexes.append(index)
    return indexes


def segment_records(store: ObjectStore, segment: dict[str, Any]) -> list[ConsumedRecord]:
    data = store.get(segment["key"])
    if hashlib.sha256(data).hexdigest() != segment["sha256"]:
        raise ArchiveError(f"archive segment {segment['key']} does not match the sha256 in its index")
    return list(decode_segment(data))


async def archived_records(store: ObjectStore, index: TopicIndex) -> AsyncIterator[list[ConsumedRecord]]:
    """Every archived record of a topic, segment by segment (offset order per partition)."""
    for segment in sorted(index.segments, key=lambda s: (s["partition"], s["first"])):
        yield await asyncio.to_thread(segment_records, store, segment)


async def restore(store: ObjectStore, namespace: str, log: EventLog) -> int:
    """Rebuild the namespace's topics on `log` from the archive; returns the records appended.

    A partition that already holds records keeps them: restoring continues after its end offset, so
    a re-run appends nothing. The target topics get the archived partition counts, so each record
    lands in its original partition (keys hash the same way).
    """
    indexes = archived_topics(store, namespace)
    if not indexes:
        raise ArchiveError(f"no archive for namespace {namespace!r} in the object store")
    appended = 0
    for index in indexes:
        existing = await partition_count(log, index.topic)
        if existing is not None and existing != index.partitions:
            raise ArchiveError(
                f"{index.topic} has {existing} partitions on the target log, {index.partitions} in the archive"
            )
        await log.create_topics([TopicSpec(index.topic, index.partitions)])
        ends = await log.end_offsets(index.topic)
        async for records in archived_records(store, index):
            todo = [r for r in records if r.offset >= ends.get(r.partition, 0)]
            if todo:
                await _append_in_place(log, index.topic, todo)
                appended += len(todo)
    return appended


async def _append_in_place(log: EventLog, topic: str, records: list[ConsumedRecord]) -> None:
    outgoing = [OutgoingRecord(value=r.value, key=r.key, headers=r.headers) for r in records]
    positions = await log.append_batch(topic, outgoing)
    for record, position in zip(records, positions, strict=True):
        if (position.partition, position.offset) != (record.partition, record.offset):
            raise ArchiveError(
                f"{topic}: archived record {record.partition}@{record.offset} landed at "
                f"{position.partition}@{position.offset} (the target log is not a faithful copy)"
            )
