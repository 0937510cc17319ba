"""Decoded events shared by the stream runners of one process, so a record is decoded once, not once per stage.

With `orl pipeline --role all`, turn_linker, judge and sample_builder all read requests, responses
and next_states: without sharing, every such record is decoded three times. The runners of one
process subscribe with the topics they read; the first runner to read a record decodes it and keeps
the event until every other subscriber has taken it (or until the cache's byte budget pushes it
out, oldest first: then a late reader simply decodes again). A record is identified by (topic,
partition, offset), which names the same bytes for the lifetime of a log.

The shared event dict is handed to several processors, so processors must never modify their
input events (tests/unit/test_pipeline_processor_contract.py checks that on the golden stream).
Reads and writes no topics itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from orl.connectors.event_log.base import ConsumedRecord
from orl.schemas.codec import decode

RecordId = tuple[str, int, int]
# Of encoded values: decoded events are several times larger. Readers in one process are at most a
# poll batch or so apart, which this holds many times over.
DEFAULT_BUDGET_BYTES = 8 * 1024 * 1024


@dataclass
class _Entry:
    event: dict[str, Any]
    readers_left: int
    size_bytes: int


@dataclass
class SharedDecodes:
    """A bounded cache of decoded events, each kept until all subscribed readers of its topic took it."""

    budget_bytes: int = DEFAULT_BUDGET_BYTES
    readers: dict[str, int] = field(default_factory=dict)  # full topic name -> subscribed runners
    _entries: dict[RecordId, _Entry] = field(default_factory=dict)  # insertion order = age
    _size_bytes: int = 0
    hits: int = 0
    misses: int = 0

    def subscribe(self, topics: Iterable[str]) -> None:
        """One more runner reads these topics (full names)."""
        for topic in topics:
            self.readers[topic] = self.readers.get(topic, 0) + 1

    def decode(self, record: ConsumedRecord) -> dict[str, Any]:
        """The record's event; raises EventDecodeError like orl.schemas.codec.decode (failures are not kept)."""
        record_id = (record.topic, record.partition, record.offset)
        entry = self._entries.get(record_id)
        if entry is not None:
            self.hits += 1
            entry.readers_left -= 1
            if entry.readers_left <= 0:
                self._drop(record_id)
            return entry.event
        self.misses += 1
        event = decode(record.value)
        readers_left = self.readers.get(record.topic, 1) - 1
        if readers_left > 0:
            self._keep(record_id, _Entry(event, readers_left, len(record.value)))
        return event

    def __len__(self) -> int:
        return len(self._entries)

    def _keep(self, record_id: RecordId, entry: _Entry) -> None:
        self._entries[record_id] = entry
        self._size_bytes += entry.size_bytes
        while self._size_bytes > self.budget_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, record_id: RecordId) -> None:
        entry = self._entries.pop(record_id)
        self._size_bytes -= entry.size_bytes
