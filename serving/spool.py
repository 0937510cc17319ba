"""A durable local spool between the server and the event log, so no captured event is ever lost.

Every captured event is first written to a SQLite file beside the server; a background task appends
spooled events to the event log in spool order and deletes them once the log has them. If the log
is down, requests are still answered and the spool grows; it drains, in order, when the log is back,
including after a restart. A crash between the log append and the delete appends a few events
twice: their deterministic event ids make the copies harmless downstream.

Two ways in, one guarantee: an event is committed to the spool file before the server acknowledges
anything that depends on it. With `sync="full"` (the default; SQLite WAL with synchronous=FULL) a
commit is on disk when it returns, so an acknowledged turn survives a power cut; with "normal" it
survives a crash of the process but a power cut can lose the last commits (benchmarks/RESULTS-serving.md
has the cost of each).
- `put` commits at once (connector outcomes, policy activations).
- `stage` is the group commit of the chat path: events staged during one event-loop tick are
  committed together in one transaction by a callback at the next tick, and `stage` returns a
  future that the handler awaits before it sends its response. One transaction per tick instead of
  one per event is most of the spool's cost under load.

A record the log refuses for good (over `--max-record-bytes`, or invalid to the broker) never blocks
the spool: it moves to the spool file's `set_aside` table with the reason, is counted in the metrics
(`orl_spool_set_aside_total`) and is listed by `orl spool`; the records behind it drain on.

Supervision: any drain error (the log down, the log's or the spool's SQLite locked past its busy
timeout, a full disk) is logged and retried with backoff, and `SpoolDrainer.problem` says why the
spool cannot drain until a drain succeeds again (the server's /readyz reports it). Above its byte
cap (`max_bytes`: the keys and values not yet drained) `refuse_if_full` raises SpoolFull, which the
server answers with a 503 for new turns until the spool has drained below it.

The spool file also keeps what the server must know again after a restart, each committed with
the turn's events: a session's next turn index, the key that opened it, and the responses of the
Responses API (their input and reply, for `previous_response_id`; `stored_conversation`).

Reads and writes: the spool file; appends to whichever topics the events are for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orl.connectors.event_log.base import EventLog, OutgoingRecord, RecordRefused
from orl.connectors.metrics import Metrics
from orl.schemas.codec import installed_data_keys
from orl.schemas.errors import OrlError
from orl.schemas.sealing import PayloadForgotten, open_blob, seal_blob
from orl.serving.settings import SPOOL_SYNC_MODES

logger = logging.getLogger(__name__)

_INSERT = "INSERT INTO spool (topic, key, value) VALUES (?, ?, ?)"
_SET_TURN_INDEX = (
    "INSERT INTO turn_indexes (session_id, next_turn_index) VALUES (?, ?) ON CONFLICT (session_id) "
    "DO UPDATE SET next_turn_index = MAX(next_turn_index, excluded.next_turn_index)"
)
_SET_OWNER = "INSERT OR IGNORE INTO session_owners (session_id, key_id) VALUES (?, ?)"
_SET_RESPONSE = (
    "INSERT OR IGNORE INTO responses (response_id, key_id, session_id, turn_id, previous_id, messages_json)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
_Row = tuple[str, bytes | None, bytes]
# key id, session id, turn id, previous response id, messages JSON
_StoredResponse = tuple[str, str, str, str | None, str | bytes]  # messages_json: sealed when bytes
_RESPONSES_PURPOSE = "spool:responses"  # what a stored response's sealed messages are bound to


def _opened(row: _StoredResponse) -> str:
    """A stored response's messages_json (opened if sealed; raises PayloadForgotten when forgotten)."""
    stored = row[4]
    if isinstance(stored, str):
        return stored
    keys = installed_data_keys()
    if keys is None:
        raise SpoolError(
            f"a stored response of session {row[1]!r} is sealed and this server has no key store"
        )
    return open_blob(bytes(stored), row[1], _RESPONSES_PURPOSE, keys).decode()


@dataclass(frozen=True)
class StoredConversation:
    """A stored response's conversation: its session, its turn, and the chat messages of its chain."""

    session_id: str
    turn_id: str
    messages: list[dict[str, Any]]


class SpoolError(OrlError):
    """The spool file refused a commit: the events of that commit are not spooled."""


class SpoolFull(SpoolError):
    """The spool holds more than its byte cap: new turns are refused until it drains below it."""


@dataclass(frozen=True)
class SpooledEvent:
    seq: int
    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True)
class SetAsideEvent:
    """A spooled event the log refused for good, kept with why and when (ms since the epoch)."""

    seq: int
    topic: str
    key: bytes | None
    value: bytes
    reason: str
    set_aside_at_ms: int


class EventSpool:
    """A FIFO of (topic, key, value) on disk. Single process; all calls from one event loop.

    `on_committed` is called after every commit that wrote rows (the drainer's wake-up); `sync` is
    "full" (a commit is on disk when it returns) or "normal" (it survives a process crash);
    `max_bytes` is the byte cap of `refuse_if_full` (None: no cap).
    """

    def __init__(
        self,
        path: Path,
        on_committed: Callable[[], None] = lambda: None,
        sync: str = "full",
        max_bytes: int | None = None,
    ) -> None:
        if sync not in SPOOL_SYNC_MODES:
            raise SpoolError(f"spool sync must be {' or '.join(SPOOL_SYNC_MODES)}, not {sync!r}")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.on_committed = on_committed
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={sync.upper()}")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS spool (seq INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,"
            " key BLOB, value BLOB NOT NULL)"
        )
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS set_aside (seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, key BLOB,"
            " value BLOB NOT NULL, reason TEXT NOT NULL, set_aside_at_ms INTEGER NOT NULL)"
        )
        # per session: the next turn index to give, so a restarted server never gives a turn id twice
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS turn_indexes (session_id TEXT PRIMARY KEY, next_turn_index INTEGER NOT NULL)"
        )
        # per session: the id of the API key that opened it (orl.serving.tenancy); the first claim stands
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS session_owners (session_id TEXT PRIMARY KEY, key_id TEXT NOT NULL)"
        )
        # per stored response (POST /v1/responses): the key that created it, its session, the response
        # it continued and the chat messages it added (its input and its reply)
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses (response_id TEXT PRIMARY KEY, key_id TEXT NOT NULL,"
            " session_id TEXT NOT NULL, turn_id TEXT NOT NULL, previous_id TEXT, messages_json TEXT NOT NULL)"
        )
        self._staged: list[_Row] = []
        self._staged_turn_indexes: dict[str, int] = {}
        self._staged_owners: dict[str, str] = {}
        self._staged_responses: dict[str, _StoredResponse] = {}
        self._group: asyncio.Future[None] | None = None  # resolved when the staged rows are committed
        self.max_bytes = max_bytes
        # the keys and values in the file and not yet drained: counted once here, then kept up to date
        self.queued_bytes = int(
            self._db.execute(
                "SELECT COALESCE(SUM(LENGTH(value) + COALESCE(LENGTH(key), 0)), 0) FROM spool"
            ).fetchone()[0]
        )

    def put(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Spool one event now: when this returns it is committed (with any events staged before it)."""
        self._staged.append((topic, key, value))
        self.commit()

    def stage(self, topic: str, key: bytes | None, value: bytes) -> asyncio.Future[None]:
        """Add an event to this tick's group commit; the future resolves once it is committed.

        Must be called from the running event loop. If the commit fails, the future raises
        SpoolError and the event is not spooled (as a failed `put` would): the caller must not
        acknowledge it. Spool order is staging order, also across `put` and `stage`.
        """
        self._staged.append((topic, key, value))
        if self._group is None:
            loop = asyncio.get_running_loop()
            self._group = loop.create_future()
            loop.call_soon(self._commit_group)
        return self._group

    def stage_turn_index(self, session_id: str, next_turn_index: int) -> None:
        """Record a session's next turn index with the next commit (the turn's events' transaction)."""
        known = self._staged_turn_indexes.get(session_id, 0)
        self._staged_turn_indexes[session_id] = max(known, next_turn_index)

    def stage_session_owner(self, session_id: str, key_id: str) -> None:
        """Record the key that opened a session with the next commit (a session keeps its first owner)."""
        self._staged_owners.setdefault(session_id, key_id)

    def session_owner(self, session_id: str) -> str | None:
        """The id of the key that opened the session (staged or committed), or None for one never opened."""
        if session_id in self._staged_owners:
            return self._staged_owners[session_id]
        row = self._db.execute(
            "SELECT key_id FROM session_owners WHERE session_id = ?", (session_id,)
        ).fetchone()
        return str(row[0]) if row else None

    def stage_response(
        self,
        response_id: str,
        key_id: str,
        turn: tuple[str, str],
        previous_id: str | None,
        messages_json: str,
    ) -> None:
        """Keep a Responses API response, answered by `turn` (session id, turn id), with the next
        commit (the turn's events' transaction); its messages are sealed with the session's data key
        like its events (orl.schemas.sealing)."""
        keys = installed_data_keys()
        stored: str | bytes = messages_json
        if keys is not None:
            stored = seal_blob(messages_json.encode(), turn[0], _RESPONSES_PURPOSE, keys)
        self._staged_responses[response_id] = (key_id, *turn, previous_id, stored)

    def stored_conversation(self, response_id: str, key_id: str) -> StoredConversation | None:
        """The conversation that ends with a stored response: its session and turn, and the chat
        messages of every response of its `previous_id` chain, oldest first. None when the response is
        not stored, or was created with another key (which may not read it)."""
        chain: list[_StoredResponse] = []
        current: str | None = response_id
        while current is not None:
            row = (
                self._staged_responses.get(current)
                or self._db.execute(
                    "SELECT key_id, session_id, turn_id, previous_id, messages_json FROM responses"
                    " WHERE response_id = ?",
                    (current,),
                ).fetchone()
            )
            if row is None or row[0] != key_id:
                return None
            chain.append(row)
            current = row[3]
        try:
            messages = [message for row in reversed(chain) for message in json.loads(_opened(row))]
        except PayloadForgotten:  # `orl forget`: the conversation can no longer be continued
            return None
        return StoredConversation(chain[0][1], chain[0][2], messages)

    def next_turn_index(self, session_id: str) -> int:
        """The session's next turn index as recorded (staged or committed); 0 for a session never seen."""
        if session_id in self._staged_turn_indexes:
            return self._staged_turn_indexes[session_id]
        row = self._db.execute(
            "SELECT next_turn_index FROM turn_indexes WHERE session_id = ?", (session_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def commit(self) -> None:
        """Commit every staged event, turn index, session owner and response in one transaction (nothing to do if
        none is staged).

        On failure the staged events are dropped, the waiters of their group get SpoolError, and
        this raises it too.
        """
        rows, group, turn_indexes, owners, responses = (
            self._staged,
            self._group,
            self._staged_turn_indexes,
            self._staged_owners,
            self._staged_responses,
        )
        self._staged, self._group = [], None
        self._staged_turn_indexes, self._staged_owners, self._staged_responses = {}, {}, {}
        if not rows and not turn_indexes and not owners and not responses:
            return
        try:
            self._write(rows, turn_indexes, owners, responses)
        except (sqlite3.Error, OSError) as error:  # OSError too: a group whose commit raised must never hang
            failure = SpoolError(f"the spool could not commit {len(rows)} event(s): {error}")
            if group is not None and not group.done():
                group.set_exception(failure)
                group.exception()  # counted as seen: a group nobody awaits (a cancelled request) must not warn
            raise failure from error
        self.queued_bytes += sum(_row_bytes(row) for row in rows)
        if group is not None and not group.done():
            group.set_result(None)
        if rows:
            self.on_committed()

    def _commit_group(self) -> None:
        try:
            self.commit()
        except SpoolError as error:  # the waiting handlers raise it; the server keeps serving
            logger.error("%s", error)

    def _write(
        self,
        rows: list[_Row],
        turn_indexes: dict[str, int],
        owners: dict[str, str],
        responses: dict[str, _StoredResponse],
    ) -> None:
        if len(rows) == 1 and not turn_indexes and not owners and not responses:
            self._db.execute(_INSERT, rows[0])  # autocommit: one statement is its own transaction
            return
        self._db.execute("BEGIN")
        try:
            self._db.executemany(_INSERT, rows)
            self._db.executemany(_SET_TURN_INDEX, list(turn_indexes.items()))
            self._db.executemany(_SET_OWNER, list(owners.items()))
            self._db.executemany(_SET_RESPONSE, [(key, *row) for key, row in responses.items()])
            self._db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):  # the transaction may already be gone (disk I/O error)
                self._db.execute("ROLLBACK")
            raise
        keys = installed_data_keys()
        if keys is not None:
            for session_id, owner in owners.items():
                keys.assign_tenant(session_id, owner)  # whose session it is, for `orl forget --tenant`

    def oldest(self, limit: int) -> list[SpooledEvent]:
        rows = self._db.execute("SELECT seq, topic, key, value FROM spool ORDER BY seq LIMIT ?", (limit,))
        return [SpooledEvent(*row) for row in rows]

    def remove_drained(self, events: list[SpooledEvent]) -> None:
        """Delete `events`, the oldest in the spool (as `oldest` gave them), once the log has them."""
        if events:
            self._db.execute("DELETE FROM spool WHERE seq <= ?", (events[-1].seq,))
            self.queued_bytes -= sum(_row_bytes((e.topic, e.key, e.value)) for e in events)

    def full_reason(self) -> str | None:
        """Why new turns are refused (the spool is over its byte cap), or None."""
        if self.max_bytes is None or self.queued_bytes < self.max_bytes:
            return None
        return (
            f"the spool holds {self.queued_bytes} bytes not yet on the event log, at or over its cap of "
            f"{self.max_bytes} (--spool-max-bytes)"
        )

    def refuse_if_full(self) -> None:
        """Raise SpoolFull while the spool is over its byte cap (before a new turn is taken on)."""
        reason = self.full_reason()
        if reason is not None:
            raise SpoolFull(reason)

    def set_aside(self, event: SpooledEvent, reason: str) -> None:
        """Keep an event the log refused for good in `set_aside` (once, however often it is refused);
        the next `remove_drained` past it takes it off the spool."""
        self._db.execute(
            "INSERT OR IGNORE INTO set_aside (seq, topic, key, value, reason, set_aside_at_ms) VALUES (?, ?, ?, ?, ?, ?)",
            (event.seq, event.topic, event.key, event.value, reason, int(time.time() * 1000)),
        )

    def set_aside_events(self) -> list[SetAsideEvent]:
        rows = self._db.execute(
            "SELECT seq, topic, key, value, reason, set_aside_at_ms FROM set_aside ORDER BY seq"
        )
        return [SetAsideEvent(*row) for row in rows]

    def depth(self) -> int:
        """Events spooled and not yet drained, including those staged for the next group commit."""
        return int(self._db.execute("SELECT COUNT(*) FROM spool").fetchone()[0]) + len(self._staged)

    def close(self) -> None:
        """Commit what is still staged, then close the file."""
        try:
            self.commit()
        finally:
            self._db.close()


async def drain_once(
    spool: EventSpool, log: EventLog, batch: int = 500, metrics: Metrics | None = None
) -> int:
    """Append the oldest spooled events to the log, one batch per topic; returns how many were moved.

    Each topic keeps the spool's order (so a session's events stay in order); the order across
    topics does not matter to consumers. The spool rows go once every topic has them: a crash in
    between re-appends a few events, which their deterministic ids make harmless. Events the log
    refuses for good are set aside (and count as moved); the others of their batch were appended.
    """
    events = spool.oldest(batch)
    by_topic: dict[str, list[SpooledEvent]] = {}
    for event in events:
        by_topic.setdefault(event.topic, []).append(event)
    for topic, pending in by_topic.items():
        while pending:  # each pass sets at least one event aside, so this ends
            try:
                await log.append_batch(topic, [OutgoingRecord(value=e.value, key=e.key) for e in pending])
                break
            except RecordRefused as refused:
                for index, reason in sorted(refused.refused.items()):
                    _set_aside(spool, pending[index], reason, metrics)
                # the others of the batch that the log did not append (it may stop at a refusal)
                pending = [
                    e
                    for i, e in enumerate(pending)
                    if refused.positions[i] is None and i not in refused.refused
                ]
    spool.remove_drained(events)
    return len(events)


def _row_bytes(row: _Row) -> int:
    return len(row[2]) + len(row[1] or b"")


def _set_aside(spool: EventSpool, event: SpooledEvent, reason: str, metrics: Metrics | None) -> None:
    spool.set_aside(event, reason)
    logger.error("set aside spooled event %d of %s: %s", event.seq, event.topic, reason)
    if metrics is not None:
        metrics.count("spool_set_aside", topic=event.topic)


class SpoolDrainer:
    """Background task: drain continuously; on any drain error retry with bounded exponential
    backoff, `problem` saying why until a drain succeeds.

    When woken by a commit it lingers `linger_s` before draining, so that under load one drain (a
    SELECT, one log append per topic, a DELETE) moves the events of many requests instead of one
    or two; an event reaches the log at most `linger_s` later than it would without the linger.
    A full batch means a backlog: the next drain follows at once.
    """

    def __init__(
        self,
        spool: EventSpool,
        log: EventLog,
        idle_s: float = 0.02,
        max_backoff_s: float = 5.0,
        linger_s: float = 0.005,
        batch: int = 500,
        metrics: Metrics | None = None,
    ) -> None:
        self.spool = spool
        self.log = log
        self.metrics = metrics
        self.idle_s = idle_s
        self.max_backoff_s = max_backoff_s
        self.linger_s = linger_s
        self.batch = batch
        self.failures = 0
        self.drains = 0  # drains that moved events (benchmarks report events per drain)
        self.problem: str | None = None  # why the spool cannot drain now (None: it drains)
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        backoff = self.idle_s
        while True:
            self._wake.clear()  # before the drain: a commit during it wakes the next round
            try:
                moved = await drain_once(self.spool, self.log, self.batch, self.metrics)
                backoff = self.idle_s
                if self.problem is not None:
                    logger.warning("the spool drains again (%d failed drains)", self.failures)
                    self.problem = None
            except (OrlError, sqlite3.Error, OSError) as error:  # keep spooling, try again later
                self.failures += 1
                self.problem = f"the spool cannot drain: {type(error).__name__}: {error}"
                if self.metrics is not None:
                    self.metrics.count("spool_drain_failures")
                logger.warning("%s; %d events spooled, retrying", self.problem, self.spool.depth())
                backoff = min(self.max_backoff_s, max(backoff * 2, 0.1))
                moved = 0
            self.drains += moved > 0
            if moved >= self.batch:
                continue
            if not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=backoff)
            if self._wake.is_set() and self.linger_s > 0:
                await asyncio.sleep(self.linger_s)

    async def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the spool is empty (tests and shutdown)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.spool.depth() > 0:
            if asyncio.get_running_loop().time() > deadline:
                raise OrlError(f"spool did not drain within {timeout_s} s ({self.spool.depth()} events left)")
            self.wake()
            await asyncio.sleep(0.01)
