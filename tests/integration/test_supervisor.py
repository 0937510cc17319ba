"""`orl up`'s supervisor: a crashed process is restarted after a growing pause that never blocks.

The launched command does not exist, so each start exits at once (argparse, exit code 2): a crash
loop. The supervisor's clock is a fake one, moved by the test; the processes are real.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from orl.up import Launch, Supervisor
from tests.faults.checks import EXITED_LINE


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wait_exited(supervisor: Supervisor, name: str) -> None:
    process = supervisor.processes[name]
    process.wait(timeout=60)


def test_a_crash_loop_is_restarted_with_growing_pauses_that_do_not_block(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    launches = {"loop": Launch("no-such-command", dict(os.environ))}
    supervisor = Supervisor(launches, tmp_path / "logs", clock=clock)
    supervisor.start_all()
    try:
        first = supervisor.processes["loop"]
        wait_exited(supervisor, "loop")
        started = time.monotonic()
        supervisor.check()  # crash 1 in a row: restart due in 1 s
        assert time.monotonic() - started < 0.5  # scheduled, not slept
        assert supervisor.restart_at["loop"] == clock.now + 1.0
        # the fault suite (tests/faults/checks.py) counts restarts by this line, as the e2e test reads it
        assert EXITED_LINE.search(caplog.text) and "loop exited with 2; restarting in 1 s" in caplog.text
        clock.now += 0.9
        supervisor.check()
        assert supervisor.processes["loop"] is first and supervisor.restarts.get("loop", 0) == 0
        clock.now += 0.1
        supervisor.check()
        second = supervisor.processes["loop"]
        assert second is not first and supervisor.restarts["loop"] == 1

        wait_exited(supervisor, "loop")
        clock.now += 5.0  # it ran 5 s: crash 2 in a row, 2 s
        supervisor.check()
        assert supervisor.crashes_in_a_row["loop"] == 2
        assert supervisor.restart_at["loop"] == clock.now + 2.0
        clock.now += 2.0
        supervisor.check()
        assert supervisor.restarts["loop"] == 2

        wait_exited(supervisor, "loop")
        clock.now += 61.0  # it ran a minute: a new row of crashes, 1 s again
        supervisor.check()
        assert supervisor.crashes_in_a_row["loop"] == 1
        assert supervisor.restart_at["loop"] == clock.now + 1.0
    finally:
        supervisor.stop()


def test_the_pause_is_capped_at_ten_seconds(tmp_path: Path) -> None:
    clock = FakeClock()
    supervisor = Supervisor({"loop": Launch("no-such-command", dict(os.environ))}, tmp_path, clock=clock)
    supervisor.start_all()
    try:
        for crash in range(1, 12):
            wait_exited(supervisor, "loop")
            supervisor.check()
            assert supervisor.restart_at["loop"] - clock.now == min(10.0, float(crash))
            clock.now = supervisor.restart_at["loop"]
            supervisor.check()
    finally:
        supervisor.stop()
