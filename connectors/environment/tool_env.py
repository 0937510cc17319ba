"""The tool-call environment ("tool"): arithmetic and shopping questions an agent answers with tools.

Tools: `calculate` (a safe arithmetic evaluator: numbers and + - * / // % ** only, never `eval`)
and `lookup_price` (the unit price of an item in the task's own price list). Tasks are generated
from a seed: "What is (734 + 218) * 47?" (needs `calculate`) and "What do 3 pears and 5 figs cost?"
(needs `lookup_price`, then `calculate`). The train and eval splits never share a question (a hash
of the question picks its split). The verifier takes the last number of the final answer and
compares it with the true value. An episode runs at most `max_tool_calls` calls; past that every
call is answered with an error message.

"tool_result" (`ToolResultEnvironment`) is the arithmetic half with the call already made: a task
opens with the question, the assistant's `calculate` call with the question's expression and the
tool's result, and the agent's task is to answer with that result. It is the part of tool use a
135M model can learn by RL alone: SmolLM2-135M-Instruct wrote no parseable call in 440 sampled
attempts (0 / 40 per prompt variant, forced or not), so a task that needs it to make the call has
no reward signal, while it answers with the tool's number in about a third of its replies.
Reads and writes no topics.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orl.connectors.environment.api import Outcome
from orl.connectors.environment.episode import (
    Message,
    Task,
    draw_tasks,
    run_tool_calls,
    task_verdict,
    tool_message,
)

SYSTEM = (
    "You are a careful assistant with tools. Use the tools for every lookup and every calculation, "
    "then reply with the final number only."
)
CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 12"}},
            "required": ["expression"],
        },
    },
}
LOOKUP_PRICE = {
    "type": "function",
    "function": {
        "name": "lookup_price",
        "description": "The unit price of an item, in cents.",
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string", "description": "e.g. pear"}},
            "required": ["item"],
        },
    },
}
ITEMS = ("apple", "pear", "fig", "plum", "lemon", "melon", "kiwi", "mango")

_OPERATORS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def calculate(expression: str) -> float:
    """Evaluate `expression` with numbers and arithmetic operators only; ValueError otherwise."""
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    try:
        tree = ast.parse(expression.replace("^", "**").replace("×", "*"), mode="eval")
    except SyntaxError as error:
        raise ValueError(f"not an arithmetic expression: {error.msg}") from None
    return float(_value(tree.body))


def _value(node: ast.AST) -> float:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](_value(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ValueError("exponent too large")
        try:
            return float(_OPERATORS[type(node.op)](left, right))
        except (ZeroDivisionError, OverflowError) as error:
            raise ValueError(str(error)) from None
    raise ValueError(f"unsupported element {type(node).__name__}")


def format_number(value: float) -> str:
    """A number as a person writes it: 1411344, not 1.41134e+06."""
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.10g}"


def final_number(text: str | None) -> float | None:
    """The last number in `text` (thousands separators ignored), or None."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", (text or "").replace(",", ""))
    return float(numbers[-1]) if numbers else None


def _arithmetic(rng: random.Random) -> tuple[str, dict[str, Any]]:
    a, b, c = rng.randint(100, 999), rng.randint(100, 999), rng.randint(11, 99)
    expression = rng.choice(["({a} + {b}) * {c}", "{a} * {c} - {b}", "({a} - {b}) * {c}"]).format(
        a=a, b=b, c=c
    )
    return f"What is {expression}?", {"kind": "arithmetic", "expected": calculate(expression)}


def _shopping(rng: random.Random) -> tuple[str, dict[str, Any]]:
    prices = {item: rng.randint(20, 400) for item in ITEMS}
    first, second = rng.sample(ITEMS, 2)
    n_first, n_second = rng.randint(2, 9), rng.randint(2, 9)
    question = f"What do {n_first} {first}s and {n_second} {second}s cost, in cents?"
    expected = float(n_first * prices[first] + n_second * prices[second])
    return question, {"kind": "shopping", "expected": expected, "prices": prices}


def _shopping_or_arithmetic(rng: random.Random) -> tuple[str, dict[str, Any]]:
    return (_shopping if rng.random() < 0.5 else _arithmetic)(rng)


@dataclass
class ToolEpisode:
    task: Task
    max_tool_calls: int
    tool_calls_made: int = 0

    def step(self, tool_calls: list[Message]) -> list[Message]:
        allowed = max(0, self.max_tool_calls - self.tool_calls_made)
        self.tool_calls_made += len(tool_calls)
        replies = run_tool_calls(tool_calls[:allowed], {"calculate": _calculate, "lookup_price": self._price})
        for index, call in enumerate(tool_calls[allowed:], start=len(replies)):
            reply = f"error: the limit of {self.max_tool_calls} tool calls is reached; give your final answer"
            replies.append(tool_message(str(call.get("id") or f"call_{index}"), reply))
        return replies

    def verdict(self, final_text: str) -> Outcome:
        expected = float(self.task.data["expected"])
        answer = final_number(final_text)
        correct = answer is not None and math.isclose(answer, expected, rel_tol=1e-6, abs_tol=1e-6)
        shown = "no number" if answer is None else format_number(answer)
        reason = f"{'correct' if correct else 'wrong'}: answered {shown}, expected {format_number(expected)}"
        return task_verdict(correct, reason, expected=expected, answer=answer)

    def close(self) -> None:
        pass  # nothing held

    def _price(self, arguments: dict[str, Any]) -> str:
        item = str(arguments["item"]).strip().lower().removesuffix("s")
        prices = self.task.data.get("prices") or {}
        if item not in prices:
            raise ValueError(f"no price for {arguments['item']!r}")
        return f"{prices[item]} cents"


def _calculate(arguments: dict[str, Any]) -> str:
    return format_number(calculate(str(arguments["expression"])))


@dataclass
class ToolEnvironment:
    """Arithmetic (calculate) and shopping (lookup_price + calculate) questions; see the module docstring."""

    max_tool_calls: int = 8
    name: str = "tool"

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        tasks = []
        for task_id, question, data in draw_tasks(self.name, split, count, seed, _shopping_or_arithmetic):
            tools = (LOOKUP_PRICE, CALCULATE) if data["kind"] == "shopping" else (CALCULATE,)
            messages = ({"role": "system", "content": SYSTEM}, {"role": "user", "content": question})
            tasks.append(Task(task_id, messages, tools, split, data))
        return tasks

    def start(self, task: Task) -> ToolEpisode:
        return ToolEpisode(task, self.max_tool_calls)


@dataclass
class ToolResultEnvironment(ToolEnvironment):
    """Arithmetic questions whose `calculate` call is already made: answer with its result (see the module docstring)."""

    name: str = "tool_result"

    def tasks(self, split: str, count: int, seed: int) -> list[Task]:
        tasks = []
        for task_id, question, data in draw_tasks(self.name, split, count, seed, _arithmetic):
            expression = question.removeprefix("What is ").removesuffix("?")
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": "calculate", "arguments": json.dumps({"expression": expression})},
            }
            messages = (
                {"role": "user", "content": question},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                tool_message("call_0", format_number(data["expected"])),
            )
            tasks.append(Task(task_id, messages, (CALCULATE,), split, data))
        return tasks
