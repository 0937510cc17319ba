"""The event-log port: append records to topics and consume them as a member of a consumer group.

Two implementations stand behind it: `sqlite_log.SqliteEventLog` (embedded, one machine) and
`kafka_log.KafkaEventLog` (aiokafka). Everything above this port sees only these types. Values are
opaque bytes here: the Avro codec in `schemas` encodes and decodes them.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple, Self

from orl.schemas.errors import OrlError

Headers = tuple[tuple[str, bytes], ...]


class EventLogError(OrlError):
    """The log refused an operation (unknown topic, closed log, bad argument)."""


class RecordRefused(EventLogError):
    """The log refused some records of an append for good (too large, invalid): sending them again
    cannot succeed. `refused` maps each such record's index in the batch to the reason; `positions`
    holds where the others were appended (None for the refused ones)."""

    def __init__(
        self, topic: str, refused: Mapping[int, str], positions: Sequence[RecordPosition | None]
    ) -> None:
        first = min(refused)
        super().__init__(f"{topic!r} refused {len(refused)} record(s), the first: {refused[first]}")
        self.topic = topic
        self.refused = dict(refused)
        self.positions = list(positions)


@dataclass(frozen=True, order=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create; `configs` are Kafka topic configs of its own (cleanup.policy, retention.ms),
    merged over the log's `TopicPolicy` (the SQLite log keeps every record and ignores them)."""

    name: str
    partitions: int = 1
    configs: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class OutgoingRecord:
    """A record to append. Records with the same key land in the same partition (Kafka's murmur2 partitioner)."""

    value: bytes
    key: bytes | None = None
    headers: Headers = ()


class RecordPosition(NamedTuple):
    """Where an appended record landed. A NamedTuple, as `ConsumedRecord`: one is built per record."""

    partition: int
    offset: int


class ConsumedRecord(NamedTuple):
    """A record as read. Immutable; a NamedTuple because a read builds one per record (a frozen
    dataclass's __init__ cost about a fifth of the SQLite log's reads)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: Headers = ()
    timestamp_ms: int = 0

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class Consumer(abc.ABC):
    """A member of a consumer group. Offsets are Kafka-style: the committed offset is the next one to read."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Join the group and get an assignment; positions start at the committed offsets (else the reset policy)."""

    @abc.abstractmethod
    async def assignment(self) -> set[TopicPartition]:
        """The partitions this member currently owns."""

    @abc.abstractmethod
    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[ConsumedRecord]:
        """Records after the current positions, in offset order per partition; [] after timeout_s."""

    @abc.abstractmethod
    async def position(self, tp: TopicPartition) -> int:
        """The next offset this member reads from an assigned partition. On Kafka it moves past
        transaction markers too, so a reader knows it reached an end offset no record has."""

    @abc.abstractmethod
    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit the given next-offsets, or (None) the current position of every assigned partition."""

    @abc.abstractmethod
    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for a partition, or None if it never committed one."""

    @abc.abstractmethod
    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Set the next offset to read for an assigned partition."""

    @abc.abstractmethod
    async def seek_to_beginning(self, tps: Sequence[TopicPartition] | None = None) -> None:
        """Seek the given (default: all assigned) partitions to their first offset."""

    @abc.abstractmethod
    async def seek_to_timestamp(self, timestamp_ms: int, tps: Sequence[TopicPartition] | None = None) -> None:
        """Seek to the first record whose timestamp is >= timestamp_ms (the end if there is none)."""

    @abc.abstractmethod
    async def lag(self) -> dict[TopicPartition, int]:
        """end offset minus committed offset (minus beginning if never committed), per assigned partition."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Leave the group. Does not commit."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class EventLog(abc.ABC):
    """A durable, partitioned, append-only log of byte records, shared by several processes."""

    @abc.abstractmethod
    async def start(self) -> None:
        """Connect (and for Kafka, start the idempotent producer). Raises ServiceUnavailable naming the address."""

    @abc.abstractmethod
    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        """Create topics that do not exist yet; existing topics are left as they are."""

    @abc.abstractmethod
    async def partitions_for(self, topic: str) -> int:
        """Number of partitions of an existing topic; EventLogError if it does not exist."""

    @abc.abstractmethod
    async def append(self, topic: str, record: OutgoingRecord) -> RecordPosition:
        """Append one record; when this returns the record is durable."""

    @abc.abstractmethod
    async def append_batch(self, topic: str, records: Sequence[OutgoingRecord]) -> list[RecordPosition]:
        """Append many records; when this returns all are durable. A crash mid-batch never exposes a partial record.

        A record over the policy's `max_record_bytes` (or one the broker refuses for good) raises
        RecordRefused, which says which records were appended and which were not."""

    @abc.abstractmethod
    async def append_and_commit(
        self,
        outputs: Sequence[tuple[str, OutgoingRecord]],
        group_id: str,
        offsets: Mapping[TopicPartition, int],
    ) -> None:
        """Atomically append (topic, record) outputs and commit `group_id`'s offsets: all or nothing.

        This is what makes a processor exactly-once: its outputs and its input position move together
        (one SQLite transaction; a Kafka transaction with send_offsets_to_transaction).
        """

    async def power_cut_warning(self, topic: str) -> str | None:
        """Why a power cut could lose records of `topic` that an append acknowledged; None when it cannot
        (the SQLite log syncs every commit to disk; Kafka with 2 or more replicas)."""
        return None

    @abc.abstractmethod
    async def end_offsets(self, topic: str) -> dict[int, int]:
        """Per partition, the offset the next appended record will get."""

    @abc.abstractmethod
    def consumer(
        self, group_id: str, topics: Sequence[str], *, auto_offset_reset: str = "earliest"
    ) -> Consumer:
        """A new (not yet started) member of `group_id` subscribed to `topics`."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush and release connections."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
