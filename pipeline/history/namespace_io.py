"""Reading and writing whole namespaces on the event log (shared by archive, replay, audit, export).

Reads any topic of a namespace from given offsets to its current end, in batches; appends decoded
events to a namespace keyed by session (so partitions match live traffic), skipping event ids that
are already there, which is what makes a re-run of a replay or an import add nothing.
Reads and writes the topics its callers name.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from functools import cache
from typing import Any, NamedTuple

from orl.connectors.event_log.base import ConsumedRecord, EventLog, EventLogError, OutgoingRecord, TopicSpec
from orl.connectors.event_log.reading import reached
from orl.pipeline.processors.topology import STAGES
from orl.schemas.codec import HEADER_LEN, MARKER, decode, encode
from orl.schemas.event_types import Envelope
from orl.schemas.registry import default_registry
from orl.schemas.sealing import SEALED_HEADER, PayloadForgotten
from orl.schemas.topics import TOPICS, dlq_topic, record_key, topic_for_event, topic_name

logger = logging.getLogger(__name__)

Event = dict[str, Any]
BATCH_RECORDS = 5000


def catalog_topics(namespace: str) -> list[str]:
    """The full names of the catalog topics of a namespace, in catalog order."""
    return [topic_name(namespace, topic) for topic in TOPICS]


def namespace_topics(namespace: str) -> list[str]:
    """Every topic a namespace can have: catalog topics, their dead-letter topics, stage changelogs."""
    names = catalog_topics(namespace)
    return names + [dlq_topic(name) for name in names] + [f"{namespace}.{s.name}.changelog" for s in STAGES]


async def partition_count(log: EventLog, topic: str) -> int | None:
    """Partitions of an existing topic; None if the topic does not exist."""
    try:
        return await log.partitions_for(topic)
    except EventLogError:
        return None


async def record_count(log: EventLog, topic: str) -> int:
    """Records now on a topic (0 if it does not exist); assumes nothing was deleted."""
    if await partition_count(log, topic) is None:
        return 0
    return sum((await log.end_offsets(topic)).values())


async def read_batches(
    log: EventLog, topic: str, start: Mapping[int, int] | None = None, batch: int = BATCH_RECORDS
) -> AsyncIterator[list[ConsumedRecord]]:
    """Records from `start` (next offset per partition; default the beginning) to the current end."""
    if await partition_count(log, topic) is None:
        return
    ends = await log.end_offsets(topic)
    begin = {p: (start or {}).get(p, 0) for p in ends}
    if all(begin[p] >= ends[p] for p in ends):
        return
    async with log.consumer(f"reader-{uuid.uuid4().hex}", [topic]) as consumer:
        topic_partitions = sorted(await consumer.assignment())
        for tp in topic_partitions:
            await consumer.seek(tp, begin[tp.partition])
        while not await reached(consumer, topic_partitions, ends):
            out = [
                record
                for record in await consumer.poll(max_records=batch, timeout_s=1.0)
                if record.offset < ends[record.partition]
            ]
            if out:
                yield out


async def read_events(log: EventLog, topic: str) -> AsyncIterator[Event]:
    """Every readable event on a topic, in offset order per partition: an event whose payload was
    forgotten (`orl forget`) is left out, and how many were is logged."""
    forgotten = 0
    async for records in read_batches(log, topic):
        for record in records:
            try:
                yield decode(record.value)
            except PayloadForgotten:
                forgotten += 1
    if forgotten:
        logger.info("%s: %d events left out: their payloads were forgotten", topic, forgotten)


async def namespace_events(log: EventLog, namespace: str, topics: Iterable[str]) -> dict[str, list[Event]]:
    """Every decoded event of these topics of a namespace (short names: "samples"), by topic; a topic
    not created yet reads as empty."""
    return {
        topic: [event async for event in read_events(log, topic_name(namespace, topic))] for topic in topics
    }


async def event_ids_on(log: EventLog, topics: Iterable[str]) -> set[str]:
    """The event ids already on these topics (dedup of re-runs)."""
    ids: set[str] = set()
    for topic in topics:
        async for records in read_batches(log, topic):
            for record in records:
                head = envelope_head(record.value)
                ids.add(head.event_id if head else decode(record.value)["envelope"]["event_id"])
    return ids


def in_namespace(event: Event, namespace: str) -> Event:
    """The same fact recorded in another namespace: only `envelope.namespace` changes, the id stays."""
    return {**event, "envelope": {**event["envelope"], "namespace": namespace}}


def _read_long(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro (zigzag varint) int/long at `pos`; returns (value, next position)."""
    byte = data[pos]
    if byte < 0x80:  # one byte: most lengths
        return (byte >> 1) ^ -(byte & 1), pos + 1
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _write_long(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class EnvelopeHead(NamedTuple):
    """The leading envelope fields of an encoded event, read without decoding the body."""

    event_id: str
    event_type: str
    occurred_at: int
    namespace_span: tuple[int, int]  # byte range of the namespace string (length prefix included)
    sealed: bool = False  # a SealedEvent (orl.schemas.sealing): what follows the envelope is no payload field


def envelope_head(value: bytes) -> EnvelopeHead | None:
    """The envelope head of an event written with its current schema (else None: decode it instead,
    which also says what is wrong with bytes that are no event).

    Every current schema starts with the envelope, whose first fields are event_id, event_type,
    schema_version, occurred_at, producer, namespace: an older writer schema is not trusted to. A
    sealed event starts with the same clear envelope.
    """
    event_type = _current_types().get(value[:HEADER_LEN])
    if event_type is None:
        return None
    length, pos = _read_long(value, HEADER_LEN)
    event_id = value[pos : pos + length].decode()
    length, pos = _read_long(value, pos + length)  # event_type: the header already says it (unless sealed)
    sealed = event_type == _SEALED
    if sealed:
        event_type = value[pos : pos + length].decode()
    _, pos = _read_long(value, pos + length)  # schema_version
    occurred_at, pos = _read_long(value, pos)
    length, pos = _read_long(value, pos)  # producer
    start = pos + length
    length, pos = _read_long(value, start)
    return EnvelopeHead(event_id, event_type, occurred_at, (start, pos + length), sealed)


def envelope_keys(value: bytes) -> tuple[str, str | None, str | None] | None:
    """(event_type, session_id, turn_id) of an event written with its current schema, without decoding
    the body (else None). session_id and turn_id follow the namespace, each a union of null and string."""
    head = envelope_head(value)
    if head is None:
        return None
    session_id, turn_id, _ = _envelope_tail(value, head)
    return head.event_type, session_id, turn_id


def _envelope_tail(value: bytes, head: EnvelopeHead) -> tuple[str | None, str | None, int]:
    """(session_id, turn_id, the position where the event's own fields start): the envelope's last
    fields, which follow the namespace, each a union of null and string."""
    session_id, pos = _read_optional_string(value, head.namespace_span[1])
    turn_id, pos = _read_optional_string(value, pos)
    return session_id, turn_id, pos


VOTE_TYPES = ("JudgeVoteCast", "HintVoteCast")


def vote_fields(value: bytes) -> tuple[str, str, str, int] | None:
    """(event_type, judge_kind, judge_config_version, vote_index) of a JudgeVoteCast or HintVoteCast
    written with its current schema, without decoding the rest (else None).

    Both schemas follow the envelope with judge_id, judge_kind, judge_config_version, model,
    model_version (unions of null and string) and vote_index;
    tests/unit/test_pipeline_envelope_keys.py checks that against a full decode, so a reordered
    schema fails there, not here.
    """
    head = envelope_head(value)
    if head is None or head.sealed or head.event_type not in VOTE_TYPES:
        return None
    _, _, pos = _envelope_tail(value, head)
    _, pos = _read_string(value, pos)  # judge_id
    judge_kind, pos = _read_string(value, pos)
    config_version, pos = _read_string(value, pos)
    _, pos = _read_optional_string(value, pos)  # model
    _, pos = _read_optional_string(value, pos)  # model_version
    vote_index, _ = _read_long(value, pos)
    return head.event_type, judge_kind, config_version, vote_index


def _read_string(value: bytes, pos: int) -> tuple[str, int]:
    length, pos = _read_long(value, pos)
    return value[pos : pos + length].decode(), pos + length


def _read_optional_string(value: bytes, pos: int) -> tuple[str | None, int]:
    branch, pos = _read_long(value, pos)
    if branch == 0:
        return None, pos
    length, pos = _read_long(value, pos)
    return value[pos : pos + length].decode(), pos + length


@cache
def _current_types() -> dict[bytes, str]:
    """Event type by the header (marker + fingerprint) of its current schema."""
    registry = default_registry()
    return {
        SEALED_HEADER: _SEALED,
        **{MARKER + registry.current(name).fingerprint: name for name in registry.event_types},
    }


_SEALED = "<sealed>"  # _current_types' name for the sealed header: the event type is in the clear envelope


class EncodedEvent(NamedTuple):
    """An event as it is appended: its id and type (for dedup and the topic), record key and bytes."""

    event_id: str
    event_type: str
    key: bytes | None
    value: bytes


def encoded(event: Event) -> EncodedEvent:
    """The event encoded, keyed as every orl producer keys its records (orl.schemas.topics.record_key)."""
    envelope: Envelope = event["envelope"]
    session = record_key(event)
    key = session.encode() if session else None
    return EncodedEvent(envelope["event_id"], envelope["event_type"], key, encode(event))


def with_namespace(value: bytes, head: EnvelopeHead, namespace: str) -> bytes:
    """The same encoded event with only `envelope.namespace` replaced."""
    encoded = namespace.encode()
    start, end = head.namespace_span
    return value[:start] + _write_long(len(encoded)) + encoded + value[end:]


class NamespaceWriter:
    """Appends events to a namespace's catalog topics, once per event id."""

    def __init__(self, log: EventLog, namespace: str, partitions: int = 1) -> None:
        self.log = log
        self.namespace = namespace
        self.partitions = partitions
        self.present: set[str] = set()
        self.written = 0
        self.skipped = 0
        self._topics: dict[str, str] = {}

    async def prepare(self, topics: Iterable[str] = TOPICS) -> None:
        names = [topic_name(self.namespace, topic) for topic in topics]
        await self.log.create_topics([TopicSpec(name, self.partitions) for name in names])
        self.present = await event_ids_on(self.log, names)

    async def write(self, events: Iterable[Event]) -> int:
        """Append the events not yet present (order kept per topic); returns how many."""
        return await self.write_batch([encoded(event) for event in events])

    async def write_batch(self, items: Iterable[EncodedEvent]) -> int:
        """The encoded events not yet present, in ONE append (one transaction, one fsync on the
        embedded log), order kept per topic; returns how many were appended."""
        outputs = [
            (self._topic(event_type), OutgoingRecord(value=value, key=key))
            for event_id, event_type, key, value in items  # also plain tuples (pipeline/history/replay_workers.py)
            if self._is_new(event_id)
        ]
        if outputs:
            await self.log.append_and_commit(outputs, f"{self.namespace}.writer", {})
        self.written += len(outputs)
        return len(outputs)

    def _is_new(self, event_id: str) -> bool:
        if event_id in self.present:
            self.skipped += 1
            return False
        self.present.add(event_id)
        return True

    def _topic(self, event_type: str) -> str:
        topic = self._topics.get(event_type)
        if topic is None:
            topic = self._topics[event_type] = topic_name(self.namespace, topic_for_event(event_type))
        return topic
