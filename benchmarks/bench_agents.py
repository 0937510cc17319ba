"""Does an agent learn a tool-use task through orl? Rollout groups, step rewards, group advantages, held-out success.

Starts the stack `orl up` would start (server, pipeline, trainer) with `--method binary
--reward-rule step_outcome --group-advantage`, then for each step: `orl rollout`'s runner plays
--tasks training tasks of the environment, --group-size times each (one group per task); every
model call is a step whose reward is 0.5 * its process score + 0.5 * the task's verdict,
normalised per step index within its group (pipeline/processors/group_advantage.py); once every
step is decided the trainer is asked to step on them (SIGUSR1, trainer/flush_request.py) and the
server to serve the result. Every --eval-every steps, --eval-tasks held-out tasks are played
--eval-samples times each as side turns (recorded, never trained on) and scored by the
environment's verifier. Without a judge endpoint the process judge is the `reaction` rule (the
verdict where there is one, else keywords of a user's reply: 0 for a tool result), so the signal
is mostly the outcome.

    .venv/bin/python benchmarks/bench_agents.py --env tool --steps 16 --out /tmp/agents

Prints one line per step and writes results.md, results.json and learning_curve.png to --out: success at every
evaluation with its 95% Wilson interval, the training rollouts' success per step, and timings,
with the machine (CPU model, flags) and its load. The committed table: docs/agents.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from orl.connectors.environment.episode import load_environment

from orl.demo.run import sample_counts, trained_counts
from orl.demo.session_driver import DemoClient, Sampling
from orl.rollout import RolloutResult, RolloutSettings, run_rollouts, wilson_interval
from orl.up import Supervisor, UpSettings, component_env, stack_keys, stack_launches

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_learning import cpu_flags, cpu_model  # noqa: E402

FLUSH_EVERY_S = 10.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default="tool_result", help="Environment (orl rollout --env).")
    parser.add_argument("--steps", type=int, default=16, help="Training steps (one round of rollouts each).")
    parser.add_argument("--tasks", type=int, default=4, help="Training tasks per round (one group each).")
    parser.add_argument("--group-size", type=int, default=8, help="Rollouts per training task.")
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--eval-tasks", type=int, default=24, help="Held-out tasks per evaluation.")
    parser.add_argument("--eval-samples", type=int, default=2, help="Rollouts per held-out task.")
    parser.add_argument("--max-steps", type=int, default=2, help="Model calls per rollout at most.")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--force-tool", action="store_true", help="Force the task's first tool on step one.")
    parser.add_argument("--lr", type=float, default=5e-4, help="LoRA learning rate.")
    parser.add_argument("--step-weight", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--port", type=int, default=8031)
    parser.add_argument("--out", type=Path, default=Path("/tmp/orl-bench-agents"))
    parser.add_argument("--step-timeout-s", type=float, default=1800.0)
    parser.add_argument(
        "--patience",
        type=int,
        default=8,
        help="Stop after this many rounds in a row without signal (all groups alike).",
    )
    return parser.parse_args()


def rollout_settings(args: argparse.Namespace, api_key: str, **changes: Any) -> RolloutSettings:
    base = RolloutSettings(
        env=args.env,
        tasks=args.tasks,
        group_size=args.group_size,
        concurrency=4,
        split="train",
        seed=args.seed,
        server_url=f"http://127.0.0.1:{args.port}/v1",
        api_key=api_key,
        model="orl-policy",
        max_steps=args.max_steps,
        max_tokens=args.max_tokens,
        temperature=1.0,
        force_tool=args.force_tool,
        out=args.out / "rollouts.jsonl",
    )
    return replace(base, **changes)


def success(results: list[RolloutResult]) -> dict[str, Any]:
    wins = sum(result.reward is not None and result.reward > 0 for result in results)
    low, high = wilson_interval(wins, len(results))
    return {"success": wins / max(1, len(results)), "low": low, "high": high, "n": len(results)}


class Run:
    """One stack and its loop: rounds of rollouts, training steps, evaluations."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.namespace = f"agents-s{args.seed}"
        data_dir = args.out / "data"
        self.up = UpSettings(
            data_dir=data_dir, namespace=self.namespace, port=args.port, method="binary", judge="reaction",
            reward_rule="step_outcome", group_advantage=True, run_id=self.namespace, batch_size=100_000,
            gate=False,  # the benchmark's rollouts are its evaluation
        )  # fmt: skip
        env = {
            **component_env(self.up),
            "ORL_TRAIN_LR": str(args.lr),
            "ORL_TRAIN_SEED": str(args.seed),
            "ORL_SERVED_MODEL_NAME": "orl-policy",
            "ORL_STEP_WEIGHT": str(args.step_weight),
            "ORL_GROUP_TIMEOUT_S": "120",
        }
        self.supervisor = Supervisor(stack_launches(self.up, env), data_dir / "logs" / self.namespace)
        keys = stack_keys(self.up)
        self.api_key = keys.api_key
        self.client = DemoClient(f"http://127.0.0.1:{args.port}", keys.api_key, keys.admin_key, Sampling())
        self.environment = load_environment(args.env)

    def rollouts(self, label: str, **changes: Any) -> list[RolloutResult]:
        settings = rollout_settings(self.args, self.api_key, out=self.args.out / f"{label}.jsonl", **changes)
        with open(os.devnull, "w") as quiet:
            return run_rollouts(settings, self.environment, quiet)

    async def evaluate(self) -> dict[str, Any]:
        results = await asyncio.to_thread(
            self.rollouts, f"eval-v{await self.client.policy_version()}", split="eval",
            tasks=self.args.eval_tasks, group_size=self.args.eval_samples, seed=10_000, turn_type="side",
        )  # fmt: skip
        return success(results)

    async def train_round(self, round_: int, version: int) -> dict[str, Any]:
        """One round of training rollouts; if any step of it got a non-zero reward, one training step
        on them (the server then serves version + 1); a round of zero-variance groups trains nothing."""
        deadline = time.monotonic() + self.args.step_timeout_s
        ready_before, decided_before = await sample_counts(self.up, self.namespace)
        started = time.monotonic()
        results = await asyncio.to_thread(
            self.rollouts, f"train-{round_}", seed=self.args.seed * 1000 + round_
        )
        expected = decided_before + sum(len(result.turn_ids) for result in results)
        while (decided := await sample_counts(self.up, self.namespace))[1] < expected:
            self._check(deadline, "waiting for the round's samples")
            await asyncio.sleep(0.5)
        summary = {**success(results), "version": version, "samples": decided[0] - ready_before, "kl": None}
        if decided[0] == ready_before:
            return summary | {"seconds": time.monotonic() - started}
        asked_s = 0.0
        while (trained := await trained_counts(self.up, self.namespace))[1] <= version:
            self._check(deadline, "waiting for the trainer")
            if time.monotonic() - asked_s > FLUSH_EVERY_S:
                self.supervisor.signal("train", signal.SIGUSR1)  # step on the round's samples, however few
                asked_s = time.monotonic()
            await asyncio.sleep(0.5)
        while await self.client.policy_version() < trained[1]:
            self._check(deadline, "waiting for the hot swap")
            await asyncio.sleep(0.5)
        return summary | {"version": trained[1], "kl": trained[2], "seconds": time.monotonic() - started}

    def _check(self, deadline: float, what: str) -> None:
        self.supervisor.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up {what} after {self.args.step_timeout_s:.0f} s")

    async def run(self) -> dict[str, Any]:
        """Rounds until --steps training steps, 3x as many rounds, or --patience rounds in a row without
        signal (every group all right or all wrong: nothing left to learn from); evaluations every
        --eval-every steps and at the end."""
        self.supervisor.start_all()
        try:
            await self.client.wait_ready()
            evaluations = {0: await self.evaluate()}
            print(f"step 0: held-out success {_rate(evaluations[0])}", flush=True)
            rounds: list[dict[str, Any]] = []
            version, quiet = 0, 0
            while (
                version < self.args.steps and len(rounds) < 3 * self.args.steps and quiet < self.args.patience
            ):
                round_ = await self.train_round(len(rounds) + 1, version)
                rounds.append(round_)
                trained = round_["version"] > version
                version, quiet = round_["version"], 0 if trained else quiet + 1
                line = (
                    f"round {len(rounds)}: training rollouts {_rate(round_)}, {round_['samples']} samples, "
                    f"{'step ' + str(version) if trained else 'no signal, no step'}, {round_['seconds']:.0f} s"
                )
                if trained and (version % self.args.eval_every == 0 or version == self.args.steps):
                    evaluations[version] = await self.evaluate()
                    line += f"; held-out success {_rate(evaluations[version])}"
                print(line, flush=True)
            if version not in evaluations:
                evaluations[version] = await self.evaluate()
                print(f"end, v{version}: held-out success {_rate(evaluations[version])}", flush=True)
            return {"evaluations": evaluations, "rounds": rounds}
        finally:
            await self.client.close()
            self.supervisor.stop()


def _rate(result: dict[str, Any]) -> str:
    return f"{result['success']:.2f} [{result['low']:.2f}, {result['high']:.2f}] (n={result['n']})"


def report(args: argparse.Namespace, results: dict[str, Any], seconds: float, load: tuple[float, ...]) -> str:
    rounds = results["rounds"]
    lines = [
        f"`{' '.join(sys.argv)}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{cpu_model()} ({cpu_flags()}), load {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end; "
        f"{seconds / 60:.0f} min, {len(rounds)} rounds of {args.tasks} x {args.group_size} rollouts.",
        "",
        "| policy version (training steps) | held-out success [95% CI] |",
        "| ---: | --- |",
        *(f"| {version} | {_rate(result)} |" for version, result in sorted(results["evaluations"].items())),
        "",
        "| round | training rollouts' success | samples | policy after | KL | seconds |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for index, round_ in enumerate(rounds, start=1):
        kl = "" if round_["kl"] is None else f"{round_['kl']:.4f}"
        lines.append(
            f"| {index} | {_rate(round_)} | {round_['samples']} | v{round_['version']} | {kl} | {round_['seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Held-out success per policy version (95% intervals) and the training rollouts' success per round."""
    figure = Figure(figsize=(7, 3.6))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    versions = sorted(results["evaluations"])
    rates = [results["evaluations"][v] for v in versions]
    axes.errorbar(
        versions, [r["success"] for r in rates],
        yerr=[[max(0.0, r["success"] - r["low"]) for r in rates], [max(0.0, r["high"] - r["success"]) for r in rates]],
        marker="o", capsize=3, label="held-out tasks (95% CI)",
    )  # fmt: skip
    trained = [r for r in results["rounds"] if r["kl"] is not None]
    axes.plot(
        [r["version"] - 1 for r in trained], [r["success"] for r in trained], "x:", label="training rollouts"
    )
    axes.set_xlabel("policy version (training steps)")
    axes.set_ylabel("task success")
    axes.set_ylim(0, 1)
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = asyncio.run(Run(args).run())
    text = report(args, results, time.monotonic() - started, os.getloadavg())
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "results.md").write_text(text)
    plot(results, args.out / "learning_curve.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
