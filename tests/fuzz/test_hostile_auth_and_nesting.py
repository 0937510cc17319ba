"""Unauthenticated requests and deeply nested JSON: no 5xx, no dropped connection, every error OpenAI JSON.

What tests/fuzz/test_http_fuzz.py does not generate (it always sends a valid key and shallow JSON):

- random `Authorization` header bytes on every keyed route, in-process (any byte, control bytes and
  CR/LF included: no HTTP parser in between) and over real HTTP (uvicorn on loopback, one connection
  per case, only bytes HTTP allows in a header value: tab, space, visible ASCII and 0x80-0xFF);
  every one must get a 401 JSON error;
- JSON nested from 1 to 20,000 levels (arrays, objects or both, brackets inside strings too) as a
  field of every body route and as a tool call's `arguments` string: at most MAX_JSON_DEPTH levels
  is never a depth error, deeper is a 400 `json_too_deep`.

In-process cases use a TestClient that raises any exception escaping the app, so a case that would
drop the connection fails the test. Counts are printed at the end (run with -s).

Run: .venv/bin/pytest tests/fuzz/test_hostile_auth_and_nesting.py -m slow -p no:cacheprovider -s
"""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from orl.schemas.json_depth import MAX_JSON_DEPTH
from starlette.applications import Starlette
from starlette.testclient import TestClient

from tests.fuzz.fuzz_server import API_KEY, BODY_ROUTES, key_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

KEYED_ROUTES = [  # (method, path): every route behind a key
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/sessions/s1/end"),
    ("GET", "/admin/policy"),
    ("POST", "/admin/unpin"),
    ("POST", "/admin/rollback"),
    *[("POST", path) for path in BODY_ROUTES],
]


def fuzz(max_examples: int) -> settings:
    """The same cases on every run (CI): a failure found once is found again."""
    return settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
def strict_client(fuzz_app: Starlette) -> TestClient:
    """Raises whatever escapes the app: in-process, that is what a dropped connection would be."""
    return TestClient(fuzz_app, raise_server_exceptions=True)


@pytest.fixture(scope="module")
def counts() -> Iterator[Counter[str]]:
    tally: Counter[str] = Counter()
    started = time.perf_counter()
    yield tally
    print(
        f"\nhostile auth and nesting: {sum(tally.values())} cases in {time.perf_counter() - started:.0f} s, "
        f"each asserting a whole response below 500: {dict(sorted(tally.items()))}"
    )


def assert_openai_error(status: int, body: bytes, content_type: str, case: object) -> dict[str, Any]:
    assert content_type.startswith("application/json"), (status, content_type, body[:200], case)
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, (error, case)
    return dict(error)


# -- random Authorization bytes --------------------------------------------------------------

ANY_BYTES = st.binary(max_size=64)
HEADER_BYTES = st.binary(max_size=64).map(  # what HTTP allows in a field value, inner whitespace included
    lambda raw: bytes(b for b in raw if b == 9 or 32 <= b <= 126 or b >= 128).strip(b" \t")
)


def authorization(values: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Anything, or "Bearer " and anything (so that the key comparison itself gets the bytes)."""
    return st.one_of(
        values, values.map(lambda raw: b"Bearer " + raw), values.map(lambda raw: b"bearer " + raw)
    )


@given(route=st.sampled_from(KEYED_ROUTES), auth=authorization(ANY_BYTES))
@fuzz(2500)
def test_random_authorization_bytes_get_401_json_in_process(
    strict_client: TestClient, counts: Counter[str], route: tuple[str, str], auth: bytes
) -> None:
    counts["unauthenticated, in-process"] += 1
    method, path = route
    body = json.dumps(BODY_ROUTES.get(path, {})).encode()
    reply = strict_client.request(method, path, content=body, headers={"authorization": auth})
    assert reply.status_code == 401, (route, auth, reply.text)
    error = assert_openai_error(reply.status_code, reply.content, reply.headers["content-type"], auth)
    assert error["code"] == "invalid_api_key"


def raw_request(port: int, head: bytes, body: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request on its own connection: (status, headers, body); an AssertionError when the server
    closes the connection without a whole response (a dropped connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head_part, separator, payload = received.partition(b"\r\n\r\n")
    assert separator, f"dropped connection: {received[:200]!r}"
    status_line, *header_lines = head_part.decode("latin-1").split("\r\n")
    headers = {
        name.lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)
    }
    assert len(payload) == int(headers.get("content-length", len(payload))), "truncated body"
    return int(status_line.split(" ")[1]), headers, payload


@given(route=st.sampled_from(KEYED_ROUTES), auth=authorization(HEADER_BYTES))
@fuzz(600)
def test_random_authorization_bytes_get_401_json_over_http(
    loopback_port: int, counts: Counter[str], route: tuple[str, str], auth: bytes
) -> None:
    counts["unauthenticated, over HTTP"] += 1
    method, path = route
    body = json.dumps(BODY_ROUTES.get(path, {})).encode()
    head = f"{method} {path} HTTP/1.1\r\nHost: orl\r\n".encode() + b"Authorization: " + auth + b"\r\n"
    status, headers, payload = raw_request(loopback_port, head, body)
    assert status == 401, (route, auth, payload[:200])
    assert assert_openai_error(status, payload, headers["content-type"], auth)["code"] == "invalid_api_key"


# -- deeply nested JSON ------------------------------------------------------------------------

DEPTHS = st.one_of(
    st.integers(1, MAX_JSON_DEPTH + 4),  # around the limit, where a mistake would show
    st.integers(MAX_JSON_DEPTH - 2, MAX_JSON_DEPTH + 2),
    st.integers(1, 20_000),  # far past it, where Python's json would recurse out
)


@st.composite
def nested_text(draw: st.DrawFn, depth: int) -> str:
    """A JSON value exactly `depth` levels deep as text: arrays, objects or both, around a scalar that
    may be a string of brackets and escapes (which must not count)."""
    kinds = draw(st.sampled_from(["[", '{"k":', "mixed"]))
    inner = draw(st.sampled_from(["1", '"[{\\"]}"', '"\\\\"', '"]]]}}}"', '"[[[{{{"']))
    opens = [kinds if kinds != "mixed" else "[" if level % 2 else '{"k":' for level in range(depth)]
    closes = ["]" if bracket == "[" else "}" for bracket in reversed(opens)]
    return "".join(opens) + inner + "".join(closes)


@given(data=st.data(), path=st.sampled_from(list(BODY_ROUTES)), depth=DEPTHS)
@fuzz(1600)
def test_nested_json_in_a_body_gets_400_past_the_limit_and_never_a_5xx(
    strict_client: TestClient, counts: Counter[str], data: st.DataObject, path: str, depth: int
) -> None:
    counts["nested body"] += 1
    value = data.draw(nested_text(depth))
    body = json.dumps(BODY_ROUTES[path])
    raw = body[:-1] + ', "extra": ' + value + "}"  # a field of its own: the body is 1 level more
    reply = strict_client.post(path, content=raw, headers={"authorization": f"Bearer {key_for(path)}"})
    assert reply.status_code < 500, (path, depth, reply.text)
    if reply.status_code >= 300:
        error = assert_openai_error(reply.status_code, reply.content, reply.headers["content-type"], depth)
        if (
            depth + 1 > MAX_JSON_DEPTH
        ):  # /admin/pin reads 4 KB at most: a long text is refused for its size first
            assert error["code"] in ("json_too_deep", "request_too_large"), (path, depth, error)
        else:
            assert error["code"] != "json_too_deep", (path, depth, error)
    else:
        assert depth + 1 <= MAX_JSON_DEPTH, (path, depth)


@given(data=st.data(), depth=DEPTHS, stream=st.booleans())
@fuzz(1000)
def test_nested_tool_call_arguments_get_400_past_the_limit_and_never_a_5xx(
    strict_client: TestClient, counts: Counter[str], data: st.DataObject, depth: int, stream: bool
) -> None:
    counts["nested tool-call arguments"] += 1
    arguments = data.draw(nested_text(depth))
    call = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": arguments}}
    body = {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        ],
        "max_tokens": 2,
        "stream": stream,
    }
    reply = strict_client.post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {API_KEY}"}
    )
    assert reply.status_code < 500, (depth, reply.text)
    if depth > MAX_JSON_DEPTH:
        error = assert_openai_error(reply.status_code, reply.content, reply.headers["content-type"], depth)
        assert error["code"] == "json_too_deep" and error["param"].endswith("function.arguments"), error
    else:
        assert reply.status_code == 200, (depth, reply.text)
