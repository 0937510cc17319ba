"""The loop on one machine, not a part: serve + pipeline + train together, with simulated users.

Usage: python -m benchmarks.bench_loop [--batch-size 8] [--cores 0] [--precision auto]
       [--data-dir DIR] [--port 8031]

Starts the stack `orl demo` starts (embedded log, rule judges, Combined, LoRA) with the compute
budget `orl up` chooses, and measures in one run:

1. the server's generated tokens/s with nothing else computing ("idle": 8 client loops of side turns
   of up to 32 tokens, never trained on, for 20 s);
2. the wall time of one demo step: a round of `--batch-size` student sessions, their samples, a
   training step, the checkpoint and its hot swap (the server is idle while the trainer steps);
3. a second demo step during which the same clients keep the server generating: the server's
   tokens/s while the trainer computes the step (its core-board mark exists), and the trainer's
   tokens/s for that step;
4. then, with the server and pipeline stopped, `orl train` alone on the same samples (a new run
   from the base model, the same batches): the trainer's tokens/s per step alone.

Prints the machine (CPU model and flags that matter, cores, load) and a markdown table; the results
are in benchmarks/RESULTS-loop.md.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from orl.compute.machine import available_cores, choose_numerics, describe_machine
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.event_log.reading import read_to_end
from orl.schemas.codec import decode
from orl.schemas.topics import topic_name

from orl.demo.run import (
    DemoSettings,
    DemoStack,
    prompt_stream,
    run_round,
    start_stack,
    train_one_step,
    up_settings,
    wait_for_training,
)
from orl.demo.scenarios import get_scenario
from orl.up import component_env, compute_budget

CLIENTS = 8  # concurrent client loops, each sending its next request as soon as one is answered
MAX_TOKENS = 32  # short answers, so a window's edges cut few requests
WARM_UP_S = 2.0  # requests finishing this soon after a window opens started before it
PROMPTS = [
    "Tell me a long story about a lighthouse keeper and a storm.",
    "Describe the water cycle in detail, step by step.",
    "Explain how a steam engine works to a curious child.",
    "Write a long letter to a friend about a trip to the mountains.",
]


@dataclass
class Load:
    """Clients keeping the server generating (side turns, never trained on); answers with their times."""

    stack: DemoStack
    answers: list[tuple[float, int]] = field(default_factory=list)  # (finished at, tokens)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _client(self, index: int) -> None:
        request = 0
        while not self._stop.is_set():
            tokens = await self.stack.client.chat_usage(
                [{"role": "user", "content": PROMPTS[(index + request) % len(PROMPTS)]}],
                {"X-Turn-Type": "side"},
                seed=1000 * index + request,
                max_tokens=MAX_TOKENS,
            )
            self.answers.append((time.perf_counter(), tokens))
            request += 1

    async def run_until(self, done: asyncio.Event) -> None:
        clients = [asyncio.create_task(self._client(i)) for i in range(CLIENTS)]
        await done.wait()
        self._stop.set()
        await asyncio.gather(*clients)

    def rate(self, start_s: float, end_s: float) -> float:
        """Generated tokens/s over the answers finished in [start + warm-up, end]."""
        start_s += WARM_UP_S
        tokens = sum(n for at, n in self.answers if start_s <= at <= end_s)
        return tokens / (end_s - start_s) if end_s > start_s else float("nan")


async def trainer_busy_window(stack: DemoStack, done: asyncio.Event) -> tuple[float, float]:
    """The first interval during which the trainer's core-board mark existed (it computed a step)."""
    process = stack.supervisor.processes["train"]
    mark = stack.up.data_dir / "cores" / f"{process.pid}.busy"
    started = ended = float("nan")
    while not done.is_set():
        now, busy = time.perf_counter(), mark.exists()
        if busy and math.isnan(started):
            started = now
        if not busy and not math.isnan(started) and math.isnan(ended):
            ended = now
        await asyncio.sleep(0.05)
    return started, ended


async def idle_rate(stack: DemoStack, seconds: float) -> float:
    load, done = Load(stack), asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(load.run_until(done))
    await asyncio.sleep(seconds)
    done.set()
    await task
    return load.rate(started, time.perf_counter())


async def train_steps(stack: DemoStack, run_id: str) -> list[dict]:
    async with open_event_log(stack.up.effective_log_url()) as log:
        records = await read_to_end(log, topic_name(stack.namespace, "train_steps"))
    events = [decode(r.value) for r in records]
    return sorted((e for e in events if e["run_id"] == run_id), key=lambda e: int(e["step"]))


def trainer_alone(stack: DemoStack, run_id: str, steps: int, batch_size: int) -> None:
    """`orl train` on the stack's samples as a new run, with nothing else running; waits for it."""
    env = {
        **component_env(stack.up),
        "ORL_RUN_ID": run_id,
        "ORL_THREADS": str(available_cores()),  # alone means with the whole machine, whatever --cores
        "ORL_TRAIN_MAX_STEPS": str(steps),
        "ORL_TRAIN_BATCH_SIZE": str(batch_size),
        "ORL_TRAIN_PARTIAL_BATCH_AFTER_S": "2",
        "ORL_TRAIN_LR": stack.supervisor.launches["train"].env["ORL_TRAIN_LR"],
        "ORL_TRAIN_TEMPERATURE": stack.supervisor.launches["train"].env["ORL_TRAIN_TEMPERATURE"],
        "ORL_TRAIN_SEED": stack.supervisor.launches["train"].env["ORL_TRAIN_SEED"],
    }
    log_path = stack.up.data_dir / "logs" / f"{run_id}.log"
    with log_path.open("wb") as log:
        subprocess.run(
            [sys.executable, "-m", "orl.cli", "train"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )


def machine_line() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{describe_machine()}; load {load}"


async def run(args: argparse.Namespace) -> None:
    scenario = get_scenario("student")
    settings = DemoSettings(
        data_dir=args.data_dir,
        batch_size=args.batch_size,
        max_tokens=64,
        port=args.port,
        cores=args.cores,
        precision=args.precision,
        methods=("combined",),
        gate=False,  # the loop's own speed: the gate's cost is benchmarks/bench_gate.py's
    )
    namespace = f"bench-loop-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"machine: {machine_line()}", flush=True)
    print(compute_budget(up_settings(settings, "combined", namespace)), flush=True)
    stack = await start_stack(settings, "combined", namespace)
    prompts = prompt_stream(scenario, settings.seed)
    try:
        idle = await idle_rate(stack, 20.0)  # the server alone: nothing trains yet
        started = time.perf_counter()
        print("  step 1:", await train_one_step(settings, scenario, stack, 1, prompts), flush=True)
        step_wall_s = time.perf_counter() - started
        round_ = await run_round(settings, scenario, stack, 2, prompts)
        load, done = Load(stack), asyncio.Event()
        clients = asyncio.create_task(load.run_until(done))
        window = asyncio.create_task(trainer_busy_window(stack, done))
        try:
            print("  step 2:", await wait_for_training(stack, round_, time.monotonic() + 1800), flush=True)
        finally:
            done.set()
            await clients
        busy_start, busy_end = await window
        during = load.rate(busy_start, busy_end)
        in_stack = await train_steps(stack, namespace)
    finally:
        await stack.close()
    alone_run = f"{namespace}-alone"
    trainer_alone(stack, alone_run, len(in_stack), args.batch_size)
    alone = await train_steps(stack, alone_run)
    report(machine_line(), idle, during, step_wall_s, in_stack, alone)


def report(
    machine: str, idle: float, during: float, step_wall_s: float, in_stack: list[dict], alone: list[dict]
) -> None:
    alone_rate = sum(float(s["tokens"]) for s in alone) / sum(float(s["duration_s"]) for s in alone)
    first, second = (float(s["tokens_per_s"]) for s in in_stack[:2])
    numerics = choose_numerics("auto")
    print(f"\nmachine after the run: {machine}; numerics {numerics.precision}")
    print("| measure | in the stack | alone / idle | ratio | target |")
    print("|---|---|---|---|---|")
    print(
        f"| trainer tokens/s, step 1 (server idle) | {first:.0f} | {alone_rate:.0f} | {first / alone_rate:.2f} | |"
    )
    print(
        f"| trainer tokens/s, step 2 (server generating) | {second:.0f} | {alone_rate:.0f} "
        f"| {second / alone_rate:.2f} | >= 0.7 |"
    )
    print(
        f"| server generated tokens/s while step 2 trains vs idle ({CLIENTS} clients) "
        f"| {during:.1f} | {idle:.1f} | {during / idle:.2f} | >= 0.5 |"
    )
    print(
        f"| wall time of one demo step (round of sessions -> trained -> swapped) | {step_wall_s:.1f} s | | | |"
    )
    steps = ", ".join(f"{int(s['tokens'])} tokens in {float(s['duration_s']):.1f} s" for s in in_stack)
    alone_steps = ", ".join(f"{int(s['tokens'])} tokens in {float(s['duration_s']):.1f} s" for s in alone)
    print(f"\nsteps in the stack: {steps}; alone: {alone_steps}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8, help="sessions per round = samples per step")
    parser.add_argument("--cores", type=int, default=0, help="the stack's core budget (0: all available)")
    parser.add_argument("--precision", default="auto", help="auto | bf16 | fp32")
    parser.add_argument("--data-dir", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--port", type=int, default=8031)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # what `orl` sets for its processes
    if args.data_dir is None:
        with tempfile.TemporaryDirectory(prefix="orl-bench-loop-") as tmp:
            args.data_dir = Path(tmp)
            asyncio.run(run(args))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
