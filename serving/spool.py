"""A durable local spool between the server and the event log, so no captured event is ever lost.

Every captured event is first written to a SQLite file beside the server (one small insert); a
background task appends spooled events to the event log in spool order and deletes them once the
log has them. If the log is down, requests are still answered and the spool grows; it drains, in
order, when the log is back, including after a restart. A crash between the log append and the
delete appends a few events twice: their deterministic event ids make the copies harmless downstream.

Reads and writes: the spool file; appends to whichever topics the events are for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from connectors.event_log.base import EventLog, OutgoingRecord
from schemas.errors import OrlError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpooledEvent:
    seq: int
    topic: str
    key: bytes | None
    value: bytes


class EventSpool:
    """A FIFO of (topic, key, value) on disk. Single process; all calls from one event loop."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # survives a process crash; the log itself fsyncs
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,"
            " key BLOB, value BLOB NOT NULL)"
        )

    def put(self, topic: str, key: bytes | None, value: bytes) -> None:
        self._db.execute("INSERT INTO spool (topic, key, value) VALUES (?, ?, ?)", (topic, key, value))

    def oldest(self, limit: int) -> list[SpooledEvent]:
        rows = self._db.execute("SELECT seq, topic, key, value FROM spool ORDER BY seq LIMIT ?", (limit,))
        return [SpooledEvent(*row) for row in rows]

    def remove_through(self, seq: int) -> None:
        self._db.execute("DELETE FROM spool WHERE seq <= ?", (seq,))

    def depth(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])

    def close(self) -> None:
        self._db.close()


async def drain_once(spool: EventSpool, log: EventLog, batch: int = 500) -> int:
    """Append the oldest spooled events to the log, one batch per topic; returns how many were moved.

    Each topic keeps the spool's order (so a session's events stay in order); the order across
    topics does not matter to consumers. The spool rows go once every topic has them: a crash in
    between re-appends a few events, which their deterministic ids make harmless.
    """
    events = spool.oldest(batch)
    by_topic: dict[str, list[OutgoingRecord]] = {}
    for event in events:
        by_topic.setdefault(event.topic, []).append(OutgoingRecord(value=event.value, key=event.key))
    for topic, records in by_topic.items():
        await log.append_batch(topic, records)
    if events:
        spool.remove_through(events[-1].seq)
    return len(events)


class SpoolDrainer:
    """Background task: drain continuously; on log errors retry with bounded exponential backoff."""

    def __init__(
        self, spool: EventSpool, log: EventLog, idle_s: float = 0.02, max_backoff_s: float = 5.0
    ) -> None:
        self.spool = spool
        self.log = log
        self.idle_s = idle_s
        self.max_backoff_s = max_backoff_s
        self.failures = 0
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        backoff = self.idle_s
        while True:
            try:
                moved = await drain_once(self.spool, self.log)
                backoff = self.idle_s
            except OrlError as error:  # the log is down: keep spooling, try again later
                self.failures += 1
                logger.warning("event log unavailable (%s); %d events spooled", error, self.spool.depth())
                backoff = min(self.max_backoff_s, max(backoff * 2, 0.1))
                moved = 0
            if moved == 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=backoff)

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the spool is empty (tests and shutdown)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.spool.depth() > 0:
            if asyncio.get_running_loop().time() > deadline:
                raise OrlError(f"spool did not drain within {timeout_s} s ({self.spool.depth()} events left)")
            self.wake()
            await asyncio.sleep(0.01)
