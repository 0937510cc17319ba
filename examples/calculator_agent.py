"""A reference tool-calling agent: solves arithmetic tasks with a `calculate` tool, through orl.

It talks to orl's server with the official `openai` client like any agent would. Each task is one
session (POST /v1/sessions/start); each model call is one turn (the server answers with the
turn's id in the `x-turn-id` header). Tool calls are executed here, by a safe arithmetic evaluator
(no `eval`; `orl.connectors.environment.tool_env.calculate`, which `orl rollout --env tool` uses too),
and sent back as tool messages, which the pipeline's turn linker turns into each
step's next state. When the task ends, a connector (`CalculatorVerdict`, run through
`run_connector`) checks the final answer against the true value and the agent posts its
observation (outcome kind "task", reward +1 / -1) for the last turn to POST /v1/observations;
the outcome judge turns it into that turn's reward.

    python examples/calculator_agent.py --base-url http://127.0.0.1:8000/v1 --api-key KEY --tasks 3

Prints one JSON line per task: session id, turn ids, the answer, and whether it was correct.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass, field
from typing import Any

import openai
from orl.connectors.environment.api import Observation, Outcome, TurnContext, run_connector
from orl.connectors.environment.ingest_client import IngestClient
from orl.connectors.environment.tool_env import CALCULATE, calculate, final_number

SYSTEM = (
    "You are a careful calculator assistant. Call the `calculate` tool with an arithmetic "
    "expression, then reply with the final number only."
)
TOOLS = [CALCULATE]


@dataclass(frozen=True)
class Task:
    task_id: str
    question: str
    expected: float


def make_tasks(count: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for index in range(count):
        a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 20)
        expression = f"({a} + {b}) * {c}"
        tasks.append(Task(f"calc-{seed}-{index}", f"What is {expression}?", calculate(expression)))
    return tasks


@dataclass
class CalculatorVerdict:
    """A connector: is the final answer (the last number of the response) the task's true value?"""

    expected: float
    name: str = "calculator"

    def observe(self, context: TurnContext) -> Observation | None:
        answer = final_number(context.response_text)
        correct = answer is not None and math.isclose(answer, self.expected, rel_tol=1e-6, abs_tol=1e-6)
        verdict = "correct" if correct else "incorrect"
        return Observation(
            content=f"task verdict: {verdict} (expected {self.expected:g}, answered {answer})",
            role="environment",
            outcome=Outcome(
                kind="task",
                reward=1.0 if correct else -1.0,
                detail={"expected": self.expected, "answer": answer, "steps": list(context.payload["steps"])},
            ),
        )


@dataclass
class Episode:
    task: Task
    session_id: str
    turn_ids: list[str] = field(default_factory=list)
    answer_text: str | None = None
    tool_calls: int = 0


def run_task(
    client: openai.OpenAI, ingest: IngestClient, task: Task, args: argparse.Namespace
) -> dict[str, Any]:
    episode = Episode(task, ingest.start_session(task.task_id))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task.question},
    ]
    for step in range(args.max_steps):
        forced: Any = {"type": "function", "function": {"name": "calculate"}}
        raw = client.chat.completions.with_raw_response.create(
            model=args.model,
            messages=messages,  # type: ignore[arg-type]
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice=forced if args.force_tool and step == 0 else "auto",
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            extra_headers={"X-Session-Id": episode.session_id},
        )
        episode.turn_ids.append(raw.headers["x-turn-id"])
        message = raw.parse().choices[0].message
        episode.answer_text = message.content
        if not message.tool_calls:
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            episode.tool_calls += 1
            arguments = call.function.arguments if call.type == "function" else ""
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(arguments)})
    return report(ingest, episode)


def run_tool(arguments: str) -> str:
    try:
        expression = json.loads(arguments)["expression"]
        return f"{calculate(str(expression)):g}"
    except (ValueError, KeyError, TypeError) as error:
        return f"error: {error}"


def report(ingest: IngestClient, episode: Episode) -> dict[str, Any]:
    """Run the verdict connector on the last turn, post its observation, end the session."""
    last_turn = episode.turn_ids[-1]
    context = TurnContext(
        episode.session_id,
        last_turn,
        response_text=episode.answer_text or "",
        payload={"steps": episode.turn_ids},
    )
    observation = run_connector(CalculatorVerdict(episode.task.expected), context, timeout_s=10)
    assert observation is not None
    posted = ingest.observation(
        observation, session_id=episode.session_id, turn_id=last_turn, source="calculator"
    )
    ingest.end_session(episode.session_id)
    outcome = observation.outcome
    return {
        "task_id": episode.task.task_id,
        "session_id": episode.session_id,
        "turn_ids": episode.turn_ids,
        "tool_calls": episode.tool_calls,
        "answer": episode.answer_text,
        "expected": episode.task.expected,
        "correct": outcome is not None and outcome.reward == 1.0,
        "event_id": posted["event_id"],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="orl's OpenAI base URL.")
    parser.add_argument("--api-key", required=True, help="A bearer key of the server (ORL_API_KEYS).")
    parser.add_argument("--model", default="orl-policy", help="Model name to send.")
    parser.add_argument("--tasks", type=int, default=3, help="Number of tasks to solve.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the generated tasks.")
    parser.add_argument("--max-steps", type=int, default=3, help="Model calls per task at most.")
    parser.add_argument("--max-tokens", type=int, default=96, help="max_tokens of each model call.")
    parser.add_argument("--temperature", type=float, default=0.7, help="Sampling temperature.")
    parser.add_argument(
        "--force-tool", action="store_true", help="Force a `calculate` call on each task's first step."
    )
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.max_steps < 1:
        parser.error("--tasks and --max-steps must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=2, timeout=300)
    correct = 0
    with IngestClient(args.base_url, args.api_key) as ingest:
        for task in make_tasks(args.tasks, args.seed):
            result = run_task(client, ingest, task, args)
            correct += result["correct"]
            print(json.dumps(result), flush=True)
    print(f"{correct}/{args.tasks} correct", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
