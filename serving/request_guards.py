"""Request plumbing shared by the server's routes: bearer-key guard, bounded body reading, JSON objects.

Every error leaves as OpenAI-shaped JSON (`{"error": {...}}`) with the right status code.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from orl.serving.openai_api import ApiError, bad_request, check_encodable, error_body
from orl.serving.policy.base import PolicyError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

Handler = Callable[[Request], Awaitable[Response]]
DEFAULT_BODY_TIMEOUT_S = 30.0  # the whole body, however it is sent; a client that trickles it gets a 408


def api_error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def guard(handler: Handler, keys: tuple[str, ...]) -> Handler:
    """Bearer-key check (constant time); every error, including unexpected input, is OpenAI-shaped JSON."""

    async def guarded(request: Request) -> Response:
        given = request.headers.get("authorization", "")
        token = given[7:] if given.lower().startswith("bearer ") else ""
        if not token or not any(hmac.compare_digest(token, key) for key in keys if key):
            return JSONResponse(
                error_body(
                    "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                    "invalid_request_error",
                    code="invalid_api_key",
                ),
                status_code=401,
            )
        try:
            return await handler(request)
        except ApiError as error:
            return api_error(error)
        except PolicyError as error:  # the backend failed on valid input: a server error, still OpenAI-shaped
            return JSONResponse(error_body(str(error), "server_error", code="backend_error"), status_code=500)

    return guarded


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


def json_object(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise bad_request(f"request body is not valid JSON: {error}", code="invalid_json") from error
    if not isinstance(value, dict):
        raise bad_request("request body must be a JSON object", code="invalid_type")
    check_encodable(value)
    return value
