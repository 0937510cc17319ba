"""Deterministic event ids: the same inputs always give the same id, so a re-run is detectable.

An id is `<kind>-<24 hex chars>`: the start of the sha256 of the canonical JSON (sorted keys, no
whitespace) of `[kind, [parts...]]`. Parts must be JSON values (str, int, float, bool, None,
lists/tuples and dicts with str keys); tuples hash like lists. `held_out_session` is the one split of
sessions into trained and held out (the trainer skips the held-out ones, the promotion gate asks their prompts).
"""

from __future__ import annotations

import hashlib
import json

from orl.schemas.errors import ConfigError

ID_HEX_CHARS = 24
# One encoder for every id: json.dumps with options builds a new one per call (a third of the cost).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)


def deterministic_id(kind: str, *parts: object) -> str:
    """The id of a `kind` of thing produced from `parts` (inputs and the config version that used them)."""
    if not kind:
        raise ValueError("deterministic_id needs a non-empty kind")
    try:
        canonical = _CANONICAL.encode([kind, list(parts)])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"deterministic_id({kind!r}, ...): parts must be finite JSON values: {exc}") from exc
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return f"{kind}-{digest[:ID_HEX_CHARS]}"


def held_out_session(session_id: str, share: float) -> bool:
    """Whether a session belongs to the held-out share: a stable hash split, the same on every machine."""
    if not 0.0 <= share < 1.0:
        raise ConfigError(f"the held-out share must be in [0, 1), got {share}")
    digest = hashlib.sha256(session_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


SIDE_SESSION_MARK = "/"  # between a session's id and the purpose of orl's own calls about it


def side_session(session_id: str, purpose: str) -> str:
    """The session of orl's own calls about a session (its LLM judge's, `purpose` "judge"), which the
    server records as side turns: their payloads quote the session's, so they are sealed with a key of
    their own that `orl forget` destroys with the session's (orl.connectors.key_store)."""
    return f"{session_id}{SIDE_SESSION_MARK}{purpose}"


TENANT_RUN_MARK = "."  # between the shared run's id and a tenant's name


def tenant_run(run_id: str, tenant: str) -> str:
    """The run of a named tenant's own adapter beside the shared run `run_id`: its trainer and gate run
    it (--tenant), and a server following `run_id` with --tenant-adapters answers the tenant with it."""
    return f"{run_id}{TENANT_RUN_MARK}{tenant}"
