"""Hostile input over the whole HTTP surface: no request may get a 5xx or hang the server.

schemathesis reads the server's own GET /openapi.json and drives the real app in-process (ASGI):
schema-valid and schema-violating requests to every operation, with valid keys. Each response must
not be a 5xx, must have a documented status, content type and body, and a request the document
calls invalid must get a 4xx (so the document is never stricter than the handlers). The server is
`build_app` over the zero-cost echo backend, the real SmolLM2 tokenizer, a real spool file and
recorder, admin routes over an empty local checkpoint store, and one webhook mapping (tests/fuzz/conftest.py,
fuzz_server.py). Explicit
cases cover what a generator does not send: huge, truncated and mis-typed bodies, and a body that
arrives slowly (over real HTTP, uvicorn on loopback). Unauthenticated requests and deeply nested
JSON: test_hostile_auth_and_nesting.py.

Run: .venv/bin/pytest tests/fuzz -m slow -p no:cacheprovider -s   (prints the number of cases)
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import BaseSchema, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config._checks import NegativeDataRejectionConfig
from schemathesis.generation.hypothesis.builder import HypothesisTestConfig, HypothesisTestMode, create_test
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.applications import Starlette
from starlette.testclient import TestClient

from tests.fuzz.fuzz_server import API_KEY, BODY_ROUTES, BODY_TIMEOUT_S, key_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Cases per operation: the bodies with the most rules get the most; GETs without inputs need few.
MAX_EXAMPLES = 150
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def api_schema(fuzz_app: Starlette) -> BaseSchema:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    # valid and invalid requests, always with a valid key (401s would hide what a handler does)
    schema.config.generation.update(modes=list(GenerationMode), with_security_parameters=False)
    # an invalid request may also be too large (413) or name no webhook (404) or no known turn (409)
    schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(
        expected_statuses=[400, 404, 408, 409, 413]
    )
    return schema


@pytest.fixture(scope="module")
def case_counts() -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    started = time.perf_counter()
    yield counts
    print(
        f"\nschemathesis: {sum(counts.values())} cases over {len(counts)} operations in "
        f"{time.perf_counter() - started:.0f} s (this module so far): {dict(sorted(counts.items()))}"
    )


# Every operation of the document (test_every_route_is_fuzzed keeps this list complete).
OPERATIONS = [
    ("GET", "/openapi.json"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/sessions/{session_id}/end"),
    ("POST", "/v1/orl/score"),
    ("POST", "/v1/feedback"),
    ("POST", "/v1/rewards"),
    ("POST", "/v1/observations"),
    ("POST", "/v1/webhooks/{name}"),
    ("POST", "/v1/sessions/start"),
    ("GET", "/admin/policy"),
    ("POST", "/admin/pin"),
    ("POST", "/admin/unpin"),
    ("POST", "/admin/rollback"),
]


def test_every_route_is_fuzzed(fuzz_client: TestClient) -> None:
    paths = fuzz_client.get("/openapi.json").json()["paths"]
    documented = {(method.upper(), path) for path, item in paths.items() for method in item}
    assert documented == set(OPERATIONS)


NO_INPUT = {  # nothing to vary but the key (always valid here): a few cases are enough
    "/openapi.json",
    "/healthz",
    "/readyz",
    "/metrics",
    "/v1/models",
    "/admin/policy",
    "/admin/unpin",
    "/admin/rollback",
}


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_no_generated_request_gets_a_server_error(
    api_schema: BaseSchema, case_counts: Counter[str], method: str, path: str
) -> None:
    """schemathesis' three phases: the document's examples, its coverage cases (each boundary, each
    field missing, null or of the wrong type), then random valid and invalid requests."""
    key = key_for(path)

    def fuzz(case: Case) -> None:
        case_counts[f"{method} {path}"] += 1
        case.headers["Authorization"] = f"Bearer {key}"  # always valid: a 401 would hide the handler
        case.call_and_validate(checks=CHECKS)

    config = HypothesisTestConfig(
        project=api_schema.config,
        modes=list(HypothesisTestMode),
        settings=settings(
            max_examples=5 if path in NO_INPUT else MAX_EXAMPLES,
            derandomize=True,  # the same cases on every run (CI): a failure found once is found again
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    create_test(operation=api_schema[path][method], test_func=fuzz, config=config)()


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
WEBHOOK_BODIES = st.fixed_dictionaries(
    {},
    optional={"session": JSON_VALUES, "turn": JSON_VALUES, "text": JSON_VALUES, "score": JSON_VALUES},
)


@given(body=WEBHOOK_BODIES)
@settings(max_examples=200, derandomize=True, database=None, deadline=None)
def test_a_mapped_webhook_never_gets_a_server_error(fuzz_client: TestClient, body: dict[str, object]) -> None:
    """The webhook route takes any object; its mapping (what a schema cannot see) reads the fields."""
    reply = fuzz_client.post("/v1/webhooks/ticket", json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert reply.status_code in (202, 400, 409), (body, reply.text)
    if reply.status_code != 202:
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


# Explicit hostile bodies: what a schema-driven generator never sends.
def _post(client: TestClient, path: str, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """POST with the route's key; the reply (the TestClient's httpx Response)."""
    return client.post(
        path, headers={"Authorization": f"Bearer {key_for(path)}", **(headers or {})}, **kwargs
    )


def _assert_error(reply: Any, status: int, code: str) -> None:
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["code"] == code, reply.text


ACCEPTED = {
    "/v1/chat/completions": 200,
    "/v1/responses": 200,
    "/v1/orl/score": 200,
    "/v1/sessions/start": 200,
    "/admin/pin": 400,
}


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_a_valid_body_is_accepted(fuzz_client: TestClient, path: str) -> None:
    """The baseline of the cases below (the store has no checkpoint v1 to pin: a 400 that says so)."""
    reply = _post(fuzz_client, path, json=BODY_ROUTES[path])
    assert reply.status_code == ACCEPTED.get(path, 202), reply.text


def test_the_document_needs_no_key_and_unknown_routes_get_openai_errors(fuzz_client: TestClient) -> None:
    assert fuzz_client.get("/openapi.json").json()["openapi"].startswith("3.")
    _assert_error(fuzz_client.get("/v1/nothing-here"), 404, "not_found")
    _assert_error(fuzz_client.get("/v1/chat/completions"), 405, "method_not_allowed")
    _assert_error(_post(fuzz_client, "/v1/webhooks/a/b", json={}), 404, "not_found")


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_a_50_mb_body_gets_413(fuzz_client: TestClient, path: str) -> None:
    huge = b'{"messages": "' + b"x" * 50_000_000 + b'"}'
    _assert_error(_post(fuzz_client, path, content=huge), 413, "request_too_large")
    # without a Content-Length (chunked): refused once the limit is passed, not read to the end
    chunks = (huge[i : i + 1_000_000] for i in range(0, len(huge), 1_000_000))
    _assert_error(_post(fuzz_client, path, content=chunks), 413, "request_too_large")


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_truncated_json_gets_400(fuzz_client: TestClient, path: str) -> None:
    whole = json.dumps(BODY_ROUTES[path])
    for end in (1, len(whole) // 2, len(whole) - 1):
        _assert_error(_post(fuzz_client, path, content=whole[:end]), 400, "invalid_json")


@pytest.mark.parametrize("path", BODY_ROUTES)
def test_a_wrong_content_type_never_gets_a_server_error(fuzz_client: TestClient, path: str) -> None:
    """Content-Type is not checked (clients mislabel JSON); what is not a JSON object gets a 400."""
    form = _post(fuzz_client, path, data={"session_id": "s", "reward": "1"})  # form-encoded
    _assert_error(form, 400, "invalid_json")
    text = _post(fuzz_client, path, content="hello", headers={"Content-Type": "text/plain"})
    _assert_error(text, 400, "invalid_json")
    files = _post(fuzz_client, path, files={"file": ("a.json", b"{}")})  # multipart
    _assert_error(files, 400, "invalid_json")
    labelled = _post(fuzz_client, path, json=BODY_ROUTES[path], headers={"Content-Type": "text/plain"})
    assert labelled.status_code < 500, labelled.text


def _slow_post(port: int, path: str, body: bytes, byte_every_s: float | None) -> tuple[str, float]:
    """POST `body` one byte per `byte_every_s` (None: the headers, then nothing); the status line and
    how long it took to come."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: orl\r\nAuthorization: Bearer {key_for(path)}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        sent = 0
        while time.monotonic() - started < 4 * BODY_TIMEOUT_S:
            readable, _, _ = select.select([sock], [], [], byte_every_s or 0.1)
            if readable:
                status = sock.recv(65536).split(b"\r\n", 1)[0].decode()
                return status, time.monotonic() - started
            if byte_every_s is not None and sent < len(body) - 1:  # never the last byte
                sock.sendall(body[sent : sent + 1])
                sent += 1
    raise AssertionError(f"no answer within {4 * BODY_TIMEOUT_S} s: the server hangs on a slow body")


@pytest.mark.parametrize("byte_every_s", [0.2, None], ids=["trickle", "stall"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/orl/score", "/v1/feedback"])
def test_a_slow_body_gets_408_in_time(loopback_port: int, path: str, byte_every_s: float | None) -> None:
    body = json.dumps(BODY_ROUTES[path]).encode()
    status, elapsed_s = _slow_post(loopback_port, path, body, byte_every_s)
    assert status == "HTTP/1.1 408 Request Timeout", status
    assert BODY_TIMEOUT_S <= elapsed_s < BODY_TIMEOUT_S + 2
