"""The embedded event log: topics, partitions, offsets and consumer groups in one SQLite file.

Reads and writes the tables `topics`, `records`, `group_offsets` and `group_members` of the file it
is given. WAL mode with synchronous=FULL, so an append that returned is on disk; every write is one
`BEGIN IMMEDIATE` transaction, so a crash mid-batch exposes nothing, and a busy timeout lets several
local processes append and consume at once. Consumer groups work across processes: members heartbeat
in `group_members`, and each member derives the same assignment from the live members it sees.
All SQLite calls of one log run on one worker thread, so a writer waiting for the lock of another
process never blocks the event loop.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import sqlite3
import struct
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from orl.connectors.event_log.base import (
    ConsumedRecord,
    Consumer,
    EventLog,
    EventLogError,
    Headers,
    OutgoingRecord,
    RecordPosition,
    RecordRefused,
    TopicPartition,
    TopicSpec,
)
from orl.connectors.event_log.partitioner import Partitioner, deal_partitions
from orl.connectors.event_log.topic_policy import DEFAULT_POLICY, TopicPolicy

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    topic TEXT NOT NULL, "partition" INTEGER NOT NULL, "offset" INTEGER NOT NULL,
    key BLOB, value BLOB NOT NULL, headers BLOB NOT NULL, timestamp_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, "partition", "offset"));
CREATE TABLE IF NOT EXISTS group_offsets (
    group_id TEXT NOT NULL, topic TEXT NOT NULL, "partition" INTEGER NOT NULL, "offset" INTEGER NOT NULL,
    PRIMARY KEY (group_id, topic, "partition"));
CREATE TABLE IF NOT EXISTS group_members (
    group_id TEXT NOT NULL, member_id TEXT NOT NULL, heartbeat_ms INTEGER NOT NULL, topics TEXT NOT NULL,
    PRIMARY KEY (group_id, member_id));
"""
_INSERT_RECORD = (
    'INSERT INTO records (topic, "partition", "offset", key, value, headers, timestamp_ms) '
    "VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_UPSERT_OFFSET = (
    'INSERT INTO group_offsets (group_id, topic, "partition", "offset") VALUES (?, ?, ?, ?) '
    'ON CONFLICT (group_id, topic, "partition") DO UPDATE SET "offset" = excluded."offset"'
)
_LEN = struct.Struct(">I")
_RESET_POLICIES = ("earliest", "latest")
PartitionedRecord = tuple[str, int, OutgoingRecord]


def encode_headers(headers: Headers) -> bytes:
    """Length-prefixed (name, value) pairs; the empty tuple is b''."""
    parts: list[bytes] = []
    for name, value in headers:
        name_bytes = name.encode()
        parts += [_LEN.pack(len(name_bytes)), name_bytes, _LEN.pack(len(value)), bytes(value)]
    return b"".join(parts)


def decode_headers(blob: bytes) -> Headers:
    headers: list[tuple[str, bytes]] = []
    pos = 0
    while pos < len(blob):
        (name_len,) = _LEN.unpack_from(blob, pos)
        name = blob[pos + 4 : pos + 4 + name_len].decode()
        pos += 4 + name_len
        (value_len,) = _LEN.unpack_from(blob, pos)
        headers.append((name, blob[pos + 4 : pos + 4 + value_len]))
        pos += 4 + value_len
    return tuple(headers)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class SqliteStore:
    """The synchronous SQL behind `SqliteEventLog`; one connection, used from one thread at a time."""

    def __init__(self, path: Path, busy_timeout_s: float) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        with self.transaction():
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self._db.execute(statement)

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        with self.transaction() as db:
            db.executemany(
                "INSERT OR IGNORE INTO topics (name, partitions) VALUES (?, ?)",
                [(s.name, s.partitions) for s in specs],
            )

    def partitions(self, topics: Sequence[str]) -> dict[str, int]:
        """Partition counts of those topics that exist."""
        marks = ",".join("?" * len(topics))
        rows = self._db.execute(f"SELECT name, partitions FROM topics WHERE name IN ({marks})", list(topics))
        return dict(rows.fetchall())

    def append(
        self, records: Sequence[PartitionedRecord], offsets: Sequence[tuple[str, TopicPartition, int]]
    ) -> list[RecordPosition]:
        """Insert `records` and commit the (group, partition, offset) triples in one transaction."""
        with self.transaction() as db:
            positions = self._insert(db, records)
            db.executemany(_UPSERT_OFFSET, [(g, tp.topic, tp.partition, o) for g, tp, o in offsets])
        return positions

    def _insert(self, db: sqlite3.Connection, records: Sequence[PartitionedRecord]) -> list[RecordPosition]:
        """Rows for `records` at the tails of their partitions; a batch's records of one partition
        share one timestamp (the clock, or the partition's last one if that is later)."""
        tails: dict[tuple[str, int], list[int]] = {}  # (topic, partition) -> [next offset, timestamp]
        rows = []
        positions = []
        clock_ms = now_ms()
        for topic, partition, record in records:
            tail = tails.get((topic, partition))
            if tail is None:
                offset, last_ms = self._tail(db, topic, partition)
                tail = tails[(topic, partition)] = [offset, max(last_ms, clock_ms)]
            offset = tail[0]
            tail[0] = offset + 1
            headers = encode_headers(record.headers) if record.headers else b""
            rows.append((topic, partition, offset, record.key, record.value, headers, tail[1]))
            positions.append(RecordPosition(partition, offset))
        db.executemany(_INSERT_RECORD, rows)
        return positions

    @staticmethod
    def _tail(db: sqlite3.Connection, topic: str, partition: int) -> tuple[int, int]:
        """(next offset, last timestamp): timestamps never decrease within a partition."""
        row = db.execute(
            'SELECT "offset", timestamp_ms FROM records WHERE topic = ? AND "partition" = ? '
            'ORDER BY "offset" DESC LIMIT 1',
            (topic, partition),
        ).fetchone()
        return (0, 0) if row is None else (row[0] + 1, row[1])

    def end_offset(self, tp: TopicPartition) -> int:
        return self._tail(self._db, tp.topic, tp.partition)[0]

    def beginning_offset(self, tp: TopicPartition) -> int:
        row = self._db.execute(
            'SELECT MIN("offset") FROM records WHERE topic = ? AND "partition" = ?', (tp.topic, tp.partition)
        ).fetchone()
        return 0 if row[0] is None else int(row[0])

    def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> int:
        """First offset with timestamp >= timestamp_ms (the end if none): a binary search on dense offsets."""
        start, end = self.beginning_offset(tp), self.end_offset(tp)
        query = 'SELECT timestamp_ms FROM records WHERE topic = ? AND "partition" = ? AND "offset" = ?'

        def timestamp_at(offset: int) -> int:
            return int(self._db.execute(query, (tp.topic, tp.partition, offset)).fetchone()[0])

        return start + bisect.bisect_left(range(start, end), timestamp_ms, key=timestamp_at)

    def read(self, positions: Sequence[tuple[TopicPartition, int]], max_records: int) -> list[ConsumedRecord]:
        """Up to max_records records from the given (partition, next offset) positions, in that order."""
        out: list[ConsumedRecord] = []
        query = (
            'SELECT "offset", key, value, headers, timestamp_ms FROM records '
            'WHERE topic = ? AND "partition" = ? AND "offset" >= ? ORDER BY "offset" LIMIT ?'
        )
        for tp, offset in positions:
            if len(out) >= max_records:
                break
            rows = self._db.execute(query, (tp.topic, tp.partition, offset, max_records - len(out)))
            out += [
                ConsumedRecord(tp.topic, tp.partition, o, k, v, decode_headers(h) if h else (), ts)
                for o, k, v, h, ts in rows
            ]
        return out

    def committed(self, group_id: str, tp: TopicPartition) -> int | None:
        row = self._db.execute(
            'SELECT "offset" FROM group_offsets WHERE group_id = ? AND topic = ? AND "partition" = ?',
            (group_id, tp.topic, tp.partition),
        ).fetchone()
        return None if row is None else int(row[0])

    def heartbeat(self, group_id: str, member_id: str, topics: Sequence[str], dead_before_ms: int) -> None:
        """Record that the member is alive and forget members that stopped heartbeating."""
        with self.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO group_members (group_id, member_id, heartbeat_ms, topics) VALUES (?, ?, ?, ?)",
                (group_id, member_id, now_ms(), "\n".join(topics)),
            )
            db.execute(
                "DELETE FROM group_members WHERE group_id = ? AND heartbeat_ms < ?",
                (group_id, dead_before_ms),
            )

    def live_members(self, group_id: str, dead_before_ms: int) -> dict[str, list[str]]:
        rows = self._db.execute(
            "SELECT member_id, topics FROM group_members WHERE group_id = ? AND heartbeat_ms >= ?",
            (group_id, dead_before_ms),
        )
        return {member: topics.split("\n") for member, topics in rows}

    def leave(self, group_id: str, member_id: str) -> None:
        with self.transaction() as db:
            db.execute(
                "DELETE FROM group_members WHERE group_id = ? AND member_id = ?", (group_id, member_id)
            )

    def group_view(
        self, group_id: str, topics: Sequence[str], dead_before_ms: int
    ) -> tuple[dict[str, list[str]], dict[str, int]]:
        """The live members of a group and the partition counts of `topics`, for `deal_partitions`."""
        return self.live_members(group_id, dead_before_ms), self.partitions(topics)

    def start_offset(self, group_id: str, tp: TopicPartition, auto_offset_reset: str) -> int:
        """Where a member that just got `tp` starts: the committed offset, else the reset policy."""
        committed = self.committed(group_id, tp)
        if committed is not None:
            return committed
        return self.beginning_offset(tp) if auto_offset_reset == "earliest" else self.end_offset(tp)


class SqliteEventLog(EventLog):
    """`EventLog` over one SQLite file shared by the local processes that open it."""

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_s: float = 30.0,
        session_timeout_s: float = 10.0,
        heartbeat_interval_s: float = 1.0,
        policy: TopicPolicy = DEFAULT_POLICY,
    ) -> None:
        self.path = Path(path)
        self.policy = policy
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self._busy_timeout_s = busy_timeout_s
        self._store: SqliteStore | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._partition_counts: dict[str, int] = {}
        self._partitioner = Partitioner()

    async def start(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"orl-sqlite-{self.path.name}")
        try:
            self._store = await asyncio.get_running_loop().run_in_executor(
                self._executor, SqliteStore, self.path, self._busy_timeout_s
            )
        except sqlite3.Error as exc:
            self._executor.shutdown()
            raise EventLogError(f"cannot open the SQLite event log at {self.path}: {exc}") from exc

    async def call(self, method: Callable[..., _T], *args: object) -> _T:
        """Run a `SqliteStore` method on the log's SQLite thread."""
        if self._store is None or self._executor is None:
            raise EventLogError(f"the SQLite event log at {self.path} is not started (or closed)")
        bound = functools.partial(method, self._store, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, bound)

    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        if any(spec.partitions < 1 for spec in specs):
            raise EventLogError(f"a topic needs at least one partition: {list(specs)}")
        await self.call(SqliteStore.create_topics, specs)

    async def partitions_for(self, topic: str) -> int:
        if topic not in self._partition_counts:
            self._partition_counts.update(await self.call(SqliteStore.partitions, [topic]))
        if topic not in self._partition_counts:
            raise EventLogError(f"topic {topic!r} does not exist in {self.path}")
        return self._partition_counts[topic]

    async def _place(self, outputs: Sequence[tuple[str, OutgoingRecord]]) -> list[PartitionedRecord]:
        counts = {topic: await self.partitions_for(topic) for topic in {topic for topic, _ in outputs}}
        partition = self._partitioner.partition
        return [(topic, partition(topic, record.key, counts[topic]), record) for topic, record in outputs]

    async def append(self, topic: str, record: OutgoingRecord) -> RecordPosition:
        return (await self.append_batch(topic, [record]))[0]

    async def append_batch(self, topic: str, records: Sequence[OutgoingRecord]) -> list[RecordPosition]:
        limit = (
            self.policy.max_record_bytes
        )  # checked here per record, the reason asked only of those over it
        refused = {
            i: str(self.policy.oversized(r.value)) for i, r in enumerate(records) if len(r.value) > limit
        }
        kept = (
            [(topic, r) for r in records]
            if not refused
            else [(topic, r) for i, r in enumerate(records) if i not in refused]
        )
        placed = await self._place(kept)
        appended = iter(await self.call(SqliteStore.append, placed, []))
        if refused:
            positions = [None if i in refused else next(appended) for i in range(len(records))]
            raise RecordRefused(topic, refused, positions)
        return list(appended)

    async def append_and_commit(
        self,
        outputs: Sequence[tuple[str, OutgoingRecord]],
        group_id: str,
        offsets: Mapping[TopicPartition, int],
    ) -> None:
        placed = await self._place(outputs)
        await self.call(SqliteStore.append, placed, [(group_id, tp, o) for tp, o in offsets.items()])

    async def end_offsets(self, topic: str) -> dict[int, int]:
        partitions = await self.partitions_for(topic)
        return {
            p: await self.call(SqliteStore.end_offset, TopicPartition(topic, p)) for p in range(partitions)
        }

    def consumer(
        self, group_id: str, topics: Sequence[str], *, auto_offset_reset: str = "earliest"
    ) -> Consumer:
        if auto_offset_reset not in _RESET_POLICIES:
            raise EventLogError(
                f"auto_offset_reset must be one of {_RESET_POLICIES}, not {auto_offset_reset!r}"
            )
        return SqliteConsumer(self, group_id, list(topics), auto_offset_reset)

    async def close(self) -> None:
        if self._store is not None and self._executor is not None:
            await self.call(SqliteStore.close)
            self._executor.shutdown()
        self._store = None


class SqliteConsumer(Consumer):
    """A group member: owns the partitions `deal_partitions` gives it among the live members."""

    def __init__(self, log: SqliteEventLog, group_id: str, topics: list[str], auto_offset_reset: str) -> None:
        self._log = log
        self._group_id = group_id
        self._topics = topics
        self._reset = auto_offset_reset
        self._member_id = f"{uuid.uuid4().hex}"
        self._positions: dict[TopicPartition, int] = {}
        self._heartbeats: asyncio.Task[None] | None = None
        self._turn = 0

    async def start(self) -> None:
        await self._heartbeat()
        await self._sync_group()
        self._heartbeats = asyncio.create_task(self._heartbeat_forever(), name=f"heartbeat-{self._member_id}")

    def _dead_before_ms(self) -> int:
        return now_ms() - int(self._log.session_timeout_s * 1000)

    async def _heartbeat(self) -> None:
        await self._log.call(
            SqliteStore.heartbeat, self._group_id, self._member_id, self._topics, self._dead_before_ms()
        )

    async def _heartbeat_forever(self) -> None:
        """Liveness apart from polling (as Kafka's heartbeat thread): a slow batch does not cost the partitions."""
        while True:
            await asyncio.sleep(self._log.heartbeat_interval_s)
            await self._heartbeat()

    async def _sync_group(self) -> None:
        """Take or drop partitions to match the deal among the members alive now."""
        if self._heartbeats is not None and self._heartbeats.done():
            self._heartbeats.result()  # a failed heartbeat surfaces here instead of passing silently
        members, partitions = await self._log.call(
            SqliteStore.group_view, self._group_id, self._topics, self._dead_before_ms()
        )
        members[self._member_id] = self._topics
        owned = deal_partitions(members, partitions)[self._member_id]
        if owned == self._positions.keys():
            return
        positions = {tp: offset for tp, offset in self._positions.items() if tp in owned}
        for tp in sorted(owned - positions.keys()):
            positions[tp] = await self._log.call(SqliteStore.start_offset, self._group_id, tp, self._reset)
        self._positions = positions

    async def assignment(self) -> set[TopicPartition]:
        return set(self._positions)

    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[ConsumedRecord]:
        deadline = time.monotonic() + timeout_s
        backoff_s = 0.001
        while True:
            await self._sync_group()
            records = await self._read(max_records)
            remaining_s = deadline - time.monotonic()
            if records or remaining_s <= 0:
                return records
            await asyncio.sleep(min(backoff_s, remaining_s))
            backoff_s = min(backoff_s * 2, 0.05)

    async def _read(self, max_records: int) -> list[ConsumedRecord]:
        order = sorted(self._positions.items())
        self._turn = (self._turn + 1) % max(len(order), 1)  # rotate so no partition starves the others
        records = await self._log.call(
            SqliteStore.read, order[self._turn :] + order[: self._turn], max_records
        )
        last: dict[tuple[str, int], int] = {}
        for record in records:  # one position update per partition, not per record
            last[record.topic, record.partition] = record.offset
        for (topic, partition), offset in last.items():
            self._positions[TopicPartition(topic, partition)] = offset + 1
        return records

    async def position(self, tp: TopicPartition) -> int:
        return self._positions[self._owned([tp])[0]]

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        to_commit = self._positions if offsets is None else offsets
        await self._log.call(SqliteStore.append, [], [(self._group_id, tp, o) for tp, o in to_commit.items()])

    async def committed(self, tp: TopicPartition) -> int | None:
        return await self._log.call(SqliteStore.committed, self._group_id, tp)

    def _owned(self, tps: Sequence[TopicPartition] | None) -> list[TopicPartition]:
        chosen = sorted(self._positions) if tps is None else list(tps)
        foreign = [tp for tp in chosen if tp not in self._positions]
        if foreign:
            raise EventLogError(f"partitions {foreign} are not assigned to this member of {self._group_id!r}")
        return chosen

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise EventLogError(f"cannot seek {tp} to negative offset {offset}")
        self._positions[self._owned([tp])[0]] = offset

    async def seek_to_beginning(self, tps: Sequence[TopicPartition] | None = None) -> None:
        for tp in self._owned(tps):
            self._positions[tp] = await self._log.call(SqliteStore.beginning_offset, tp)

    async def seek_to_timestamp(self, timestamp_ms: int, tps: Sequence[TopicPartition] | None = None) -> None:
        for tp in self._owned(tps):
            self._positions[tp] = await self._log.call(SqliteStore.offset_for_time, tp, timestamp_ms)

    async def lag(self) -> dict[TopicPartition, int]:
        lags = {}
        for tp in sorted(self._positions):
            end = await self._log.call(SqliteStore.end_offset, tp)
            committed = await self.committed(tp)
            start = (
                committed if committed is not None else await self._log.call(SqliteStore.beginning_offset, tp)
            )
            lags[tp] = end - start
        return lags

    async def close(self) -> None:
        self._positions = {}
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError, EventLogError):
                await self._heartbeats
        with contextlib.suppress(EventLogError):  # the log itself may be closed already
            await self._log.call(SqliteStore.leave, self._group_id, self._member_id)
