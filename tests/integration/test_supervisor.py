"""`orl up`'s supervisor: a crashed process is restarted after a growing pause that never blocks.

The launched command does not exist, so each start exits at once (argparse, exit code 2): a crash
loop. The supervisor's clock is a fake one, moved by the test; the processes are real.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from orl.up import CRASH_LOOP_AFTER, STABLE_RUN_S, Launch, Supervisor
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


def test_a_crash_loop_is_named_in_the_log_with_the_processs_last_lines_and_in_the_status_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    supervisor = Supervisor({"loop": Launch("no-such-command", dict(os.environ))}, tmp_path, clock=clock)
    supervisor.start_all()
    try:
        assert json.loads(supervisor.status_path.read_text())["loop"]["state"] == "running"
        for crash in range(1, CRASH_LOOP_AFTER + 1):
            wait_exited(supervisor, "loop")
            supervisor.check()
            status = json.loads(supervisor.status_path.read_text())["loop"]
            assert status["state"] == "restarting" and status["last_exit_code"] == 2
            assert status["crashes_in_a_row"] == crash and status["restarts"] == crash - 1
            assert status["crash_loop"] == (crash == CRASH_LOOP_AFTER)
            assert ("loop is in a crash loop" in caplog.text) == (crash == CRASH_LOOP_AFTER)
            clock.now = supervisor.restart_at["loop"]
            supervisor.check()
        # the error quotes the process's own log: argparse's complaint about the unknown command
        assert "invalid choice: 'no-such-command'" in caplog.text, caplog.text
    finally:
        supervisor.stop()
    assert json.loads(supervisor.status_path.read_text())["loop"]["state"] == "stopped"


def test_a_process_that_runs_a_minute_after_a_crash_loop_is_no_longer_in_one(tmp_path: Path) -> None:
    clock = FakeClock()
    supervisor = Supervisor({}, tmp_path, clock=clock)
    supervisor.processes["steady"] = subprocess.Popen(["sleep", "120"])  # a restart that now runs
    supervisor.started_at["steady"] = clock.now
    supervisor.crashes_in_a_row["steady"] = CRASH_LOOP_AFTER
    try:
        supervisor.check()
        assert supervisor.status()["steady"]["crash_loop"]  # not yet a minute
        clock.now += STABLE_RUN_S
        supervisor.check()
        status = json.loads(supervisor.status_path.read_text())["steady"]
        assert status["state"] == "running" and not status["crash_loop"] and status["crashes_in_a_row"] == 0
    finally:
        supervisor.stop()
