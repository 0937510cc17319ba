"""Who may act on a session (the API key that opened it), and which routes are orl's own.

Key classes: client keys (--api-keys) take the OpenAI routes and the ingest routes; the internal key
(--internal-key, held by the pipeline and the gate) takes the chat routes and is the only key
POST /v1/orl/score takes (`require_internal_key`); the admin key takes /admin only.

A session belongs to the key that opened it (its first chat turn, or POST /v1/sessions/start).
Feedback, rewards, observations, webhooks, ends and chat turns that name a session another key
opened are refused with a 403; conversations are linked by their messages only among one key's
own sessions (`SessionTracker.assign(owner=...)`). Keys are known by `key_id`, a hash, so the
spool file never holds a key. A session opened before owners were recorded has none: the first
key that acts on it claims it.
Reads and writes: the spool file's session_owners table (through EventSpool).
"""

from __future__ import annotations

import hashlib

from orl.serving.openai_api import ApiError
from orl.serving.spool import EventSpool
from starlette.requests import Request

KEY_ID_SCOPE = "orl.key_id"  # where `guard` leaves the id of the key a request was sent with


def key_id(key: bytes) -> str:
    """The id of an API key as sessions record it (a hash: the key cannot be read back from it)."""
    return hashlib.sha256(b"orl-session-owner:" + key).hexdigest()[:24]


def request_key_id(request: Request) -> str:
    """The id of the key a guarded request was sent with."""
    return str(request.scope[KEY_ID_SCOPE])


def check_session_owner(spool: EventSpool, session_id: str, request: Request) -> None:
    """403 unless the session is the requesting key's own, or has no owner yet (which it then gets)."""
    caller = request_key_id(request)
    owner = spool.session_owner(session_id)
    if owner is None:
        spool.stage_session_owner(session_id, caller)
    elif owner != caller:
        raise ApiError(
            403,
            f"session {session_id!r} belongs to another API key: only the key that opened a session "
            "may add to it, reward it or end it",
            param="session_id",
            code="session_forbidden",
        )


def require_internal_key(request: Request, internal_key: str) -> None:
    """403 unless the request came with the server's internal key (a client key is not enough)."""
    if not internal_key or request_key_id(request) != key_id(internal_key.encode("utf-8", "surrogatepass")):
        configured = "" if internal_key else " (this server has none: start it with --internal-key)"
        raise ApiError(
            403,
            f"{request.url.path} is for orl's own pipeline and gate: it takes the server's internal key "
            f"(--internal-key / ORL_INTERNAL_KEY){configured}, not a client key",
            code="internal_key_required",
        )
