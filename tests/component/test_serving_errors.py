"""The server's one error policy, on the real app: every answer that is not a success is OpenAI-shaped JSON.

`orl.serving.app.build_app` over the zero-cost echo backend and the real SmolLM2 tokenizer, a real
recorder and spool file (as tests/component/test_capture_chat.py), driven in-process through
httpx's ASGI transport. The faults are real: a full disk is SQLite's own SQLITE_FULL (the spool's
connection gets `PRAGMA max_page_count` = its current size); ENOSPC is an OSError raised by the
spool's write method (monkeypatched: SQLite never raises OSError itself); an unreachable SGLang is a
fake SGLang server on loopback (tests/fixtures/fake_sglang.py) that is stopped after the backend
started; an unexpected exception is a RuntimeError raised by a monkeypatched tracker or metrics method.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from orl.connectors.metrics import Metrics
from orl.schemas.json_depth import MAX_JSON_DEPTH
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.openai_api import MAX_ID_CHARS
from orl.serving.policy.base import PolicyBackend
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.policy.sglang_backend import SGLangBackend
from orl.serving.request_guards import RETRY_AFTER_S, ConcurrencyLimit
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool

from benchmarks.echo_backend import EchoBackend
from tests.fixtures.fake_sglang import FakeSGLang, free_port, serve_in_thread

KEY = "errors-key"
INTERNAL_KEY = "errors-internal-key"  # the only key /v1/orl/score takes
UNICODE_KEY = "clé-ключ-鍵"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


class Server:
    def __init__(self, tmp_path: Path, template: ChatTemplate, backend: PolicyBackend) -> None:
        self.spool = EventSpool(tmp_path / "spool.db")
        self.state = ServerState(
            settings=ServeSettings(api_keys=(KEY, UNICODE_KEY), admin_key="admin", internal_key=INTERNAL_KEY),
            backend=backend,
            template=template,
            recorder=EventRecorder(self.spool, "live", clock_ms=lambda: 1_700_000_000_000),
            metrics=Metrics(),
        )
        self.state.ready = True
        transport = httpx.ASGITransport(app=build_app(self.state), raise_app_exceptions=True)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://orl")

    async def chat(self, authorization: bytes | None = None, **body: Any) -> httpx.Response:
        body = {"messages": QUESTION, "max_tokens": 4, **body}
        auth = authorization if authorization is not None else f"Bearer {KEY}".encode()
        return await self.client.post("/v1/chat/completions", json=body, headers={"authorization": auth})

    async def close(self) -> None:
        await self.client.aclose()
        self.spool.close()


@pytest.fixture(scope="module")
def template(base_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(base_model_dir)


@pytest.fixture
async def server(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[Server]:
    up = Server(tmp_path, template, EchoBackend())
    yield up
    await up.close()


def assert_error(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json", reply.headers
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    return dict(error)


# -- 401 whatever the bytes --------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer clé".encode(),  # UTF-8, as a client sends it
        b"Bearer cl\xe9",  # latin-1
        b"Bearer \xff\xfe\x00\x01\x7f",  # control and non-text bytes (in-process: no HTTP parser in between)
        "Bearer 鍵".encode(),
        b"Bearer ",
        b"bearer",
        b"\xc3\xa9",
    ],
)
async def test_a_key_that_does_not_match_gets_401_json_whatever_its_bytes(
    server: Server, authorization: bytes
) -> None:
    assert_error(await server.chat(authorization), 401, "invalid_api_key")


async def test_a_non_ascii_key_matches_its_utf8_bytes(server: Server) -> None:
    reply = await server.chat(f"Bearer {UNICODE_KEY}".encode())
    assert reply.status_code == 200, reply.text


# -- 400 past the nesting depth ----------------------------------------------------------------


def nested(depth: int) -> Any:
    """A JSON value `depth` arrays deep ([[...]])."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_body(depth: int) -> dict[str, Any]:
    """A chat body nested exactly `depth` levels: body, messages, message, then arrays."""
    message = {"role": "user", "content": "hi", "metadata": nested(depth - 3)}
    return {"messages": [message], "max_tokens": 4}


def deep_call(depth: int) -> dict[str, Any]:
    """A chat body whose assistant tool call has `arguments` nested `depth` levels (a JSON string)."""
    arguments = '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"  # built as text: json.dumps recurses
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Paris"},
    ]
    return {"messages": messages, "max_tokens": 4}


async def test_a_body_at_the_depth_limit_is_accepted_and_one_past_it_gets_400(server: Server) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    at_limit = await server.client.post(
        "/v1/chat/completions", json=deep_body(MAX_JSON_DEPTH), headers=headers
    )
    assert at_limit.status_code == 200, at_limit.text
    past = await server.client.post(
        "/v1/chat/completions", json=deep_body(MAX_JSON_DEPTH + 1), headers=headers
    )
    error = assert_error(past, 400, "json_too_deep")
    assert str(MAX_JSON_DEPTH) in error["message"] and "request body" in error["message"]


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/orl/score", "/v1/feedback"])
async def test_a_body_nested_thousands_deep_gets_400_not_a_recursion_error(
    server: Server, route: str, depth: int
) -> None:
    raw = '{"messages": ' + "[" * depth + "]" * depth + "}"
    key = INTERNAL_KEY if route == "/v1/orl/score" else KEY
    reply = await server.client.post(route, content=raw, headers={"authorization": f"Bearer {key}"})
    assert_error(reply, 400, "json_too_deep")


async def test_tool_call_arguments_at_the_limit_are_accepted_and_one_past_it_get_400(server: Server) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    at_limit = await server.client.post(
        "/v1/chat/completions", json=deep_call(MAX_JSON_DEPTH), headers=headers
    )
    assert at_limit.status_code == 200, at_limit.text
    past = await server.client.post(
        "/v1/chat/completions", json=deep_call(MAX_JSON_DEPTH + 1), headers=headers
    )
    error = assert_error(past, 400, "json_too_deep")
    assert error["param"] == "messages[1].tool_calls[0].function.arguments"
    assert str(MAX_JSON_DEPTH) in error["message"]
    huge = await server.client.post("/v1/chat/completions", json=deep_call(50_000), headers=headers)
    assert_error(huge, 400, "json_too_deep")


# -- 503 with Retry-After ----------------------------------------------------------------------


def assert_unavailable(reply: httpx.Response, code: str) -> None:
    assert_error(reply, 503, code)
    assert reply.headers["retry-after"] == str(RETRY_AFTER_S)


async def test_a_full_disk_gets_503_with_retry_after(server: Server) -> None:
    db = server.spool._db  # the spool's own connection: the size limit is per connection
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(
        f"PRAGMA max_page_count = {pages}"
    )  # once its pages are full: SQLITE_FULL, "database or disk is full"
    replies = [await server.chat() for _ in range(40)]  # turns arrive while the disk fills up
    statuses = [reply.status_code for reply in replies]
    assert set(statuses) == {200, 503} and statuses.index(503) > 0, statuses
    full = statuses.index(503)
    assert set(statuses[full:]) == {503}, statuses  # full stays full
    assert_unavailable(replies[full], "spool_unavailable")
    assert_unavailable(await server.chat(stream=True), "spool_unavailable")
    feedback = {"session_id": "s", "turn_id": "s/t0", "thumbs": 1}
    headers = {"authorization": f"Bearer {KEY}"}
    # a feedback event is smaller than a turn's: the last page's free bytes may still take a few
    replies = [await server.client.post("/v1/feedback", json=feedback, headers=headers) for _ in range(20)]
    statuses = [reply.status_code for reply in replies]
    assert 503 in statuses and set(statuses[statuses.index(503) :]) == {503}, statuses
    assert_unavailable(replies[statuses.index(503)], "spool_unavailable")
    db.execute("PRAGMA max_page_count = 1073741823")  # room again: the next turn goes through
    assert (await server.chat()).status_code == 200


async def test_an_enospc_oserror_from_the_spool_gets_503_with_retry_after(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(*args: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(server.spool, "_write", no_space)
    assert_unavailable(await server.chat(), "spool_unavailable")
    assert_unavailable(await server.chat(stream=True), "spool_unavailable")


async def test_a_spool_failure_after_a_stream_started_ends_it_with_an_error_event(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request is spooled before the 200; the response event fails once the stream is under way."""
    write = server.spool._write
    writes = 0

    def second_write_fails(*args: Any) -> None:
        nonlocal writes
        writes += 1
        if writes > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(*args)

    monkeypatch.setattr(server.spool, "_write", second_write_fails)
    reply = await server.chat(stream=True)
    assert reply.status_code == 200
    last = reply.text.strip().split("\n\n")[-1]
    assert last.startswith("data: ") and "[DONE]" not in reply.text
    assert json.loads(last[len("data: ") :])["error"]["code"] == "spool_unavailable"


async def test_an_unreachable_sglang_gets_503_with_retry_after(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    fake = FakeSGLang()
    port = free_port()
    sglang, thread = serve_in_thread(fake.app(), port)
    backend = SGLangBackend(
        f"http://127.0.0.1:{port}", model_name="fake", tokenizer_dir=tiny_tokenizer_dir, connect_timeout_s=1.0
    )
    await backend.start()
    sglang.should_exit = True  # SGLang goes away after the server started
    thread.join(timeout=10)
    up = Server(tmp_path, ChatTemplate.from_dir(tiny_tokenizer_dir), backend)
    try:
        assert_unavailable(await up.chat(), "backend_unavailable")
        streamed = await up.chat(stream=True)  # the 200 went out with the first chunk: an error event
        assert streamed.status_code == 200
        assert '"backend_unavailable"' in streamed.text.strip().split("\n\n")[-1]
    finally:
        await up.close()
        await backend.close()


# -- the final handler: JSON 500, logged once ------------------------------------------------


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info is not None]


async def test_an_unexpected_exception_in_a_handler_is_a_json_500_logged_once(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in the tracker")

    monkeypatch.setattr(server.state.tracker, "assign", broken)
    with caplog.at_level(logging.ERROR):
        error = assert_error(await server.chat(), 500, "internal_error")
    assert error["type"] == "server_error" and "tracker" not in error["message"]  # no internals leak
    assert len(tracebacks(caplog)) == 1 and "POST /v1/chat/completions" in tracebacks(caplog)[0].getMessage()


async def test_an_unexpected_exception_on_an_unguarded_route_is_a_json_500_logged_once(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """/metrics without a metrics key has no guard: the middleware around the app answers."""

    def broken() -> str:
        raise RuntimeError("a bug in the exposition")

    monkeypatch.setattr(server.state.metrics, "exposition", broken)
    with caplog.at_level(logging.ERROR):
        assert_error(await server.client.get("/metrics"), 500, "internal_error")
    assert len(tracebacks(caplog)) == 1 and "GET /metrics" in tracebacks(caplog)[0].getMessage()


@pytest.mark.parametrize("where", ["x-session-id", "session_id", "user", "prompt_cache_key"])
async def test_a_client_chosen_id_over_the_length_cap_is_a_400(server: Server, where: str) -> None:
    long_id = "s" * (MAX_ID_CHARS + 1)
    if where == "x-session-id":
        reply = await server.client.post(
            "/v1/chat/completions",
            json={"messages": QUESTION, "max_tokens": 4},
            headers={"authorization": f"Bearer {KEY}", "x-session-id": long_id},
        )
    else:
        reply = await server.chat(**{where: long_id})
    assert reply.status_code == 400, reply.text
    assert str(MAX_ID_CHARS) in reply.json()["error"]["message"]
    assert (await server.chat(**{"session_id": "s" * MAX_ID_CHARS})).status_code == 200


async def test_past_the_concurrency_limit_a_request_gets_a_json_503_at_once_and_health_still_answers() -> (
    None
):
    release = asyncio.Event()
    started = 0

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        nonlocal started
        started += 1
        if scope["path"] == "/v1/chat/completions":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    app = ConcurrencyLimit(slow, limit=2)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://orl") as client:
        held = [asyncio.create_task(client.post("/v1/chat/completions")) for _ in range(2)]
        while app.in_progress < 2:
            await asyncio.sleep(0.01)
        busy = await client.post("/v1/chat/completions")
        assert_unavailable(busy, "server_busy")
        assert (await client.get("/healthz")).status_code == 200  # not counted
        release.set()
        assert [reply.status_code for reply in await asyncio.gather(*held)] == [200, 200]
        assert (await client.post("/v1/chat/completions")).status_code == 200
    assert app.in_progress == 0 and started == 4
