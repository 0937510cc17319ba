"""The server's spool on real SQLite files: group commit, its failure path, and the drainer into a real log.

A failing commit is a real SQLite failure: a trigger in the spool file aborts inserts of one topic.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from orl.connectors.event_log.base import TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.serving.spool import EventSpool, SpoolDrainer, SpoolError


def rows(spool: EventSpool) -> list[tuple[str, bytes | None, bytes]]:
    return [(e.topic, e.key, e.value) for e in spool.oldest(1000)]


def reject_topic(path: Path, topic: str) -> None:
    """Make the spool file itself refuse inserts of `topic`, as a full or broken disk would."""
    db = sqlite3.connect(str(path))
    db.execute(
        f"CREATE TRIGGER reject BEFORE INSERT ON spool WHEN NEW.topic = '{topic}' "
        "BEGIN SELECT RAISE(ABORT, 'rejected by the test'); END"
    )
    db.commit()
    db.close()


class CommitCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


async def test_events_staged_in_one_tick_are_committed_together_at_the_next(tmp_path: Path) -> None:
    commits = CommitCounter()
    spool = EventSpool(tmp_path / "spool.db", on_committed=commits)
    first = spool.stage("t.requests", b"s1", b"a")
    second = spool.stage("t.responses", None, b"b")
    assert first is second  # one group, one future
    assert rows(spool) == [] and spool.depth() == 2  # staged, not yet in the file
    await second
    assert rows(spool) == [("t.requests", b"s1", b"a"), ("t.responses", None, b"b")]
    assert commits.calls == 1 and spool.depth() == 2
    third = spool.stage("t.requests", b"s2", b"c")
    assert third is not first and not third.done()
    await third
    assert commits.calls == 2 and len(rows(spool)) == 3


async def test_put_commits_at_once_after_what_was_staged_before_it(tmp_path: Path) -> None:
    spool = EventSpool(tmp_path / "spool.db")
    staged = spool.stage("t.requests", None, b"staged")
    spool.put("t.next_states", None, b"put")
    assert staged.done() and staged.exception() is None  # the put committed the group with it
    assert [value for _, _, value in rows(spool)] == [b"staged", b"put"]
    await asyncio.sleep(0)  # the scheduled group commit finds nothing left to do
    assert len(rows(spool)) == 2


async def test_a_failed_group_commit_spools_none_of_its_events_and_fails_its_waiters(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = EventSpool(path)
    reject_topic(path, "t.bad")
    group = spool.stage("t.requests", None, b"a")
    spool.stage("t.bad", None, b"b")
    with pytest.raises(SpoolError, match=r"could not commit 2 event\(s\).*rejected by the test"):
        await group
    assert rows(spool) == [] and spool.depth() == 0  # all or nothing: the whole group is dropped
    await spool.stage("t.requests", None, b"c")  # the next group is independent of the failed one
    assert rows(spool) == [("t.requests", None, b"c")]


async def test_a_failed_put_raises_and_spools_nothing(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = EventSpool(path)
    reject_topic(path, "t.bad")
    with pytest.raises(SpoolError):
        spool.put("t.bad", None, b"x")
    spool.put("t.good", None, b"y")
    assert rows(spool) == [("t.good", None, b"y")]


async def test_a_failed_group_that_nobody_awaits_does_not_stop_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = EventSpool(path)
    reject_topic(path, "t.bad")
    spool.stage("t.bad", None, b"x")  # e.g. the request was cancelled before it awaited
    await asyncio.sleep(0.01)
    assert spool.depth() == 0
    spool.put("t.good", None, b"y")
    assert rows(spool) == [("t.good", None, b"y")]


def test_close_commits_what_is_still_staged(tmp_path: Path) -> None:
    async def stage_and_close() -> None:
        spool = EventSpool(tmp_path / "spool.db")
        spool.stage("t.requests", None, b"last")
        spool.close()  # before the group commit's tick: shutdown must not lose it

    asyncio.run(stage_and_close())
    assert rows(EventSpool(tmp_path / "spool.db")) == [("t.requests", None, b"last")]


def test_stage_needs_the_running_event_loop(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        EventSpool(tmp_path / "spool.db").stage("t.requests", None, b"x")


async def test_the_drainer_moves_many_ticks_of_events_in_one_drain_in_order(tmp_path: Path) -> None:
    log = SqliteEventLog(tmp_path / "log.db")
    await log.start()
    await log.create_topics([TopicSpec("t.requests"), TopicSpec("t.responses")])
    spool = EventSpool(tmp_path / "spool.db")
    drainer = SpoolDrainer(spool, log, linger_s=0.5)  # long: a loaded test machine must not split it
    spool.on_committed = drainer.wake
    task = asyncio.create_task(drainer.run())
    try:
        await asyncio.sleep(0.01)  # the drainer finds the spool empty and waits
        for i in range(10):  # ten ticks, ten group commits, all within the linger
            spool.stage("t.requests", b"s", b"q%d" % i)
            await spool.stage("t.responses", b"s", b"r%d" % i)
        await drainer.flush(5.0)
        assert drainer.drains == 1
        for topic, prefix in (("t.requests", b"q"), ("t.responses", b"r")):
            consumer = log.consumer("check", [topic])
            await consumer.start()
            records = await consumer.poll(100, timeout_s=1.0)
            await consumer.close()
            assert [r.value for r in records] == [prefix + b"%d" % i for i in range(10)]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await log.close()
        spool.close()


def test_the_spool_syncs_every_commit_to_disk_unless_told_normal(tmp_path: Path) -> None:
    full = EventSpool(tmp_path / "full.db")
    normal = EventSpool(tmp_path / "normal.db", sync="normal")
    # SQLite's own answer for this connection: 2 = FULL (fsync at each WAL commit), 1 = NORMAL
    assert full._db.execute("PRAGMA synchronous").fetchone() == (2,)
    assert normal._db.execute("PRAGMA synchronous").fetchone() == (1,)
    full.put("t", None, b"v")
    assert rows(full) == [("t", None, b"v")]
    full.close()
    normal.close()
    with pytest.raises(SpoolError, match="full or normal"):
        EventSpool(tmp_path / "other.db", sync="off")


async def test_a_sessions_next_turn_index_is_committed_with_its_events_and_survives_a_reopen(
    tmp_path: Path,
) -> None:
    spool = EventSpool(tmp_path / "spool.db")
    assert spool.next_turn_index("s1") == 0
    spool.stage_turn_index("s1", 2)
    assert spool.next_turn_index("s1") == 2  # staged: seen before the commit too
    await spool.stage("requests", b"s1", b"turn 1")
    spool.stage_turn_index("s1", 1)  # a late, lower value never moves it back
    spool.put("requests", b"s1", b"more")
    spool.close()
    reopened = EventSpool(tmp_path / "spool.db")  # a restarted server
    assert (reopened.next_turn_index("s1"), reopened.next_turn_index("s2")) == (2, 0)
    reopened.close()
