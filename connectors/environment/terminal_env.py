"""The terminal environment ("terminal"): file tasks an agent solves with one `shell` tool.

Each episode gets a fresh temporary working folder (removed by `close`); the `shell` tool runs its
`command` there through `shell.run_command` (a time limit and an output limit per command, the
process group killed afterwards) and answers with the exit code and the output tails. Tasks are
generated from a seed: "create a file named X containing Y", and "count the lines of the given file
and write the number to answer.txt" (the file is written into the folder when the episode starts).
The verifier looks only at the folder, not at the final text. The folder is a working folder, not
a sandbox: commands run as the user running the episode, so run untrusted models in a container.
Reads and writes no topics.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orl.connectors.environment.api import Outcome
from orl.connectors.environment.episode import (
    Message,
    Task,
    draw_tasks,
    run_tool_calls,
    task_verdict,
)
from orl.connectors.environment.shell import render_result, run_command

SYSTEM = (
    "You work in a Linux shell through the `shell` tool; the current folder is your working folder. "
    "Use the tool to do the task, then say in one short sentence that you are done."
)
SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a /bin/sh command in the working folder; returns its exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "e.g. ls -l"}},
            "required": ["command"],
        },
    },
}
WORDS = ("alpha", "bravo", "cedar", "delta", "ember", "falcon", "garnet", "harbor", "indigo", "juniper")
# Commands get a fixed, small environment: no variables of the process running the episode leak in.
COMMAND_PATH = "/usr/local/bin:/usr/bin:/bin"


def _create_file(rng: random.Random) -> tuple[str, dict[str, Any]]:
    name = f"{rng.choice(WORDS)}_{rng.randint(10, 99)}.txt"
    text = f"{rng.choice(WORDS)} {rng.choice(WORDS)} {rng.randint(100, 999)}"
    return (
        f"Create a file named {name} containing exactly this text: {text}",
        {"kind": "create_file", "name": name, "text": text},
    )


def _count_lines(rng: random.Random) -> tuple[str, dict[str, Any]]:
    name = f"{rng.choice(WORDS)}_log.txt"
    lines = [f"{rng.choice(WORDS)} {rng.randint(0, 9999)}" for _ in range(rng.randint(3, 40))]
    return (
        f"The file {name} is in the working folder. Count its lines and write the number (digits only) "
        "to a file named answer.txt.",
        {"kind": "count_lines", "name": name, "content": "\n".join(lines) + "\n", "expected": len(lines)},
    )


def _create_file_or_count_lines(rng: random.Random) -> tuple[str, dict[str, Any]]:
    return (_create_file if rng.random() < 0.5 else _count_lines)(rng)


@dataclass
class TerminalEpisode:
    task: Task
    folder: Path
    timeout_s: float
    max_output_bytes: int
    max_commands: int
    commands_run: int = 0
    closed: bool = field(default=False, repr=False)

    def step(self, tool_calls: list[Message]) -> list[Message]:
        if self.closed:
            raise RuntimeError("the episode is closed")  # a caller bug, not a model's mistake
        return run_tool_calls(tool_calls, {"shell": self._shell})

    def verdict(self, final_text: str) -> Outcome:
        data = self.task.data
        if data["kind"] == "create_file":
            return self._file_holds(data["name"], data["text"])
        return self._file_holds("answer.txt", str(data["expected"]))

    def close(self) -> None:
        self.closed = True
        shutil.rmtree(self.folder, ignore_errors=True)

    def _shell(self, arguments: dict[str, Any]) -> str:
        command = arguments["command"]
        if not isinstance(command, str) or not command.strip():
            raise ValueError("'command' must be a non-empty string")
        if self.commands_run >= self.max_commands:
            raise ValueError(f"the limit of {self.max_commands} commands is reached; give your final answer")
        self.commands_run += 1
        result = run_command(
            command,
            cwd=self.folder,
            timeout_s=self.timeout_s,
            max_output_bytes=self.max_output_bytes,
            env={"PATH": COMMAND_PATH, "HOME": str(self.folder), "LC_ALL": "C"},
        )
        return render_result(result, max_chars=self.max_output_bytes)

    def _file_holds(self, name: str, wanted: str) -> Outcome:
        path = self.folder / name
        if not path.is_file():
            return task_verdict(False, f"wrong: there is no file {name}", file=name, wanted=wanted)
        found = path.read_bytes()[:10_000].decode("utf-8", errors="replace").strip()
        correct = found == wanted
        reason = f"{name} holds {found[:80]!r}" + ("" if correct else f", expected {wanted!r}")
        return task_verdict(
            correct,
            f"{'correct' if correct else 'wrong'}: {reason}",
            file=name,
            wanted=wanted,
            found=found[:200],
        )


@dataclass
class TerminalEnvironment:
    """File tasks in a throwaway folder per episode; see the module docstring."""

    timeout_s: float = 10.0
    max_output_bytes: int = 4_096
    max_commands: int = 8
    name: str = "terminal"

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        drawn = draw_tasks(self.name, split, count, seed, _create_file_or_count_lines)
        return [
            Task(
                task_id,
                ({"role": "system", "content": SYSTEM}, {"role": "user", "content": question}),
                (SHELL,),
                split,
                data,
            )
            for task_id, question, data in drawn
        ]

    def start(self, task: Task) -> TerminalEpisode:
        folder = Path(tempfile.mkdtemp(prefix="orl-terminal-"))
        if task.data.get("kind") == "count_lines":
            (folder / task.data["name"]).write_text(task.data["content"])
        return TerminalEpisode(task, folder, self.timeout_s, self.max_output_bytes, self.max_commands)
