"""`orl rollout`: drive agents through an environment's tasks against orl's server, in groups.

For each of --tasks tasks (drawn from the environment's --split with --seed) it runs --group-size
rollouts, --concurrency at a time (threads). One rollout is one session:

1. POST /v1/sessions/start {task_id} -> the session id;
2. chat completions with the task's messages and tools and the headers X-Session-Id, X-Group-Id
   (`<task_id>:<seed>`, the same for the whole group) and X-Group-Size; while the reply has tool
   calls, the episode runs them and the assistant message plus the tool messages go into the next
   request (that request is how the pipeline learns each step's next state); it stops at a reply
   without tool calls or after --max-steps calls (the last reply's tool calls still run, so a
   terminal task can be finished by them);
3. the episode's verdict (outcome kind "task", reward +1 / -1) goes to POST /v1/observations for the
   session's last turn (source "env:<name>"), then POST /v1/sessions/{id}/end closes the session.

`--turn-type side` marks every call a side turn (X-Turn-Type): an evaluation that is recorded and
audited but never becomes a training sample.

Prints one line per finished rollout and a summary (success rate with a 95% Wilson interval, mean
steps, time), and writes one JSON line per rollout to --out. Reads and writes no topics itself: the
server records the turns, the observation and the session's end.
"""

from __future__ import annotations

import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

from orl.connectors.environment.api import Observation, Outcome
from orl.connectors.environment.episode import Environment, Message, Split, Task, load_environment
from orl.connectors.environment.ingest_client import IngestClient, IngestError
from orl.connectors.settings import ServerClientSettings, setting
from orl.schemas.errors import ConfigError
from orl.serving.settings import TurnType


@dataclass(frozen=True)
class RolloutSettings(ServerClientSettings):
    env: str = setting(
        "tool", "ORL_ROLLOUT_ENV", "Environment: tool, terminal, or one registered under orl.environments."
    )
    tasks: int = setting(8, "ORL_ROLLOUT_TASKS", "How many tasks to draw.")
    group_size: int = setting(4, "ORL_ROLLOUT_GROUP_SIZE", "Rollouts per task (one group).")
    concurrency: int = setting(4, "ORL_ROLLOUT_CONCURRENCY", "Rollouts running at once.")
    split: Split = setting("train", "ORL_ROLLOUT_SPLIT", "Which tasks: train | eval (never the same tasks).")
    seed: int = setting(0, "ORL_ROLLOUT_SEED", "Seed of the drawn tasks (also part of the group id).")
    model: str = setting("orl-policy", "ORL_ROLLOUT_MODEL", "Model name sent with each request.")
    max_steps: int = setting(6, "ORL_ROLLOUT_MAX_STEPS", "Model calls per rollout at most.")
    max_tokens: int = setting(256, "ORL_ROLLOUT_MAX_TOKENS", "max_tokens of each model call.")
    temperature: float = setting(1.0, "ORL_ROLLOUT_TEMPERATURE", "Sampling temperature.")
    force_tool: bool = setting(
        False, "ORL_ROLLOUT_FORCE_TOOL", "Force a call of the task's first tool on each rollout's first step."
    )
    turn_type: TurnType = setting(
        "main",
        "ORL_ROLLOUT_TURN_TYPE",
        "main (the rollouts become training samples) | side (evaluation: X-Turn-Type side, never trained on).",
    )
    request_timeout_s: float = setting(300.0, "ORL_ROLLOUT_REQUEST_TIMEOUT_S", "Time limit of one HTTP call.")
    out: Path = setting(Path("rollouts.jsonl"), "ORL_ROLLOUT_OUT", "One JSON line per rollout goes here.")

    def __post_init__(self) -> None:
        for name in ("tasks", "group_size", "concurrency", "max_steps", "max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1")
        if not self.api_key:
            raise ConfigError("--api-key (ORL_API_KEY) is required: a key of the server's ORL_API_KEYS")


@dataclass
class RolloutResult:
    task_id: str
    group_id: str
    session_id: str = ""
    turn_ids: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {"name", "arguments"} per call
    final_text: str = ""
    reward: float | None = None
    verdict: str = ""
    seconds: float = 0.0
    error: str | None = None

    @property
    def steps(self) -> int:
        return len(self.turn_ids)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "steps": self.steps}


class PolicyClient:
    """Chat completions against orl's server: one call is one turn, named by the `x-turn-id` header."""

    def __init__(self, settings: RolloutSettings) -> None:
        self.settings = settings
        self._http = httpx.Client(
            base_url=settings.server_url.rstrip("/"),
            headers={"Authorization": f"Bearer {settings.api_key}"},
            timeout=settings.request_timeout_s,
            limits=httpx.Limits(max_connections=settings.concurrency + 2),
        )

    def close(self) -> None:
        self._http.close()

    def complete(
        self, messages: list[Message], task: Task, headers: dict[str, str], force_tool: bool
    ) -> tuple[Message, str]:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": messages,
            "max_tokens": self.settings.max_tokens,
            "temperature": self.settings.temperature,
        }
        if task.tools:
            body["tools"] = list(task.tools)
            if force_tool:
                body["tool_choice"] = {
                    "type": "function",
                    "function": {"name": task.tools[0]["function"]["name"]},
                }
        response = self._http.post("/chat/completions", json=body, headers=headers)
        if response.status_code >= 400:
            raise IngestError(response.status_code, _error_message(response))
        message = response.json()["choices"][0]["message"]
        reply = {"role": "assistant", "content": message.get("content")}
        if message.get("tool_calls"):
            reply["tool_calls"] = message["tool_calls"]
        return reply, response.headers["x-turn-id"]


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]


def run_one(
    task: Task,
    group_id: str,
    env: Environment,
    policy: PolicyClient,
    ingest: IngestClient,
    settings: RolloutSettings,
) -> RolloutResult:
    """One rollout (see the module docstring); an HTTP failure is recorded in `error`, never raised."""
    started = time.monotonic()
    result = RolloutResult(task.task_id, group_id)
    episode = env.start(task)
    try:
        result.session_id = ingest.start_session(task.task_id)
        headers = {
            "X-Session-Id": result.session_id,
            "X-Group-Id": group_id,
            "X-Group-Size": str(settings.group_size),
            "X-Turn-Type": settings.turn_type,
        }
        messages: list[Message] = [dict(message) for message in task.messages]
        for step in range(settings.max_steps):
            reply, turn_id = policy.complete(messages, task, headers, settings.force_tool and step == 0)
            result.turn_ids.append(turn_id)
            result.final_text = reply.get("content") or ""
            calls = reply.get("tool_calls") or []
            if not calls:
                break
            result.tool_calls += [_shown(call) for call in calls]
            messages += [reply, *episode.step(calls)]
        outcome = episode.verdict(result.final_text)
        result.reward, result.verdict = outcome.reward, _verdict_line(outcome)
        observation = Observation(content=result.verdict, role="environment", outcome=outcome)
        ingest.observation(
            observation, session_id=result.session_id, turn_id=result.turn_ids[-1], source=f"env:{env.name}"
        )
        ingest.end_session(result.session_id)
    except (IngestError, httpx.HTTPError) as error:
        result.error = f"{type(error).__name__}: {error}"
    finally:
        episode.close()
        result.seconds = round(time.monotonic() - started, 3)
    return result


def _shown(call: Message) -> dict[str, Any]:
    function = call.get("function") or {}
    return {"name": function.get("name"), "arguments": function.get("arguments")}


def _verdict_line(outcome: Outcome) -> str:
    reason = (outcome.detail or {}).get("reason")
    reward = "no reward" if outcome.reward is None else f"reward {outcome.reward:+g}"
    return " ".join(f"task verdict: {reward}; {reason or outcome.kind}".split())  # one line


def wilson_interval(successes: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a success rate (95% for z = 1.96); (0, 1) without trials."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    center = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return max(0.0, center - half), min(1.0, center + half)


def summary(results: list[RolloutResult], seconds: float) -> str:
    finished = [r for r in results if r.error is None]
    successes = sum(1 for r in finished if r.reward is not None and r.reward > 0)
    low, high = wilson_interval(successes, len(finished))
    rate = successes / len(finished) if finished else 0.0
    mean_steps = sum(r.steps for r in finished) / len(finished) if finished else 0.0
    return (
        f"{successes}/{len(finished)} succeeded: {rate:.2f} [95% Wilson {low:.2f}, {high:.2f}]; "
        f"mean steps {mean_steps:.2f}; {len(results) - len(finished)} failed with an error; {seconds:.1f} s"
    )


def progress_line(done: int, total: int, result: RolloutResult) -> str:
    head = f"[{done}/{total}] {result.group_id} session {result.session_id or '-'}"
    if result.error is not None:
        return f"{head}: error: {result.error} ({result.seconds:.1f} s)"
    return (
        f"{head}: {result.steps} steps, {len(result.tool_calls)} tool calls, {result.verdict} "
        f"({result.seconds:.1f} s)"
    )


def run_rollouts(settings: RolloutSettings, env: Environment, out: TextIO) -> list[RolloutResult]:
    """Every rollout of every task, `settings.concurrency` at a time; progress lines go to `out`."""
    tasks = env.tasks(settings.split, settings.tasks, settings.seed)
    jobs = [(task, f"{task.task_id}:{settings.seed}") for task in tasks for _ in range(settings.group_size)]
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    results: list[RolloutResult] = []
    with (
        closing(PolicyClient(settings)) as policy,
        IngestClient(settings.server_url, settings.api_key, timeout_s=settings.request_timeout_s) as ingest,
        ThreadPoolExecutor(settings.concurrency, thread_name_prefix="rollout") as pool,
        settings.out.open("w") as lines,
    ):
        futures = [pool.submit(run_one, task, group, env, policy, ingest, settings) for task, group in jobs]
        for future in as_completed(futures):
            result = future.result()
            results.append(result)
            lines.write(json.dumps(result.record()) + "\n")
            lines.flush()
            print(progress_line(len(results), len(jobs), result), file=out, flush=True)
    return results


def run_rollout(settings: RolloutSettings) -> int:
    """`orl rollout`: 0 when every rollout reached a verdict, 1 when any failed with an error."""
    env = load_environment(settings.env)
    started = time.monotonic()
    results = run_rollouts(settings, env, sys.stdout)
    print(summary(results, time.monotonic() - started), flush=True)
    print(f"wrote {len(results)} rollouts to {settings.out}", flush=True)
    return 0 if all(r.error is None for r in results) else 1
