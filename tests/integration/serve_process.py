"""Start a real `orl serve` subprocess for tests and wait until it is ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.fixtures.model import test_cache_dir

API_KEY = "test-key"
ADMIN_KEY = "test-admin-key"
INTERNAL_KEY = "test-internal-key"  # the pipeline's: the judge's and the teacher's calls


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServeProcess:
    base_url: str
    data_dir: Path
    log_url: str
    process: subprocess.Popen[bytes]


@contextmanager
def serve_process(
    data_dir: Path,
    *,
    log_url: str | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    ready_path: str = "/readyz",
) -> Iterator[ServeProcess]:
    """`ready_path` "/healthz" for a server that cannot become ready (its log unreachable), yet answers."""
    port = free_port()
    log_url = log_url or f"sqlite:///{data_dir / 'log.db'}"
    env = {
        **os.environ,
        "ORL_DATA_DIR": str(data_dir),
        "ORL_LOG_URL": log_url,
        "ORL_PORT": str(port),
        "ORL_API_KEYS": API_KEY,
        "ORL_ADMIN_KEY": ADMIN_KEY,
        "ORL_INTERNAL_KEY": INTERNAL_KEY,
        "ORL_THREADS": "2",
        "ORL_STORE_URL": f"file://{data_dir / 'objects'}",
        **(extra_env or {}),
    }
    env["ORL_MODEL_CACHE"] = str(test_cache_dir())  # the folder the base_model_dir fixture prepared
    log_file = (data_dir / f"serve-{port}.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "orl.cli", "serve"], env=env, stdout=log_file, stderr=subprocess.STDOUT
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base_url, process, timeout_s, data_dir / f"serve-{port}.log", path=ready_path)
        yield ServeProcess(base_url, data_dir, log_url, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()


def wait_ready(
    base_url: str,
    process: subprocess.Popen[bytes],
    timeout_s: float,
    log_path: Path,
    what: str = "orl serve",
    path: str = "/readyz",
) -> None:
    """Until `base_url``path` answers 200; fails with the log's tail if `process` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base_url}{path}", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready after {timeout_s} s:\n{log_path.read_text()[-3000:]}")
