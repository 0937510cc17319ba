"""The environment API: tasks an agent is given, episodes that run its tool calls, and a verdict.

An `Environment` hands out `Task`s (the opening chat messages, the OpenAI tool schemas, the split
and the data its verifier needs) generated from a seed, and starts an `Episode` per attempt. The
episode runs the assistant's OpenAI-format tool calls (`step` returns the role "tool" messages to
append; a failing tool says what went wrong in its message, it never raises) and judges the attempt
(`verdict`: an `Outcome` of kind "task", reward +1.0 or -1.0, and in its detail why). `close` frees
what the episode holds (a temporary folder, a process).

Environments are found by name: the built-ins (`tool`, `terminal`) plus every entry point in the
group "orl.environments" whose value is a zero-argument factory (usually the class itself):

    [project.entry-points."orl.environments"]
    my_env = "my_pkg.env:MyEnvironment"

`orl rollout` (orl/rollout.py) drives agents through an environment against orl's server. This
module is pure logic: no HTTP. Reads and writes no topics.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from orl.connectors.environment.api import Outcome, discover_plugins
from orl.schemas.errors import ConfigError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "orl.environments"
Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = typing.get_args(Split)
Message = dict[str, Any]


@dataclass(frozen=True)
class Task:
    """One task: what the agent is told (`messages`), what it may call (`tools`), what the verifier needs."""

    task_id: str
    messages: tuple[Message, ...]
    tools: tuple[Message, ...] = ()
    split: str = "train"
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {self.split!r}")


@runtime_checkable
class Episode(Protocol):
    """One attempt at a task: runs tool calls, then judges the final answer."""

    def step(self, tool_calls: list[Message]) -> list[Message]: ...

    def verdict(self, final_text: str) -> Outcome: ...

    def close(self) -> None: ...


@runtime_checkable
class Environment(Protocol):
    """A source of tasks and the episodes that run them."""

    name: str

    def tasks(self, split: str, count: int, seed: int) -> list[Task]: ...

    def start(self, task: Task) -> Episode: ...


EnvironmentFactory = Callable[[], Environment]


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    return split


def task_id_and_split(env_name: str, question: str, data: Mapping[str, Any]) -> tuple[str, str]:
    """A task's id and split, both from a hash of what it asks: the same task always gets the same id,
    and the train and eval splits never share a task."""
    digest = hashlib.sha256(json.dumps([question, data], sort_keys=True).encode()).hexdigest()
    return f"{env_name}-{digest[:12]}", SPLITS[int(digest[-1], 16) % 2]


def draw_tasks(
    env_name: str,
    split: str,
    count: int,
    seed: int,
    draw: Callable[[random.Random], tuple[str, dict[str, Any]]],
) -> list[tuple[str, str, dict[str, Any]]]:
    """`count` distinct tasks of `split` as (task_id, question, data): `draw(rng)` proposes one from
    a generator seeded by (env_name, seed); those of the other split or already drawn are skipped."""
    check_split(split)
    rng = random.Random(f"{env_name}:{seed}")
    drawn: dict[str, tuple[str, str, dict[str, Any]]] = {}
    while len(drawn) < count:
        question, data = draw(rng)
        task_id, task_split = task_id_and_split(env_name, question, data)
        if task_split == split and task_id not in drawn:
            drawn[task_id] = (task_id, question, data)
    return list(drawn.values())


def task_verdict(correct: bool, reason: str, **detail: Any) -> Outcome:
    """The outcome every built-in verifier returns: kind "task", reward +1 / -1, the reason in the detail."""
    return Outcome(
        kind="task", reward=1.0 if correct else -1.0, detail={"correct": correct, "reason": reason, **detail}
    )


# -- tool calls ------------------------------------------------------------------------------------


def tool_message(call_id: str, content: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def call_name_and_arguments(call: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The function name and the decoded arguments of an OpenAI tool call; ValueError says what is wrong."""
    function = call.get("function")
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError("the tool call has no function name")
    raw = function.get("arguments") or "{}"
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"the arguments are not JSON: {error.msg}") from None
    if not isinstance(raw, dict):
        raise ValueError("the arguments must be a JSON object")
    return function["name"], raw


def run_tool_calls(
    tool_calls: list[Message], tools: Mapping[str, Callable[[dict[str, Any]], str]]
) -> list[Message]:
    """Run each call with the tool of its name; every failure becomes a tool message saying what went wrong.

    A tool signals a bad call by raising ValueError, KeyError or TypeError (a missing or mistyped
    argument); any other exception is a bug in the tool and propagates.
    """
    replies = []
    for index, call in enumerate(tool_calls):
        call_id = str(call.get("id") or f"call_{index}")
        try:
            name, arguments = call_name_and_arguments(call)
            tool = tools.get(name)
            if tool is None:
                known = f"the tools are {', '.join(sorted(tools))}" if tools else "this task has no tools"
                raise ValueError(f"no tool named {name!r}; {known}")
            content = tool(arguments)
        except KeyError as error:
            content = f"error: missing argument {error}"
        except (ValueError, TypeError) as error:
            content = f"error: {error}"
        replies.append(tool_message(call_id, content))
    return replies


# -- discovery -------------------------------------------------------------------------------------


def built_in_environments() -> dict[str, EnvironmentFactory]:
    from orl.connectors.environment.terminal_env import TerminalEnvironment
    from orl.connectors.environment.tool_env import ToolEnvironment, ToolResultEnvironment

    return {"tool": ToolEnvironment, "tool_result": ToolResultEnvironment, "terminal": TerminalEnvironment}


def discover_environments() -> dict[str, EnvironmentFactory]:
    """Every environment by name: the built-ins, then the "orl.environments" entry points."""
    return discover_plugins(ENTRY_POINT_GROUP, built_in_environments(), "environment")


def load_environment(name: str) -> Environment:
    """An environment instance by name; ConfigError naming the known ones when there is none."""
    factories = discover_environments()
    if name not in factories:
        raise ConfigError(f"no environment {name!r}; known: {', '.join(sorted(factories))}")
    return factories[name]()
