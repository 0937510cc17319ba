"""Event-log throughput: appends of 1 KB values one by one and in batches, then reads by a consumer group.

Writes a temporary SQLite file (and, for Kafka, starts an Apache Kafka broker the same way as the
test fixture); prints a markdown table. Run from the repository root:

    .venv/bin/python -m benchmarks.bench_event_log [--backends sqlite,sqlite-inline,kafka]

Each figure is the median of --repeat runs. `sqlite-inline` runs the SQLite calls on the event loop instead of the log's worker thread, to
measure what the thread hop costs. `sqlite-raw` is the floor under both: the same table, pragmas and
transactions driven by plain `sqlite3` calls (offsets counted in Python, partitions dealt round
robin, rows fetched as tuples), with no event-log code; the last column is each backend's batched
appends and reads over sqlite-raw's in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

from orl.connectors.event_log.base import EventLog, OutgoingRecord, TopicSpec
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.sqlite_log import SqliteEventLog

from tests.fixtures.kafka_broker import start_kafka_cluster

_T = TypeVar("_T")
VALUE = b"x" * 1024
PARTITIONS = 4


class InlineSqliteEventLog(SqliteEventLog):
    """The SQLite log with its SQL run directly on the event loop (for comparison only)."""

    async def call(self, method: Callable[..., _T], *args: object) -> _T:
        if self._store is None:
            raise RuntimeError("not started")
        return method(self._store, *args)


@asynccontextmanager
async def open_backend(name: str, workdir: Path) -> AsyncIterator[EventLog]:
    if name == "kafka":
        broker = start_kafka_cluster(workdir / "kafka")
        try:
            async with KafkaEventLog(broker.bootstrap) as log:
                yield log
        finally:
            broker.stop()
        return
    log_class = InlineSqliteEventLog if name == "sqlite-inline" else SqliteEventLog
    async with log_class(workdir / f"{name}.db") as log:
        yield log


def records(start: int, count: int) -> list[OutgoingRecord]:
    return [OutgoingRecord(VALUE, key=str(i).encode()) for i in range(start, start + count)]


async def measure(log: EventLog, singles: int, batches: int, batch_size: int, page: int) -> dict[str, float]:
    await log.create_topics([TopicSpec("bench", PARTITIONS)])
    started = time.perf_counter()
    for record in records(0, singles):
        await log.append("bench", record)
    single_s = time.perf_counter() - started
    started = time.perf_counter()
    for batch in range(batches):
        await log.append_batch("bench", records(singles + batch * batch_size, batch_size))
    batch_s = time.perf_counter() - started
    total = singles + batches * batch_size
    async with log.consumer("bench-reader", ["bench"]) as consumer:
        started, seen = time.perf_counter(), 0
        while seen < total:
            seen += len(await consumer.poll(max_records=page, timeout_s=5.0))
        read_s = time.perf_counter() - started
    return {"single": singles / single_s, "batched": batches * batch_size / batch_s, "read": total / read_s}


def measure_raw(path: Path, singles: int, batches: int, batch_size: int, page: int) -> dict[str, float]:
    """The SQL of SqliteEventLog's appends and reads alone (see the module docstring)."""
    from orl.connectors.event_log.sqlite_log import _INSERT_RECORD, _SCHEMA

    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    next_offset = [0] * PARTITIONS
    clock_ms = time.time_ns() // 1_000_000

    def rows(start: int, count: int) -> list[tuple[object, ...]]:
        out = []
        for i in range(start, start + count):
            partition = i % PARTITIONS
            out.append(("bench", partition, next_offset[partition], str(i).encode(), VALUE, b"", clock_ms))
            next_offset[partition] += 1
        return out

    def append(batch: list[tuple[object, ...]]) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(_INSERT_RECORD, batch)
        db.execute("COMMIT")

    started = time.perf_counter()
    for i in range(singles):
        append(rows(i, 1))
    single_s = time.perf_counter() - started
    started = time.perf_counter()
    for batch in range(batches):
        append(rows(singles + batch * batch_size, batch_size))
    batch_s = time.perf_counter() - started
    query = (
        'SELECT "offset", key, value, headers, timestamp_ms FROM records '
        'WHERE topic = ? AND "partition" = ? AND "offset" >= ? ORDER BY "offset" LIMIT ?'
    )
    started, seen, positions = time.perf_counter(), 0, [0] * PARTITIONS
    total = singles + batches * batch_size
    while seen < total:
        for partition in range(PARTITIONS):
            fetched = db.execute(query, ("bench", partition, positions[partition], page)).fetchall()
            positions[partition] += len(fetched)
            seen += len(fetched)
    read_s = time.perf_counter() - started
    db.close()
    return {"single": singles / single_s, "batched": batches * batch_size / batch_s, "read": total / read_s}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backends", default="sqlite-raw,sqlite,sqlite-inline,kafka", help="comma-separated backends"
    )
    parser.add_argument("--singles", type=int, default=2000, help="records appended one by one")
    parser.add_argument("--batches", type=int, default=100, help="number of append_batch calls")
    parser.add_argument("--batch-size", type=int, default=500, help="records per append_batch")
    parser.add_argument("--page", type=int, default=500, help="max_records per consumer poll")
    parser.add_argument("--repeat", type=int, default=3, help="runs per backend; the table shows the median")
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {platform.processor() or platform.system()}, Python {platform.python_version()}"
    )
    print(f"values: 1 KB, {PARTITIONS} partitions, keyed; poll page {args.page}\n")
    print(
        "| backend | appends/s one by one | appends/s in batches of",
        args.batch_size,
        "| reads/s | batched, reads vs sqlite-raw |",
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    raw: dict[str, float] | None = None
    for name in args.backends.split(","):
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(prefix="orl-bench-") as workdir:
                if name == "sqlite-raw":
                    run = measure_raw(
                        Path(workdir) / "raw.db", args.singles, args.batches, args.batch_size, args.page
                    )
                    runs.append(run)
                    continue
                async with open_backend(name, Path(workdir)) as log:
                    runs.append(await measure(log, args.singles, args.batches, args.batch_size, args.page))
        rates = {metric: statistics.median(run[metric] for run in runs) for metric in runs[0]}
        raw = rates if name == "sqlite-raw" else raw
        ratio = (
            "-"
            if raw is None
            else f"{rates['batched'] / raw['batched']:.2f}x, {rates['read'] / raw['read']:.2f}x"
        )
        print(
            f"| {name} | {rates['single']:,.0f} | {rates['batched']:,.0f} | {rates['read']:,.0f} | {ratio} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
