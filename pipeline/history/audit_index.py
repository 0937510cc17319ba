"""The audit index: a SQLite file that maps ids to log positions, so an audit never scans history.

Tables: `events` (event id -> topic, partition, offset, type, session, turn), `links` (a typed edge
from one id to another: a vote -> its next state, a reward -> its votes, a sample -> its lineage,
a train step -> the samples it consumed), `versions` (policy version -> the checkpoints and train
steps that made it and the responses it served) and `positions` (how far each topic is indexed).
`catch_up` reads only the records appended since the last call, so the index is built
incrementally; the event bodies stay on the log and are fetched by position.
Reads: the catalog topics of one namespace. Writes: the index file (under the data dir).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orl.connectors.event_log.base import ConsumedRecord, EventLog
from orl.pipeline.history.namespace_io import catalog_topics, read_batches
from orl.schemas.codec import FORGOTTEN, decode_or_forgotten

_SCHEMA = """
CREATE TABLE IF NOT EXISTS positions (topic TEXT, part INTEGER, next_offset INTEGER, PRIMARY KEY (topic, part));
CREATE TABLE IF NOT EXISTS events (
    event_id TEXT PRIMARY KEY, event_type TEXT, topic TEXT, part INTEGER, "offset" INTEGER,
    session_id TEXT, turn_id TEXT, occurred_at INTEGER);
CREATE INDEX IF NOT EXISTS events_turn ON events (turn_id);
CREATE INDEX IF NOT EXISTS events_session ON events (session_id, event_type);
CREATE TABLE IF NOT EXISTS links (src TEXT, dst TEXT, kind TEXT, PRIMARY KEY (src, dst, kind));
CREATE INDEX IF NOT EXISTS links_dst ON links (dst, kind);
CREATE TABLE IF NOT EXISTS versions (version INTEGER, role TEXT, event_id TEXT, run_id TEXT,
    PRIMARY KEY (version, role, event_id));
"""
Position = tuple[str, int, int]
_OF_RUN = (
    "SELECT v.event_id FROM versions v JOIN events e ON e.event_id = v.event_id "
    "WHERE v.version = :version AND v.role = :role AND v.run_id = :run_id"
)
# A response records its policy version, not the run: a version number is served by the run whose
# activation of it came last before the response (or, for a response stamped just before its
# server's activation event, the first). Responses copied into a replay's namespace were served by
# the recorded run, never by a run trained in the replay, which no server activated there.
_SERVED = (
    "SELECT v.event_id FROM versions v JOIN events e ON e.event_id = v.event_id "
    "WHERE v.version = :version AND v.role = 'served' AND :run_id = COALESCE("
    "(SELECT a.run_id FROM versions a JOIN events ea ON ea.event_id = a.event_id "
    " WHERE a.version = :version AND a.role = 'activated' AND ea.occurred_at <= e.occurred_at "
    " ORDER BY ea.occurred_at DESC LIMIT 1), "
    "(SELECT a.run_id FROM versions a JOIN events ea ON ea.event_id = a.event_id "
    " WHERE a.version = :version AND a.role = 'activated' ORDER BY ea.occurred_at LIMIT 1))"
)


def index_path(data_dir: Path, namespace: str) -> Path:
    return data_dir / "audit" / f"{namespace}.sqlite"


def _links(event: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(target id, kind) for every id an event names."""
    kind = event["envelope"]["event_type"]
    if kind in ("JudgeVoteCast", "HintVoteCast"):
        yield event["next_state_event_id"], "judges"
    elif kind == "RewardDecided":
        yield from ((vote_id, "tallies") for vote_id in event["vote_ids"])
    elif kind in ("HintSelected", "HintRejected"):
        yield from ((vote_id, "selects_from") for vote_id in event["hint_vote_ids"])
    elif kind == "TeacherScored":
        yield event["hint_event_id"], "scores_with"
    elif kind in ("SampleReady", "SampleRejected"):
        yield from ((ref, "built_from") for ref in event["lineage"].values() if ref)
    elif kind == "TrainStepCompleted":
        yield from ((sample_id, "consumed") for sample_id in event["sample_ids"])


def _version_row(event: dict[str, Any]) -> tuple[int, str, str] | None:
    kind = event["envelope"]["event_type"]
    if kind == "ResponseGenerated":
        return int(event["policy_version"]), "served", ""
    if kind == "TrainStepCompleted":
        return int(event["policy_version"]), "trained", event["run_id"]
    if kind == "CheckpointPublished":
        return int(event["version"]), "checkpoint", event["run_id"]
    if kind == "PolicyActivated":
        return int(event["version"]), "activated", event["run_id"]
    if kind == "PolicyRejected":
        return int(event["version"]), "refused", event["run_id"]
    if kind == "PolicyGated":
        return int(event["version"]), "gated", event["run_id"]
    return None


class AuditIndex:
    def __init__(self, path: Path, namespace: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.namespace = namespace
        self.db = sqlite3.connect(path)
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    async def catch_up(self, log: EventLog) -> int:
        """Index every record appended since the last call; returns how many."""
        added = 0
        for topic in catalog_topics(self.namespace):
            start = dict(self.db.execute("SELECT part, next_offset FROM positions WHERE topic = ?", (topic,)))
            async for records in read_batches(log, topic, start):
                self._add(records)
                added += len(records)
        return added

    def _add(self, records: list[ConsumedRecord]) -> None:
        events: list[tuple[Any, ...]] = []
        links: list[tuple[str, str, str]] = []
        versions: list[tuple[int, str, str, str]] = []
        positions: dict[tuple[str, int], int] = {}
        for record in records:
            event = decode_or_forgotten(record.value)  # a forgotten payload: its envelope is indexed
            envelope = event["envelope"]
            event_id = envelope["event_id"]
            events.append(
                (event_id, envelope["event_type"], record.topic, record.partition, record.offset,
                 envelope.get("session_id"), envelope.get("turn_id"), envelope["occurred_at"])
            )  # fmt: skip
            if event.get(FORGOTTEN):
                positions[(record.topic, record.partition)] = record.offset + 1
                continue
            links.extend((event_id, dst, kind) for dst, kind in _links(event))
            row = _version_row(event)
            if row is not None:
                versions.append((row[0], row[1], event_id, row[2]))
            positions[(record.topic, record.partition)] = record.offset + 1
        with self.db:
            self.db.executemany("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", events)
            self.db.executemany("INSERT OR IGNORE INTO links VALUES (?, ?, ?)", links)
            self.db.executemany("INSERT OR IGNORE INTO versions VALUES (?, ?, ?, ?)", versions)
            self.db.executemany(
                "INSERT OR REPLACE INTO positions VALUES (?, ?, ?)",
                [(t, p, o) for (t, p), o in positions.items()],
            )

    def position(self, event_id: str) -> Position | None:
        row = self.db.execute(
            'SELECT topic, part, "offset" FROM events WHERE event_id = ?', (event_id,)
        ).fetchone()
        return (row[0], row[1], row[2]) if row else None

    def event_type(self, event_id: str) -> str | None:
        row = self.db.execute("SELECT event_type FROM events WHERE event_id = ?", (event_id,)).fetchone()
        return row[0] if row else None

    def turn_of(self, event_id: str) -> str | None:
        row = self.db.execute("SELECT turn_id FROM events WHERE event_id = ?", (event_id,)).fetchone()
        return row[0] if row else None

    def is_turn(self, turn_id: str) -> bool:
        return (
            self.db.execute("SELECT 1 FROM events WHERE turn_id = ? LIMIT 1", (turn_id,)).fetchone()
            is not None
        )

    def turn_events(self, turn_id: str) -> list[tuple[str, str]]:
        """(event id, type) of every event of a turn, in time order."""
        rows = self.db.execute(
            'SELECT event_id, event_type FROM events WHERE turn_id = ? ORDER BY occurred_at, topic, "offset"',
            (turn_id,),
        )
        return [(r[0], r[1]) for r in rows]

    def linking_to(self, event_id: str, kind: str) -> list[str]:
        rows = self.db.execute(
            "SELECT src FROM links WHERE dst = ? AND kind = ? ORDER BY src", (event_id, kind)
        )
        return [r[0] for r in rows]

    def by_version(self, version: int, role: str, run_id: str, limit: int = -1) -> list[str]:
        """The ids of `role` events of one run's `version`, oldest first: its train steps
        ("trained"), checkpoints ("checkpoint"), activations ("activated"), refusals by a server or
        the trainer ("refused") or the responses it served ("served", see _SERVED)."""
        query = _SERVED if role == "served" else _OF_RUN
        rows = self.db.execute(
            f"{query} ORDER BY e.occurred_at LIMIT :limit",
            {"version": version, "role": role, "run_id": run_id, "limit": limit},
        )
        return [r[0] for r in rows]

    def count_version(self, version: int, role: str, run_id: str) -> int:
        query = _SERVED if role == "served" else _OF_RUN
        row = self.db.execute(
            f"SELECT COUNT(*) FROM ({query})", {"version": version, "role": role, "run_id": run_id}
        )
        return int(row.fetchone()[0])

    def session_samples(self, session_id: str) -> list[str]:
        rows = self.db.execute(
            "SELECT event_id FROM events WHERE session_id = ? AND event_type = 'SampleReady' ORDER BY occurred_at",
            (session_id,),
        )
        return [r[0] for r in rows]
