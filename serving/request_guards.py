"""Request plumbing shared by the server's routes: bearer-key guard, bounded body reading, and the one
error policy (`as_api_error`, applied by `guard` and by `FinalErrorHandler` around the whole app).

Every answer that is not a success leaves as OpenAI-shaped JSON (`{"error": {...}}`) with the right
status: 401 for a key that does not match, whatever its bytes; 4xx for bad input; 503 with
`Retry-After` when the spool or the model backend cannot take the request; 500 `server_error` for
anything unexpected, logged once with its traceback. Reads and writes nothing itself.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import sqlite3
from collections.abc import Awaitable, Callable

import httpx
from orl.schemas.errors import ServiceUnavailable
from orl.serving.openai_api import ApiError, error_body
from orl.serving.policy.base import PolicyError
from orl.serving.spool import SpoolError, SpoolFull
from orl.serving.tenancy import KEY_ID_SCOPE, key_id
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
DEFAULT_BODY_TIMEOUT_S = 30.0  # the whole body, however it is sent; a client that trickles it gets a 408
RETRY_AFTER_S = 5  # a 503's Retry-After: a full disk or a restarting backend is rarely back sooner


def api_error(error: ApiError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status == 503 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def as_api_error(error: Exception, where: str) -> ApiError:
    """The one error policy: the status and OpenAI body any exception from a handler becomes.

    What is not the client's doing is logged here (`where` says which request), so once.
    """
    if isinstance(error, ApiError):
        return error
    if isinstance(error, SpoolFull):  # the log has not taken what is spooled: not the client's doing
        logger.warning("%s: %s", where, error)
        return ApiError(
            503,
            "the server's spool is full (the event log is not taking its events); retry later",
            code="spool_full",
            error_type="server_error",
        )
    storage = isinstance(error, OSError) and not isinstance(error, TimeoutError)
    if storage or isinstance(error, SpoolError | sqlite3.Error):  # a full disk, an I/O error
        logger.error("%s: the spool cannot take the request: %r", where, error)
        return ApiError(
            503,
            "the server cannot record requests right now (its spool failed); retry later",
            code="spool_unavailable",
            error_type="server_error",
        )
    if isinstance(error, ServiceUnavailable | httpx.TransportError):
        logger.error("%s: the model backend cannot be reached: %r", where, error)
        return ApiError(
            503,
            "the model backend cannot be reached; retry later",
            code="backend_unavailable",
            error_type="server_error",
        )
    if isinstance(error, PolicyError):  # the backend failed on valid input: a server error
        logger.error("%s: the backend failed: %s", where, error)
        return ApiError(500, str(error), code="backend_error", error_type="server_error")
    logger.error("%s: unexpected error", where, exc_info=error)
    return ApiError(
        500,
        "the server had an error while processing the request",
        code="internal_error",
        error_type="server_error",
    )


def _where(scope: Scope) -> str:
    return f"{scope.get('method', '?')} {scope.get('path', '?')}"


def guard(handler: Handler, keys: tuple[str, ...]) -> Handler:
    """Bearer-key check (constant time, on bytes); every error the handler raises goes through `as_api_error`.
    The handler finds the id of the key that matched in the request's scope (orl.serving.tenancy)."""
    key_bytes = [key.encode("utf-8", "surrogatepass") for key in keys if key]
    key_ids = [key_id(key) for key in key_bytes]

    async def guarded(request: Request) -> Response:
        given = request.headers.get("authorization", "")
        token = _header_bytes(given[7:]) if given.lower().startswith("bearer ") else b""
        # every key is compared (no early exit), each in constant time
        matches = [hmac.compare_digest(token, key) for key in key_bytes]
        if not token or not any(matches):
            return JSONResponse(
                error_body(
                    "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                    "invalid_request_error",
                    code="invalid_api_key",
                ),
                status_code=401,
            )
        request.scope[KEY_ID_SCOPE] = key_ids[matches.index(True)]
        try:
            return await handler(request)
        except Exception as error:  # the error policy answers it; nothing is swallowed unlogged
            return api_error(as_api_error(error, _where(request.scope)))

    return guarded


def _header_bytes(value: str) -> bytes:
    """A header value as the bytes the client sent: servers decode header bytes as latin-1; a value
    that is not latin-1 (possible only in-process) is taken as UTF-8, lone surrogates included."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8", "surrogatepass")


UNLIMITED_PATHS = ("/healthz", "/readyz", "/metrics")  # always answered: supervisors must see a busy server


class ConcurrencyLimit:
    """ASGI middleware: at most `limit` requests in progress (streams until they end); one more is
    answered at once with a JSON 503 `server_busy` and Retry-After, never queued without bound.
    The health and metrics routes are not counted and always answered."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.in_progress = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_progress >= self.limit:
            busy = ApiError(
                503,
                f"the server is at its limit of {self.limit} requests in progress (--max-concurrent-requests); "
                "retry later",
                code="server_busy",
                error_type="server_error",
            )
            await api_error(busy)(scope, receive, send)
            return
        self.in_progress += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_progress -= 1


class FinalErrorHandler:
    """ASGI middleware around the whole app: an exception no route answered becomes `as_api_error`'s
    JSON (500 `server_error` when unexpected), not a plain-text 500 or a dropped connection.

    When the response has already started (a stream), the status line is gone: the error is logged
    and the body is ended cleanly. The chat stream sends an SSE error event itself before that
    (orl.serving.app).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = finished = False

        async def tracked(message: Message) -> None:
            nonlocal started, finished
            if message["type"] == "http.response.start":
                started = True
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as error:  # the error policy answers it; nothing is swallowed unlogged
            if not started:
                await api_error(as_api_error(error, _where(scope)))(scope, receive, send)
                return
            logger.error("%s: error after the response started", _where(scope), exc_info=error)
            if not finished:
                await send({"type": "http.response.body", "body": b"", "more_body": False})


async def read_body(request: Request, limit: int, timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> bytes:
    """The whole body: 413 once it exceeds `limit` (declared or sent, without reading the rest), 408
    when it has not all arrived within `timeout_s` (a slow client must not hold a handler forever)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413,
            f"request body of {declared} bytes exceeds the limit of {limit} bytes",
            code="request_too_large",
        )
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(
                        413, f"request body exceeds the limit of {limit} bytes", code="request_too_large"
                    )
                chunks.append(chunk)
    except ClientDisconnect as error:  # nobody will read the answer; the status is for the logs
        raise ApiError(
            499, "the client left before its request body arrived", code="client_disconnected"
        ) from error
    except TimeoutError as error:
        raise ApiError(
            408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout"
        ) from error
    return b"".join(chunks)
