"""SQLite-only guarantees of the event log: crash safety under kill -9, several writer processes, member expiry.

The other processes run `tests/contract/sqlite_log_process.py`; they share one SQLite file with
the test, as the embedded stack's processes do.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from orl.connectors.event_log.base import ConsumedRecord, OutgoingRecord, TopicPartition, TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog, decode_headers, encode_headers

from tests.contract.sqlite_log_process import parse_value, record_value

pytestmark = pytest.mark.timeout(90)

REPO_ROOT = Path(__file__).resolve().parents[2]
BATCH_SIZE = 200
BATCHES = 150


def start_process(*args: object) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "tests.contract.sqlite_log_process", *map(str, args)]
    return subprocess.Popen(command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def start_writer(
    db: Path, topic: str, writer: str, batches: int, batch_size: int, *flags: str
) -> subprocess.Popen[str]:
    return start_process("write", db, topic, writer, batches, batch_size, *flags)


def reported_appends(lines: list[str]) -> list[tuple[str, int, int, int]]:
    """(writer, batch, first offset, last offset) of every append the writer said had returned."""
    rows = [line.split() for line in lines if line.startswith("appended ")]
    return [(writer, int(batch), int(first), int(last)) for _, writer, batch, first, last in rows]


async def read_all(log: SqliteEventLog, topic: str) -> list[ConsumedRecord]:
    async with log.consumer(f"check-{time.monotonic_ns()}", [topic]) as consumer:
        records: list[ConsumedRecord] = []
        while batch := await consumer.poll(max_records=5000, timeout_s=0):
            records += batch
    return records


def assert_whole_batches(records: list[ConsumedRecord], batch_size: int) -> dict[tuple[str, int], list[int]]:
    """Every record intact, every batch complete and contiguous; returns the offsets per (writer, batch)."""
    offsets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for record in records:
        writer, batch, index = parse_value(record.value)
        assert record.value == record_value(writer, batch, index), f"corrupt record at offset {record.offset}"
        assert record.headers == (("writer", writer.encode()),)
        offsets[(writer, batch)].append(record.offset)
    for key, batch_offsets in offsets.items():
        assert batch_offsets == list(range(batch_offsets[0], batch_offsets[0] + batch_size)), (
            f"partial batch {key}"
        )
    return offsets


async def test_kill_9_mid_batch_exposes_no_partial_batch_and_loses_no_returned_append(tmp_path: Path) -> None:
    db, topic, rounds = tmp_path / "log.db", "crash", 4
    async with SqliteEventLog(db) as log:
        await log.create_topics([TopicSpec(topic, 1)])
        reported = []
        for round_index in range(rounds):
            with start_writer(db, topic, f"w{round_index}", 10_000, BATCH_SIZE) as writer:
                assert writer.stdout is not None
                lines = [writer.stdout.readline() for _ in range(random.randint(3, 12))]
                for _ in range(20):  # a reader racing the writer only ever sees whole batches
                    end = (await log.end_offsets(topic))[0]
                    assert end % BATCH_SIZE == 0, f"reader saw a partial batch: end offset {end}"
                    await asyncio.sleep(random.uniform(0, 0.005))
                writer.kill()
                lines += writer.stdout.readlines()
            assert writer.returncode == -9
            reported += reported_appends(lines)
        records = await read_all(log, topic)
    offsets = assert_whole_batches(records, BATCH_SIZE)
    assert len(reported) >= 3 * rounds
    for writer_id, batch, first, last in reported:
        assert offsets[(writer_id, batch)] == list(range(first, last + 1)), (
            f"lost returned append {writer_id}/{batch}"
        )
    assert [r.offset for r in records] == list(range(len(records)))


async def test_two_processes_append_concurrently(tmp_path: Path) -> None:
    db, topic = tmp_path / "log.db", "shared"
    async with SqliteEventLog(db) as log:
        await log.create_topics([TopicSpec(topic, 1)])
        with (
            # A writer that appends back to back can starve the other in SQLite's busy handler
            # (it sleeps while the lock is re-taken); a short pause between appends lets both in.
            start_writer(db, topic, "a", BATCHES, 5, "--wait-for-go", "--pause-s", 0.002) as writer_a,
            start_writer(db, topic, "b", BATCHES, 5, "--wait-for-go", "--pause-s", 0.002) as writer_b,
        ):
            writers = [writer_a, writer_b]
            assert [writer.stdout.readline() for writer in writers if writer.stdout] == ["ready\n", "ready\n"]
            for writer in writers:  # both go before either is waited for
                assert writer.stdin is not None
                writer.stdin.write("go\n")
                writer.stdin.flush()
            outputs = [writer.communicate(timeout=60)[0] for writer in writers]
        assert [writer.returncode for writer in writers] == [0, 0]
        records = await read_all(log, topic)
    offsets = assert_whole_batches(records, 5)
    assert [r.offset for r in records] == list(range(2 * BATCHES * 5))
    for name, output in zip(("a", "b"), outputs, strict=True):
        assert len(reported_appends(output.splitlines())) == BATCHES
        firsts = [offsets[(name, batch)][0] for batch in range(BATCHES)]
        assert firsts == sorted(firsts), f"writer {name}'s batches out of order"
    first_half = {parse_value(r.value)[0] for r in records[: BATCHES * 5]}
    assert first_half == {"a", "b"}, "the writers did not run at the same time"


async def test_partitions_of_a_killed_member_move_to_a_live_one(tmp_path: Path) -> None:
    db, session_timeout_s = tmp_path / "log.db", 1.0
    options = {"session_timeout_s": session_timeout_s, "heartbeat_interval_s": 0.2}
    async with SqliteEventLog(db, **options) as log:
        await log.create_topics([TopicSpec("t", 2)])
        await log.append_batch("t", [OutgoingRecord(b"v", key=str(i).encode()) for i in range(20)])
        with start_process("join", db, "t", "g", session_timeout_s) as doomed:
            assert doomed.stdout is not None and doomed.stdout.readline() == "joined\n"
            async with log.consumer("g", ["t"]) as survivor:
                (kept,) = await survivor.assignment()
                (taken,) = {TopicPartition("t", 0), TopicPartition("t", 1)} - {kept}
                await survivor.commit({taken: 3})
                await asyncio.sleep(1.5 * session_timeout_s)  # the member is alive: it heartbeats
                assert await survivor.poll(timeout_s=0) and await survivor.assignment() == {kept}
                doomed.kill()
                doomed.wait()
                records = await survivor.poll(max_records=1000, timeout_s=3 * session_timeout_s)
                assert await survivor.assignment() == {kept, taken}
                assert min(r.offset for r in records if r.topic_partition == taken) == 3


@given(st.lists(st.tuples(st.text(), st.binary())))
def test_headers_encoding_round_trips(headers: list[tuple[str, bytes]]) -> None:
    assert decode_headers(encode_headers(tuple(headers))) == tuple(headers)
