"""The environment API and the two built-ins: tasks, tool calls, limits, verdicts, clean-up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from orl.connectors.environment.episode import (
    Environment,
    Episode,
    Task,
    call_name_and_arguments,
    load_environment,
    run_tool_calls,
)
from orl.connectors.environment.terminal_env import TerminalEnvironment
from orl.connectors.environment.tool_env import (
    ToolEnvironment,
    ToolResultEnvironment,
    calculate,
    final_number,
    format_number,
)
from orl.schemas.errors import ConfigError


def call(name: str, arguments: object, call_id: str = "call_1") -> dict:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": raw}}


def question(task: Task) -> str:
    return str(task.messages[-1]["content"])


# -- the API ---------------------------------------------------------------------------------------


def test_built_ins_load_by_name_and_follow_the_protocols() -> None:
    for name, cls in (("tool", ToolEnvironment), ("terminal", TerminalEnvironment)):
        env = load_environment(name)
        assert isinstance(env, cls) and isinstance(env, Environment) and env.name == name
        task = env.tasks("train", 1, seed=0)[0]
        episode = env.start(task)
        try:
            assert isinstance(episode, Episode)
        finally:
            episode.close()


def test_an_unknown_environment_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="no environment 'nope'; known: terminal, tool"):
        load_environment("nope")


def test_a_task_refuses_an_unknown_split() -> None:
    with pytest.raises(ValueError, match="split"):
        Task("t", ({"role": "user", "content": "hi"},), split="test")
    with pytest.raises(ConfigError, match="split"):
        ToolEnvironment().tasks("test", 1, seed=0)


@pytest.mark.parametrize(
    "env", [ToolEnvironment(), ToolResultEnvironment(), TerminalEnvironment()], ids=lambda e: e.name
)
def test_tasks_are_reproducible_and_the_splits_are_disjoint(env: Environment) -> None:
    train = env.tasks("train", 30, seed=3)
    assert train == env.tasks("train", 30, seed=3)
    assert [t.task_id for t in env.tasks("train", 30, seed=4)] != [t.task_id for t in train]
    evaluation = env.tasks("eval", 30, seed=3) + env.tasks("eval", 30, seed=4)
    assert {t.task_id for t in train}.isdisjoint(t.task_id for t in evaluation)
    assert len({t.task_id for t in train}) == 30
    for task in train:
        assert task.split == "train"
        opening = ["user", "assistant", "tool"] if env.name == "tool_result" else ["system", "user"]
        assert [m["role"] for m in task.messages] == opening
        assert task.tools and all(tool["type"] == "function" for tool in task.tools)


def test_tool_call_arguments_may_be_a_json_string_or_an_object() -> None:
    assert call_name_and_arguments(call("f", {"x": 1})) == ("f", {"x": 1})
    plain = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}
    assert call_name_and_arguments(plain) == ("f", {"x": 1})
    for broken, reason in (
        (call("f", "{x"), "not JSON"),
        (call("f", "[1]"), "JSON object"),
        ({}, "no function"),
    ):
        with pytest.raises(ValueError, match=reason):
            call_name_and_arguments(broken)


def test_a_tool_error_becomes_the_tool_message_and_a_bug_propagates() -> None:
    def tool(arguments: dict) -> str:
        if arguments.get("boom"):
            raise RuntimeError("a bug")
        return str(arguments["x"])

    replies = run_tool_calls(
        [call("t", {"x": 5}, "a"), call("t", {}, "b"), call("other", {}, "c"), call("t", "nope", "d")],
        {"t": tool},
    )
    assert [r["tool_call_id"] for r in replies] == ["a", "b", "c", "d"]
    assert all(r["role"] == "tool" for r in replies)
    assert [r["content"] for r in replies[:3]] == [
        "5",
        "error: missing argument 'x'",
        "error: no tool named 'other'; the tools are t",
    ]
    assert replies[3]["content"].startswith("error: the arguments are not JSON")
    with pytest.raises(RuntimeError, match="a bug"):
        run_tool_calls([call("t", {"boom": True})], {"t": tool})


# -- the tool environment --------------------------------------------------------------------------


def test_calculate_and_number_helpers() -> None:
    assert calculate("(340 + 571) * 21") == 19131.0
    assert format_number(1411344.0) == "1411344" and format_number(0.25) == "0.25"
    assert final_number("so it is 1,411,344.") == 1411344.0 and final_number("none") is None
    with pytest.raises(ValueError):
        calculate("__import__('os')")


def test_every_tool_task_is_answered_by_its_tools() -> None:
    env = ToolEnvironment()
    for task in env.tasks("eval", 20, seed=1):
        episode = env.start(task)
        if task.data["kind"] == "arithmetic":
            expression = question(task).removeprefix("What is ").removesuffix("?")
            [reply] = episode.step([call("calculate", {"expression": expression})])
        else:
            words = question(task).removeprefix("What do ").split(" cost")[0].split(" and ")
            counts = [(int(w.split()[0]), w.split()[1]) for w in words]
            prices = episode.step(
                [call("lookup_price", {"item": item}, f"c{i}") for i, (_, item) in enumerate(counts)]
            )
            cents = [int(p["content"].removesuffix(" cents")) for p in prices]
            expression = " + ".join(f"{n} * {c}" for (n, _), c in zip(counts, cents, strict=True))
            [reply] = episode.step([call("calculate", {"expression": expression})])
        assert reply["content"] == format_number(task.data["expected"]), task
        right = episode.verdict(f"The answer is {reply['content']}.")
        wrong = episode.verdict(f"The answer is {task.data['expected'] + 1:g}.")
        assert (right.kind, right.reward, wrong.reward) == ("task", 1.0, -1.0)
        assert right.detail is not None and right.detail["reason"].startswith("correct")
        assert wrong.detail is not None and wrong.detail["reason"].startswith("wrong: answered")


def test_a_tool_result_task_opens_with_the_call_made_and_is_won_by_its_result() -> None:
    for task in ToolResultEnvironment().tasks("eval", 10, seed=1):
        user, assistant, tool = task.messages
        [made] = assistant["tool_calls"]
        expression = json.loads(made["function"]["arguments"])["expression"]
        assert user["content"] == f"What is {expression}?" and tool["tool_call_id"] == made["id"]
        assert tool["content"] == format_number(calculate(expression)) == format_number(task.data["expected"])
        episode = ToolResultEnvironment().start(task)
        assert episode.verdict(f"The result is {tool['content']}.").reward == 1.0
        assert episode.verdict(f"{tool['content']} is wrong, it is 12.").reward == -1.0
        assert episode.step([call("calculate", {"expression": expression})])[0]["content"] == tool["content"]


def test_tool_errors_and_the_call_limit_are_tool_messages() -> None:
    env = ToolEnvironment(max_tool_calls=2)
    task = next(t for t in env.tasks("train", 10, seed=0) if t.data["kind"] == "shopping")
    episode = env.start(task)
    first = episode.step([call("calculate", {"expression": "1 / 0"}), call("lookup_price", {"item": "rock"})])
    assert [m["content"] for m in first] == ["error: division by zero", "error: no price for 'rock'"]
    [late] = episode.step([call("calculate", {"expression": "1 + 1"}, "late")])
    assert late["tool_call_id"] == "late" and "limit of 2 tool calls" in late["content"]
    assert episode.verdict("").detail["reason"].startswith("wrong: answered no number")  # type: ignore[index]


# -- the terminal environment ----------------------------------------------------------------------


def shell(command: str, call_id: str = "call_1") -> dict:
    return call("shell", {"command": command}, call_id)


def terminal_task(kind: str, env: TerminalEnvironment) -> Task:
    return next(t for t in env.tasks("train", 20, seed=2) if t.data["kind"] == kind)


def test_create_file_is_verified_from_the_folder_and_the_folder_is_removed() -> None:
    env = TerminalEnvironment()
    task = terminal_task("create_file", env)
    episode = env.start(task)
    folder = episode.folder
    try:
        assert episode.verdict("done").detail["reason"] == f"wrong: there is no file {task.data['name']}"  # type: ignore[index]
        [reply] = episode.step([shell(f"printf 'nope' > {task.data['name']}")])
        assert reply["role"] == "tool" and "exit code 0" in reply["content"]
        assert episode.verdict("done").reward == -1.0
        episode.step([shell(f"echo '{task.data['text']}' > {task.data['name']}")])
        assert episode.verdict("I could not do it").reward == 1.0  # the folder decides, not the words
    finally:
        episode.close()
    assert not folder.exists()


def test_count_lines_gets_its_file_and_each_episode_its_own_folder() -> None:
    env = TerminalEnvironment()
    task = terminal_task("count_lines", env)
    first, second = env.start(task), env.start(task)
    try:
        assert first.folder != second.folder
        assert (first.folder / task.data["name"]).read_text() == task.data["content"]
        [reply] = first.step([shell(f"wc -l < {task.data['name']} > answer.txt; cat answer.txt")])
        assert str(task.data["expected"]) in reply["content"]
        assert first.verdict("").reward == 1.0
        assert not (second.folder / "answer.txt").exists() and second.verdict("").reward == -1.0
    finally:
        first.close()
        second.close()


def test_a_command_runs_under_the_time_and_command_limits(tmp_path: Path) -> None:
    env = TerminalEnvironment(timeout_s=0.5, max_commands=2)
    episode = env.start(terminal_task("create_file", env))
    try:
        [slow] = episode.step([shell("sleep 5")])
        assert "killed at its time limit" in slow["content"]  # sleep 5, killed by the 0.5 s limit
        [bad] = episode.step([call("shell", {"command": ""})])
        assert bad["content"] == "error: 'command' must be a non-empty string"
        [home] = episode.step([shell("pwd; echo $HOME")])
        assert home["content"].count(str(episode.folder.resolve())) >= 1
        [over] = episode.step([shell("true")])
        assert "limit of 2 commands" in over["content"]
    finally:
        episode.close()
