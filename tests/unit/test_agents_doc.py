"""docs/agents.md: the example environment is about 20 lines of code and works as written."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from orl.connectors.environment.episode import Environment, Episode

from orl.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "agents.md"


def example() -> tuple[str, dict[str, Any]]:
    [source] = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)  # the documented code, run as written
    return source, namespace


def test_the_example_is_short() -> None:
    source, _ = example()
    assert len([line for line in source.splitlines() if line.strip()]) < 30


def test_the_example_environment_works_as_written() -> None:
    _, namespace = example()
    env = namespace["EchoWord"]()
    assert isinstance(env, Environment) and env.name == "echo_word"
    tasks = env.tasks("eval", 4, seed=1)
    assert tasks == env.tasks("eval", 4, seed=1) and len({t.task_id for t in tasks}) == 4
    episode = env.start(tasks[0])
    assert isinstance(episode, Episode)
    word = tasks[0].data["word"]
    assert tasks[0].messages[-1]["content"] == f"Say {word}."
    said, silent = episode.verdict(f"ok {word}"), episode.verdict("no")
    assert (said.kind, said.reward, silent.reward) == ("task", 1.0, -1.0)
    [reply] = episode.step([{"id": "c", "type": "function", "function": {"name": "x", "arguments": "{}"}}])
    assert reply == {
        "role": "tool",
        "tool_call_id": "c",
        "content": "error: no tool named 'x'; this task has no tools",
    }
    episode.close()


def test_the_documented_command_uses_real_flags() -> None:
    command = re.search(r"```bash\n(orl rollout .*?)```", DOC.read_text(), re.DOTALL)
    assert command is not None
    flags = set(re.findall(r"(--[a-z-]+)", command.group(1)))
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = {option for action in subparsers.choices["rollout"]._actions for option in action.option_strings}
    assert len(flags) == 11 and flags <= known, flags - known
