"""The key store: every session's data key (orl.schemas.sealing), in a SQLite file apart from the log.

Table `data_keys`: key id, session, tenant (the id of the client key that opened the session, once
the server knows it), the 64-byte key, when it was made and when it was forgotten. A session has at
most one live key (a unique partial index): processes that meet a new session at once converge on
the first key written. Table `tenant_names`: the name of a named tenant's client key id (the server
records it at start: `--tenant-keys`); a tenant whose key was replaced has several. `forget_sessions`
/ `forget_tenant` destroy keys: the row stays (so a reader
can say "forgotten" rather than "unknown key") and the key's bytes are overwritten, not only
unlinked: `secure_delete` zeroes freed cells and the rollback journal is deleted after each commit
(no WAL, whose frames would keep old pages).

Every process of a deployment opens the same file (`ConnectionSettings.effective_key_store()`),
so it belongs on a disk they all reach. Lookups are cached per process and the cache is dropped
whenever another connection has committed (SQLite's `data_version`, looked at every
CACHE_CHECK_S), so a key forgotten by `orl forget` stops being used by a running server within a
quarter of a second.
Reads and writes: the key store file.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from orl.schemas.errors import ConfigError
from orl.schemas.ids import side_session
from orl.schemas.sealing import UnknownDataKey, new_data_key

_SCHEMA = """
CREATE TABLE IF NOT EXISTS data_keys (
    key_id TEXT PRIMARY KEY, session_id TEXT NOT NULL, tenant TEXT, data_key BLOB,
    created_at_ms INTEGER NOT NULL, forgotten_at_ms INTEGER);
CREATE UNIQUE INDEX IF NOT EXISTS live_key ON data_keys (session_id) WHERE data_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS keys_by_tenant ON data_keys (tenant);
CREATE TABLE IF NOT EXISTS tenant_names (tenant TEXT PRIMARY KEY, name TEXT NOT NULL);
"""


CACHE_CHECK_S = 0.25  # how stale a process's cached keys may be after another process forgets


class ForgottenSession(NamedTuple):
    session_id: str
    tenant: str | None
    keys_destroyed: int
    forgotten_at_ms: int


class KeyStore:
    """Data keys by session (for writing) and by id (for reading); thread-safe within a process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._connection: sqlite3.Connection | None = (
            None  # opened on first use: `orl settings` makes no file
        )
        self._lock = threading.RLock()  # every use of the connection holds it
        self._version = -1
        self._checked_at = -CACHE_CHECK_S
        self._writing: dict[str, tuple[str, bytes]] = {}
        self._reading: dict[str, bytes | None] = {}
        self._forgotten: set[str] | None = None  # loaded on first use, dropped with the rest of the cache

    @property
    def _db(self) -> sqlite3.Connection:
        if self._connection is None:
            self._connection = self._open()
        return self._connection

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.exists()
        try:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=DELETE")
            db.execute("PRAGMA secure_delete=ON")
            db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"key store {self.path}: cannot be opened as SQLite: {exc}") from exc
        if fresh:
            os.chmod(self.path, 0o600)  # the keys are the only secret that unlocks the payloads
        return db

    def __reduce__(self) -> tuple[type[KeyStore], tuple[Path]]:
        """A key store travels to another process as its path (the other process opens the file)."""
        return (KeyStore, (self.path,))

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def key_for_writing(self, session_id: str) -> tuple[str, bytes]:
        with self._lock:
            self._drop_stale_cache()
            found = self._writing.get(session_id)
            if found is None:
                found = self._live_key(session_id) or self._make_key(session_id, None)
                self._writing[session_id] = found
            return found

    def key_for_reading(self, key_id: str) -> bytes | None:
        with self._lock:
            self._drop_stale_cache()
            if key_id in self._reading:
                return self._reading[key_id]
            row = self._db.execute("SELECT data_key FROM data_keys WHERE key_id = ?", (key_id,)).fetchone()
            if row is None:
                raise UnknownDataKey(
                    f"data key {key_id!r} is not in the key store {self.path}: the payload was sealed by a "
                    "deployment with another key store (--key-store / ORL_KEY_STORE)"
                )
            key = None if row[0] is None else bytes(row[0])
            self._reading[key_id] = key
            return key

    def was_forgotten(self, session_id: str) -> bool:
        with self._lock:
            self._drop_stale_cache()
            if self._forgotten is None:
                self._forgotten = self.forgotten_sessions()
            return session_id in self._forgotten

    def assign_tenant(self, session_id: str, tenant: str) -> None:
        """Record whose session this is (the first assignment stands); makes its key if it has none."""
        with self._lock:
            self._db.execute(
                "UPDATE data_keys SET tenant = ? WHERE session_id = ? AND tenant IS NULL",
                (tenant, session_id),
            )
            if self._live_key(session_id) is None:
                self._make_key(session_id, tenant)

    def tenant_of(self, session_id: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT tenant FROM data_keys WHERE session_id = ? AND tenant IS NOT NULL LIMIT 1",
                (session_id,),
            ).fetchone()
        return None if row is None else str(row[0])

    def name_tenant(self, tenant: str, name: str) -> None:
        """Record that the client key with id `tenant` is the named tenant `name`'s."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO tenant_names (tenant, name) VALUES (?, ?)", (tenant, name)
            )

    def tenant_names(self) -> dict[str, str]:
        """Every named tenant's name, by client key id."""
        with self._lock:
            return {str(t): str(n) for t, n in self._db.execute("SELECT tenant, name FROM tenant_names")}

    def sessions_of_named_tenant(self, name: str) -> list[str]:
        """Every session a client key of the named tenant `name` opened; a ConfigError naming the named
        tenants when there is none called so."""
        named = set(self.tenant_names().values())
        if name not in named:
            raise ConfigError(
                f"the key store {self.path} has no tenant named {name!r} "
                f"(named tenants: {', '.join(sorted(named)) or 'none'}; a server names them at start: --tenant-keys)"
            )
        return self._strings(
            "SELECT DISTINCT d.session_id FROM data_keys d JOIN tenant_names t ON d.tenant = t.tenant "
            "WHERE t.name = ? ORDER BY d.session_id",
            (name,),
        )

    def sessions_of_tenant(self, tenant: str) -> list[str]:
        return self._strings(
            "SELECT DISTINCT session_id FROM data_keys WHERE tenant = ? ORDER BY session_id", (tenant,)
        )

    def forget_sessions(self, session_ids: list[str]) -> list[ForgottenSession]:
        """Destroy every key of these sessions and of their side sessions (orl.schemas.ids.side_session:
        the judge's calls about them); returns what was destroyed per session."""
        now_ms = int(time.time() * 1000)
        out = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for session_id in session_ids:
                    side = side_session(session_id, "")  # and its side sessions: "<session>/<purpose>"
                    destroyed = self._db.execute(
                        "UPDATE data_keys SET data_key = NULL, forgotten_at_ms = ? WHERE data_key IS NOT NULL "
                        "AND (session_id = ? OR substr(session_id, 1, ?) = ?)",
                        (now_ms, session_id, len(side), side),
                    ).rowcount
                    out.append(ForgottenSession(session_id, self.tenant_of(session_id), destroyed, now_ms))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("VACUUM")  # rewrite the file: no page keeps a destroyed key's bytes
            self._writing.clear()
            self._reading.clear()
            self._forgotten = None
        return out

    def forget_tenant(self, tenant: str) -> list[ForgottenSession]:
        return self.forget_sessions(self.sessions_of_tenant(tenant))

    def forgotten_sessions(self) -> set[str]:
        return set(
            self._strings(
                "SELECT DISTINCT session_id FROM data_keys WHERE data_key IS NULL AND forgotten_at_ms IS NOT NULL"
            )
        )

    def _strings(self, query: str, parameters: tuple[str, ...] = ()) -> list[str]:
        """The first column of a query's rows, as strings."""
        with self._lock:
            return [str(row[0]) for row in self._db.execute(query, parameters)]

    def _drop_stale_cache(self) -> None:
        """Drop the cache when another connection has committed since the last look, looking at
        most every CACHE_CHECK_S (a look is a query: every event's seal would pay it)."""
        now = time.monotonic()
        if now - self._checked_at < CACHE_CHECK_S:
            return
        self._checked_at = now
        version = self._db.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version:
            self._version = version
            self._writing.clear()
            self._reading.clear()
            self._forgotten = None

    def _live_key(self, session_id: str) -> tuple[str, bytes] | None:
        row = self._db.execute(
            "SELECT key_id, data_key FROM data_keys WHERE session_id = ? AND data_key IS NOT NULL",
            (session_id,),
        ).fetchone()
        return None if row is None else (str(row[0]), bytes(row[1]))

    def _make_key(self, session_id: str, tenant: str | None) -> tuple[str, bytes]:
        key_id = uuid.uuid4().hex
        self._db.execute(
            "INSERT OR IGNORE INTO data_keys (key_id, session_id, tenant, data_key, created_at_ms) "
            "VALUES (?, ?, ?, ?, ?)",
            (key_id, session_id, tenant, new_data_key(), int(time.time() * 1000)),
        )
        live = self._live_key(session_id)  # another process may have written one first: theirs stands
        assert live is not None
        return live


class SessionTenants:
    """The named tenant of each session, as the key store records it (the tenant of the client key that
    opened it): the trainer and gate of a tenant's own run keep its sessions, the shared run skips
    private tenants'. Cached per session: a session's recorded tenant never changes. A session with
    no recorded tenant, or an unnamed key's, has none (None) and is not cached."""

    def __init__(self, keys: KeyStore) -> None:
        self._keys = keys
        self._names: dict[str, str] = {}  # client key id -> tenant name
        self._of: dict[str, str] = {}  # session -> tenant name

    def name_of(self, session_id: str) -> str | None:
        if session_id in self._of:
            return self._of[session_id]
        key_id = self._keys.tenant_of(session_id)
        if key_id is None:
            return None
        if key_id not in self._names:
            self._names = self._keys.tenant_names()  # a tenant named since the last look
        name = self._names.get(key_id)
        if name is not None:
            self._of[session_id] = name
        return name


@contextlib.contextmanager
def tenant_sessions_kept(
    path: Path | None, tenant: str, private_tenants: tuple[str, ...] = ()
) -> Iterator[Callable[[str], bool] | None]:
    """Whether a session's samples are trained (or its prompts gated) by the run of `tenant` (its own
    sessions only) or, with no tenant, by the shared run (every session but `private_tenants`'), as
    the key store at `path` names them (open while the filter is in use); None when every session's
    are (no key store opened). A run limited to some tenants checked that it has a key store at start
    (orl.connectors.settings.check_tenant_run)."""
    if not tenant and not private_tenants:
        yield None
        return
    assert path is not None, "check_tenant_run refuses a tenant filter without a key store"
    keys = KeyStore(path)
    try:
        tenants = SessionTenants(keys)
        private = frozenset(private_tenants)
        if tenant:
            yield lambda session_id: tenants.name_of(session_id) == tenant
        else:
            yield lambda session_id: tenants.name_of(session_id) not in private
    finally:
        keys.close()
