"""`orl up` as a supervisor, end to end: a killed component is restarted and serves again, a stop is
clean, and a kill -9 of `orl up` itself leaves no child behind (issue 22).

Real processes on the real model: `orl up --components serve,pipeline` (tests/e2e/up_stack.py), chat
requests over HTTP, the children found by the pids `orl up` logs when it starts them.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.up_stack import UpStack, running_up

pytestmark = [pytest.mark.model, pytest.mark.slow]

_STARTED = re.compile(r"started (\S+) \(pid (\d+)\)")


def children(stack: UpStack) -> dict[str, int]:
    """The newest pid of every component, from `orl up`'s own log lines."""
    return {name: int(pid) for name, pid in _STARTED.findall(stack.log_path.read_text())}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by a dead parent's successor) is gone for our purposes
    status = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return status not in ("Z", "X")


def chat(stack: UpStack, text: str) -> httpx.Response:
    body = {"model": "orl-policy", "messages": [{"role": "user", "content": text}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    return httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)


def wait_until(condition, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s} s waiting for {what}"
        time.sleep(0.25)


def ready(stack: UpStack) -> bool:
    try:
        return httpx.get(f"{stack.base_url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_killed_component_is_restarted_and_a_stop_is_clean(tmp_path: Path, base_model_dir: Path) -> None:
    with running_up(tmp_path, idle_timeout_s=60) as stack:
        assert chat(stack, "What is 2 + 2?").status_code == 200
        first = children(stack)
        assert {"serve", "pipeline"} <= set(first), first
        for name in ("serve", "pipeline"):
            os.kill(first[name], signal.SIGKILL)
            old_pid = first[name]
            wait_until(
                lambda name=name, old_pid=old_pid: children(stack)[name] != old_pid,  # type: ignore[misc]
                60,
                f"{name} to be started again",
            )
            assert not alive(first[name])
        wait_until(lambda: ready(stack), 120, "the restarted server to be ready")
        assert chat(stack, "And 3 + 3?").status_code == 200
        restarted = children(stack)
        assert "serve exited with -9; restarting" in stack.log_path.read_text()

        stack.process.send_signal(signal.SIGTERM)
        assert stack.process.wait(timeout=60) == 0
        assert not any(alive(pid) for pid in restarted.values()), restarted


def test_a_kill_minus_nine_of_orl_up_takes_every_child_with_it(tmp_path: Path, base_model_dir: Path) -> None:
    with running_up(tmp_path, idle_timeout_s=60) as stack:
        pids = children(stack)
        assert all(alive(pid) for pid in pids.values()), pids
        stack.process.send_signal(signal.SIGKILL)
        stack.process.wait(timeout=10)
        wait_until(lambda: not any(alive(pid) for pid in pids.values()), 30, f"children {pids} to exit")
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{stack.base_url}/healthz", timeout=2)
