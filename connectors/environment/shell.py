"""The shell connector: runs a command for an agent's tool call and reports how it went.

`run_command` runs a command (a string through /bin/sh, or an argument list) in a working
directory, in its own process group, with a time limit and an output limit: past `timeout_s` the
whole group is killed (SIGKILL) and the result says `timed_out`, exit code -9; of each stream only
the last `max_output_bytes` are kept (older bytes are counted, never buffered). Whatever the command
left running in its group is killed when it returns, so no stray process outlives a run.
`ShellConnector` wraps it as a connector: outcome kind "shell" with the exit code, and the
stdout/stderr tails and duration in the outcome's detail. Reads and writes no topics.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from orl.connectors.environment.api import Observation, Outcome, TurnContext

KILLED_EXIT_CODE = -signal.SIGKILL
_CHUNK_BYTES = 65_536


@dataclass(frozen=True)
class CommandResult:
    command: str | tuple[str, ...]
    exit_code: int
    timed_out: bool
    duration_s: float
    stdout_tail: str
    stderr_tail: str
    stdout_bytes: int
    stderr_bytes: int
    max_output_bytes: int

    @property
    def truncated(self) -> bool:
        return max(self.stdout_bytes, self.stderr_bytes) > self.max_output_bytes

    def detail(self) -> dict[str, Any]:
        return {
            "command": self.command if isinstance(self.command, str) else list(self.command),
            "exit_code": self.exit_code,
            "timed_out": self.timed_out,
            "duration_s": round(self.duration_s, 3),
            "stdout_tail": self.stdout_tail,
            "stderr_tail": self.stderr_tail,
            "stdout_bytes": self.stdout_bytes,
            "stderr_bytes": self.stderr_bytes,
            "truncated": self.truncated,
        }


class _TailReader(threading.Thread):
    """Drains one pipe, keeping only its last `limit` bytes and counting the rest."""

    def __init__(self, pipe: IO[bytes], limit: int) -> None:
        super().__init__(daemon=True)
        self.pipe, self.limit = pipe, limit
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # the pipe was closed under us: the run is over
            while chunk := os.read(self.pipe.fileno(), _CHUNK_BYTES):
                self.total += len(chunk)
                self.tail += chunk
                if len(self.tail) > self.limit:
                    del self.tail[: len(self.tail) - self.limit]

    def text(self) -> str:
        return self.tail.decode("utf-8", errors="replace")


def run_command(
    command: str | Sequence[str],
    *,
    cwd: str | Path,
    timeout_s: float,
    max_output_bytes: int = 65_536,
    env: Mapping[str, str] | None = None,
) -> CommandResult:
    """Run `command` under the time and output limits (see the module docstring)."""
    if timeout_s <= 0 or max_output_bytes <= 0:
        raise ValueError("timeout_s and max_output_bytes must be positive")
    shown: str | tuple[str, ...] = command if isinstance(command, str) else tuple(command)
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        shell=isinstance(command, str),
        cwd=str(cwd),
        env=None if env is None else dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group, so a timeout kills children too
    )
    assert process.stdout is not None and process.stderr is not None
    readers = [_TailReader(process.stdout, max_output_bytes), _TailReader(process.stderr, max_output_bytes)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(process.pid)  # on timeout, and leftovers of a finished command
        process.wait()
        for reader in readers:
            reader.join(timeout=2.0)
        process.stdout.close()
        process.stderr.close()
    return CommandResult(
        command=shown,
        exit_code=KILLED_EXIT_CODE if timed_out else process.returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        stdout_tail=readers[0].text(),
        stderr_tail=readers[1].text(),
        stdout_bytes=readers[0].total,
        stderr_bytes=readers[1].total,
        max_output_bytes=max_output_bytes,
    )


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def render_result(result: CommandResult, max_chars: int = 4_000) -> str:
    """The next state's text: what ran, how it ended, the output tails (as a tool result reads)."""
    shown = result.command if isinstance(result.command, str) else " ".join(result.command)
    status = "killed at its time limit" if result.timed_out else f"exit code {result.exit_code}"
    lines = [f"$ {shown}", f"{status} ({result.duration_s:.2f} s)"]
    for label, tail, total in (
        ("stdout", result.stdout_tail, result.stdout_bytes),
        ("stderr", result.stderr_tail, result.stderr_bytes),
    ):
        if tail:
            cut = tail[-max_chars:]
            note = f" (last {len(cut)} characters of {total} bytes)" if total > len(cut) else ""
            lines.append(f"{label}{note}:\n{cut}")
    return "\n".join(lines)


def command_observation(result: CommandResult, kind: str = "shell") -> Observation:
    return Observation(
        content=render_result(result),
        role="tool",
        outcome=Outcome(kind=kind, exit_code=result.exit_code, detail=result.detail()),
    )


@dataclass
class ShellConnector:
    """Runs `context.payload["command"]` in `cwd` (or a folder inside it, `payload["cwd"]`) and reports it.

    The payload may lower the time limit (`timeout_s`) but never raise it above the connector's.
    """

    cwd: str = "."
    timeout_s: float = 60.0
    max_output_bytes: int = 65_536
    name: str = "shell"

    def observe(self, context: TurnContext) -> Observation | None:
        command = context.payload.get("command")
        if not command:
            return None
        if not isinstance(command, str | list | tuple):
            raise ValueError("payload 'command' must be a string or a list of arguments")
        timeout_s = min(float(context.payload.get("timeout_s", self.timeout_s)), self.timeout_s)
        result = run_command(
            command,
            cwd=self._working_dir(context.payload.get("cwd")),
            timeout_s=timeout_s,
            max_output_bytes=self.max_output_bytes,
        )
        return command_observation(result)

    def _working_dir(self, requested: Any) -> Path:
        root = Path(self.cwd).resolve()
        if requested is None:
            return root
        folder = (root / str(requested)).resolve()
        if not folder.is_relative_to(root):
            raise ValueError(f"payload 'cwd' {requested!r} is outside the connector's folder {root}")
        return folder
