"""`orl up` started as a user starts it, for the end-to-end tests that drive it with a real client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.model import test_cache_dir
from tests.integration.serve_process import free_port, wait_ready


@dataclass(frozen=True)
class UpStack:
    base_url: str
    data_dir: Path
    log_path: Path
    api_key: str
    process: subprocess.Popen[bytes]  # `orl up` itself (the supervisor)

    @property
    def log_url(self) -> str:
        return f"sqlite:///{self.data_dir / 'log.db'}"


@contextmanager
def running_up(
    tmp_path: Path,
    idle_timeout_s: float,
    extra_env: dict[str, str] | None = None,
    components: str = "serve,pipeline",
    gate: bool = False,
) -> Iterator[UpStack]:
    """`orl up --method binary --components serve,pipeline` on a free port, ready; SIGTERM at the end.

    `extra_env` adds settings (environment variables), e.g. the SGLang backend's; `components` is
    passed to --components (the fault suite adds `train`). The promotion gate, on by default in
    `orl up`, is off (`--no-gate`) unless `gate`: the tests that do not test it see every version served.
    """
    port, data_dir, log_path = free_port(), tmp_path / "orl", tmp_path / "up.log"
    env = {
        **os.environ,
        "ORL_MODEL_CACHE": str(test_cache_dir()),
        "ORL_IDLE_TIMEOUT_S": str(idle_timeout_s),
        **(extra_env or {}),
    }
    with log_path.open("ab") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "orl.cli", "up", "--data-dir", str(data_dir), "--port", str(port),
             "--method", "binary", "--components", components, *([] if gate else ["--no-gate"])],
            env=env, stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_ready(base_url, process, 240, log_path, what="orl up")
        api_key = json.loads((data_dir / "keys.json").read_text())["api_key"]
        yield UpStack(base_url, data_dir, log_path, api_key, process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
