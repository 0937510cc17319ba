"""Who may act on a session: the API key that opened it.

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
