"""The shell connector: exit codes, output tails, and limits that a command cannot exceed."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from orl.connectors.environment.api import TurnContext, run_connector
from orl.connectors.environment.shell import KILLED_EXIT_CODE, ShellConnector, run_command


def context(**payload: object) -> TurnContext:
    return TurnContext(session_id="s", turn_id="s/t0", payload=payload)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(") ")[1].startswith("Z"))


def test_reports_exit_code_and_both_streams(tmp_path: Path) -> None:
    result = run_command("echo out; echo err >&2; exit 3", cwd=tmp_path, timeout_s=10)
    assert result.exit_code == 3 and not result.timed_out
    assert result.stdout_tail == "out\n" and result.stderr_tail == "err\n"
    assert result.duration_s < 10


def test_runs_in_the_working_directory_and_accepts_argument_lists(tmp_path: Path) -> None:
    (tmp_path / "marker.txt").write_text("here")
    result = run_command(
        [sys.executable, "-c", "print(open('marker.txt').read())"], cwd=tmp_path, timeout_s=10
    )
    assert result.exit_code == 0 and result.stdout_tail.strip() == "here"


def test_a_command_past_its_time_limit_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    started = time.monotonic()
    result = run_command(f"sleep 60 & echo $! > {pid_file}; wait", cwd=tmp_path, timeout_s=0.5)
    assert time.monotonic() - started < 10
    assert result.timed_out and result.exit_code == KILLED_EXIT_CODE
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child), "the command's child survived the timeout"


def test_background_leftovers_of_a_finished_command_are_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    result = run_command(
        f"sleep 60 > /dev/null 2>&1 & echo $! > {pid_file}; exit 0", cwd=tmp_path, timeout_s=10
    )
    assert result.exit_code == 0 and not result.timed_out
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


def test_output_beyond_the_limit_keeps_only_the_tail(tmp_path: Path) -> None:
    script = "import sys; sys.stdout.write('x' * 5_000_000 + 'END')"
    result = run_command([sys.executable, "-c", script], cwd=tmp_path, timeout_s=30, max_output_bytes=1000)
    assert result.exit_code == 0
    assert len(result.stdout_tail) == 1000 and result.stdout_tail.endswith("END")
    assert result.stdout_bytes == 5_000_003 and result.truncated
    assert result.detail()["truncated"] is True


def test_limits_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        run_command("true", cwd=tmp_path, timeout_s=0)


def test_shell_connector_reports_a_shell_outcome(tmp_path: Path) -> None:
    connector = ShellConnector(cwd=str(tmp_path), timeout_s=10)
    observation = connector.observe(context(command="echo hello; exit 1"))
    assert observation is not None and observation.role == "tool"
    assert observation.outcome is not None and observation.outcome.kind == "shell"
    assert observation.outcome.exit_code == 1
    assert observation.outcome.detail is not None and observation.outcome.detail["stdout_tail"] == "hello\n"
    assert "$ echo hello; exit 1" in observation.content and "exit code 1" in observation.content


def test_shell_connector_timeout_is_reported(tmp_path: Path) -> None:
    connector = ShellConnector(cwd=str(tmp_path), timeout_s=0.3)
    observation = connector.observe(context(command="sleep 30", timeout_s=999))  # cannot raise the limit
    assert observation is not None and observation.outcome is not None
    assert observation.outcome.exit_code == KILLED_EXIT_CODE
    assert observation.outcome.detail is not None and observation.outcome.detail["timed_out"] is True
    assert "killed at its time limit" in observation.content


def test_shell_connector_without_a_command_observes_nothing(tmp_path: Path) -> None:
    assert ShellConnector(cwd=str(tmp_path)).observe(context()) is None


def test_shell_connector_refuses_a_folder_outside_its_own(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    connector = ShellConnector(cwd=str(tmp_path), timeout_s=5)
    ok = connector.observe(context(command="pwd", cwd="sub"))
    assert ok is not None and ok.outcome is not None and ok.outcome.detail is not None
    assert ok.outcome.detail["stdout_tail"].strip() == str((tmp_path / "sub").resolve())
    refused = run_connector(connector, context(command="pwd", cwd="../.."), timeout_s=5)
    assert refused is not None and refused.failed and "outside" in refused.content
