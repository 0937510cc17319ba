"""A connection that does not finish a request's headers in time gets a 408 and is closed (a slowloris
no longer holds a socket forever); whole requests, kept-alive connections and slow bodies are untouched.

A real uvicorn server on loopback with orl's protocol (serving/header_deadline.py) and a small ASGI app.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from orl.serving.header_deadline import header_deadline_protocol

from tests.fixtures.kafka_broker import free_port

DEADLINE_S = 1.0


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"got " + body})


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(
        echo_app, host="127.0.0.1", port=port, log_level="warning", http=header_deadline_protocol(DEADLINE_S)
    )
    http = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(http.serve()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not http.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert http.started
    yield f"127.0.0.1:{port}"
    http.should_exit = True
    thread.join(timeout=10)


def connect(address: str) -> socket.socket:
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(10)
    return sock


def read_until_closed(sock: socket.socket) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and how long that took."""
    started, data = time.monotonic(), b""
    while chunk := sock.recv(4096):
        data += chunk
    return data, time.monotonic() - started


def test_headers_that_never_finish_get_a_408_and_the_connection_closed(server: str) -> None:
    sock = connect(server)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # the blank line never comes
    data, waited = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ")
    error = json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]
    assert (error["type"], error["code"]) == ("request_timeout", "header_timeout")
    assert waited < DEADLINE_S + 2


def test_a_connection_that_sends_nothing_is_closed_after_the_deadline(server: str) -> None:
    _, waited = read_until_closed(connect(server))
    assert DEADLINE_S - 0.2 < waited < DEADLINE_S + 2


def test_trickled_headers_count_from_the_first_byte_not_the_last(server: str) -> None:
    sock = connect(server)
    started = time.monotonic()
    for byte in b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100:  # one byte every 0.1 s: 13 s
        readable, _, _ = select.select([sock], [], [], 0.1)
        if readable:
            break
        sock.sendall(bytes([byte]))
    data, _ = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < DEADLINE_S + 2


def test_requests_on_a_kept_alive_connection_and_a_body_slower_than_the_deadline_are_answered(
    server: str,
) -> None:
    with httpx.Client(base_url=f"http://{server}") as client:
        assert client.post("/", content=b"one").text == "got one"
        time.sleep(DEADLINE_S * 1.5)  # idle between requests: uvicorn's keep-alive timeout, not this one
        assert client.post("/", content=b"two").text == "got two"

    def slow_body() -> Iterator[bytes]:
        for part in (b"a", b"b", b"c"):
            time.sleep(DEADLINE_S * 0.8)
            yield part

    assert httpx.post(f"http://{server}/", content=slow_body(), timeout=30).text == "got abc"
