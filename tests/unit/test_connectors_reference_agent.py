"""examples/calculator_agent.py: its safe evaluator, task generator and verdict connector."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from orl.connectors.environment.api import Connector, TurnContext, run_connector

PATH = Path(__file__).resolve().parents[2] / "examples" / "calculator_agent.py"


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calculator_agent", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["calculator_agent"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("expression", "value"),
    [("(3 + 4) * 12", 84.0), ("-2 ** 3", -8.0), ("7 // 2 + 7 % 2", 4.0), ("1 / 4", 0.25), ("2^10", 1024.0)],
)
def test_calculate_evaluates_arithmetic(agent: ModuleType, expression: str, value: float) -> None:
    assert agent.calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "x + 1",
        "(1).real",
        "[1, 2]",
        "1 / 0",
        "9 ** 9 ** 9",
        "2 +",
        "1" * 201,
    ],
)
def test_calculate_refuses_everything_else(agent: ModuleType, expression: str) -> None:
    with pytest.raises(ValueError):
        agent.calculate(expression)


def test_tool_errors_are_returned_to_the_model(agent: ModuleType) -> None:
    assert agent.run_tool('{"expression": "6 * 7"}') == "42"
    assert agent.run_tool("not json").startswith("error:")
    assert agent.run_tool('{"expr": "1"}').startswith("error:")


def test_tasks_are_reproducible(agent: ModuleType) -> None:
    assert agent.make_tasks(3, seed=5) == agent.make_tasks(3, seed=5)
    task = agent.make_tasks(1, seed=5)[0]
    assert agent.calculate(task.question.removeprefix("What is ").removesuffix("?")) == task.expected


def test_verdict_connector_scores_the_last_number(agent: ModuleType) -> None:
    connector = agent.CalculatorVerdict(expected=84.0)
    assert isinstance(connector, Connector)

    def verdict(text: str) -> float:
        context = TurnContext("s", "s/t1", response_text=text, payload={"steps": ["s/t0", "s/t1"]})
        observation = run_connector(connector, context, timeout_s=5)
        assert observation is not None and observation.outcome is not None
        assert observation.outcome.detail["steps"] == ["s/t0", "s/t1"]
        return float(observation.outcome.reward)

    assert verdict("The answer is 84.") == 1.0
    assert verdict("7 times 12 is 84.0") == 1.0
    assert verdict("It is 85") == -1.0
    assert verdict("no idea") == -1.0
