"""A supervised component exits when its supervisor dies, even by kill -9 (orl.supervised).

Real processes: a stand-in supervisor starts a child that calls `exit_with_supervisor` the way every
`orl` command does, then the supervisor is killed with SIGKILL; the child must be gone within
seconds, not left as an orphan holding memory, a port and CPU (issue 22 found `orl demo`'s children
alive 46 minutes after the demo died).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from orl.supervised import SUPERVISOR_PID_ENV

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="prctl PR_SET_PDEATHSIG is Linux-only"
)

CHILD = (
    "import time; from orl.supervised import exit_with_supervisor; exit_with_supervisor(); "
    "print('child running', flush=True); time.sleep(120)"
)

# The stand-in supervisor: starts the child with its own pid in the environment (as Supervisor.start
# does), prints the child's pid, then waits to be killed.
SUPERVISOR = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}], env={{**os.environ, {SUPERVISOR_PID_ENV!r}: str(os.getpid())}})
print(child.pid, flush=True)
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


def test_the_child_exits_when_its_supervisor_is_killed_with_sigkill() -> None:
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True)
    assert supervisor.stdout is not None
    child_pid = int(supervisor.stdout.readline())
    time.sleep(1.0)  # let the child reach exit_with_supervisor
    assert alive(child_pid)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait(timeout=10)
    deadline = time.monotonic() + 10
    while alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(child_pid):
        os.kill(child_pid, signal.SIGKILL)
        pytest.fail("the child outlived its supervisor")


def test_a_child_whose_supervisor_is_already_gone_exits_at_once() -> None:
    env = {**os.environ, SUPERVISOR_PID_ENV: "1"}  # init is never the parent of this child
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "child running" not in done.stdout
    assert "the supervisor (pid 1) is gone" in done.stderr


def test_without_a_supervisor_nothing_changes() -> None:
    env = {k: v for k, v in os.environ.items() if k != SUPERVISOR_PID_ENV}
    code = "from orl.supervised import exit_with_supervisor; exit_with_supervisor(); print('ran')"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ran"
