"""How the object stores fail: an unreachable S3, rejected credentials, and a writer killed mid-put."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from orl.connectors.object_store.base import ObjectStoreError
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.connectors.object_store.s3_store import S3ObjectStore
from orl.schemas.errors import ServiceUnavailable

from tests.fixtures.s3_server import S3Server

UNREACHABLE_BOUND_S = 15.0
REPO_ROOT = Path(__file__).resolve().parents[2]
OBJECT_BYTES = 8 * 1024 * 1024

# Rewrites one key forever, alternating two payloads of OBJECT_BYTES; the parent kills it with -9.
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from orl.connectors.object_store.local_store import LocalObjectStore
    store = LocalObjectStore(Path(sys.argv[1]))
    payloads = [b"a" * int(sys.argv[2]), b"b" * int(sys.argv[2])]
    i = 0
    while True:
        store.put("ckpt/model.bin", payloads[i % 2])
        i += 1
        if i == 1:
            print("started", flush=True)
    """
)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


def test_s3_on_a_closed_port_is_unavailable_quickly_and_named() -> None:
    port = _closed_port()
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable) as excinfo:
        S3ObjectStore(f"127.0.0.1:{port}", "key", "secret", "orl-unreachable")
    assert time.monotonic() - started < UNREACHABLE_BOUND_S
    assert f"127.0.0.1:{port}" in str(excinfo.value)


def test_s3_operations_on_a_closed_port_are_unavailable() -> None:
    store = S3ObjectStore(f"127.0.0.1:{_closed_port()}", "k", "s", "orl-unreachable", create_bucket=False)
    started = time.monotonic()
    for operation in (lambda: store.get("a"), lambda: store.put("a", b"x"), lambda: store.list()):
        with pytest.raises(ServiceUnavailable):
            operation()
    assert time.monotonic() - started < UNREACHABLE_BOUND_S


@pytest.mark.s3
def test_s3_with_wrong_credentials_says_so(s3_server: S3Server) -> None:
    with pytest.raises(ObjectStoreError) as excinfo:
        S3ObjectStore(s3_server.endpoint, s3_server.access_key, "wrong-secret", "orl-creds")
    assert not isinstance(excinfo.value, ServiceUnavailable)
    assert "credentials" in str(excinfo.value)
    assert s3_server.access_key in str(excinfo.value)


def test_local_put_is_atomic_when_the_writer_is_killed(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = LocalObjectStore(root)
    store.put("ckpt/model.bin", b"a" * OBJECT_BYTES)
    whole = {b"a" * OBJECT_BYTES, b"b" * OBJECT_BYTES}
    for _round in range(3):
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root), str(OBJECT_BYTES)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
        )
        try:
            assert writer.stdout is not None and writer.stdout.readline() == b"started\n"
            deadline = time.monotonic() + 0.5
            while time.monotonic() < deadline:
                assert store.get("ckpt/model.bin") in whole
        finally:
            writer.kill()  # SIGKILL: no cleanup runs in the writer
            writer.wait()
        assert store.get("ckpt/model.bin") in whole
        assert store.list() == ["ckpt/model.bin"]  # an orphaned temp file is not a key


def test_local_key_cannot_also_be_a_directory_of_keys(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path)
    store.put("a/b", b"1")
    with pytest.raises(ObjectStoreError, match="'a'"):
        store.put("a", b"2")
    with pytest.raises(ObjectStoreError, match="'a/b/c'"):
        store.put("a/b/c", b"3")
    assert store.put_if_absent("a/b", b"x") is False
    assert not store.exists("a")
    assert store.list() == ["a/b"]


@pytest.mark.s3
def test_s3_store_reuses_an_existing_bucket(s3_server: S3Server) -> None:
    bucket = f"orl-test-{uuid.uuid4().hex[:16]}"
    first = S3ObjectStore(s3_server.endpoint, s3_server.access_key, s3_server.secret_key, bucket)
    second = S3ObjectStore(s3_server.endpoint, s3_server.access_key, s3_server.secret_key, bucket)
    first.put("k", b"v")
    assert second.get("k") == b"v"


@pytest.mark.s3
def test_the_test_s3_server_writes_to_many_new_buckets_whatever_the_free_disk(s3_server: S3Server) -> None:
    # weed mini sized its volume count from the free disk: with 20 GB free the 20th new bucket got
    # HTTP 500 "no writable volumes" and two contract tests failed in CI (tests/fixtures/s3_server.py).
    for _ in range(40):
        bucket = f"orl-test-{uuid.uuid4().hex[:16]}"
        store = S3ObjectStore(s3_server.endpoint, s3_server.access_key, s3_server.secret_key, bucket)
        store.put("k", bucket.encode())
        assert store.get("k") == bucket.encode()


class _InTrouble(BaseHTTPRequestHandler):
    """Answers every request as an S3 server does while it is starting or overloaded: 500 InternalError
    (the error document of the S3 API's "Error responses")."""

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = (
            b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
            b"<Message>We encountered an internal error, please try again.</Message>"
            b"<Resource>/orl-trouble/k</Resource><RequestId>1</RequestId></Error>"
        )
        self.send_response(500)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass


def test_an_s3_server_in_trouble_is_unavailable_not_a_refusal() -> None:
    """A PUT answered InternalError (SeaweedFS did so for a moment after a restart) is ServiceUnavailable,
    so a checkpoint publish waits it out instead of failing the trainer."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _InTrouble)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        store = S3ObjectStore(
            f"127.0.0.1:{server.server_address[1]}",
            "k",
            "s",
            "orl-trouble",
            region="us-east-1",
            create_bucket=False,
            retries=0,
        )
        with pytest.raises(ServiceUnavailable, match="InternalError"):
            store.put("k", b"x")
    finally:
        server.shutdown()
        server.server_close()
