"""The loop on one machine, not a part: serve + pipeline + train together, with simulated users.

Usage: python -m benchmarks.bench_loop [--batch-size 8] [--cores 0] [--precision auto]
       [--data-dir DIR] [--port 8031]

Starts the stack `orl demo` starts (embedded log, rule judges, Combined, LoRA) with the compute
budget `orl up` chooses, and measures in one run:

1. the server's generated tokens/s with nothing else computing ("idle": waves of 8 concurrent
   side turns of up to 48 tokens, never trained on);
2. the wall time of one demo step: a round of `--batch-size` student sessions, their samples, a
   training step, the checkpoint and its hot swap (the server is idle while the trainer steps);
3. a second demo step during which a client keeps the server generating: the server's tokens/s in
   the waves that ran wholly inside the training step, and the trainer's tokens/s for that step;
4. then, with the server and pipeline stopped, `orl train` alone on the same samples (a new run
   from the base model, the same batches): the trainer's tokens/s per step alone.

Prints the machine (CPU model and flags that matter, cores, load) and a markdown table; the results
are in benchmarks/RESULTS-loop.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from connectors.compute import available_cores, choose_numerics, cpu_flags
from connectors.event_log.factory import open_event_log
from connectors.event_log.reading import read_to_end
from orl.demo.run import (
    DemoSettings,
    DemoStack,
    _prompt_stream,
    run_round,
    start_stack,
    train_one_step,
    up_settings,
    wait_for_training,
)
from orl.demo.scenarios import get_scenario
from orl.up import component_env, compute_budget
from schemas.codec import decode
from schemas.topics import topic_name

WAVE_CONCURRENCY = 8
WAVE_MAX_TOKENS = 48
WAVE_PROMPTS = [
    "Tell me a long story about a lighthouse keeper and a storm.",
    "Describe the water cycle in detail, step by step.",
    "Explain how a steam engine works to a curious child.",
    "Write a long letter to a friend about a trip to the mountains.",
]


@dataclass
class Wave:
    started_s: float
    ended_s: float
    tokens: int
    trainer_busy_at_start: bool
    trainer_busy_at_end: bool


@dataclass
class Waves:
    waves: list[Wave] = field(default_factory=list)

    def rate(self, during_training: bool) -> tuple[float, int]:
        """(tokens/s, number of waves) over the waves wholly inside (or wholly outside) a training step."""
        chosen = [
            w
            for w in self.waves
            if w.trainer_busy_at_start == during_training and w.trainer_busy_at_end == during_training
        ]
        seconds = sum(w.ended_s - w.started_s for w in chosen)
        return (sum(w.tokens for w in chosen) / seconds if seconds else float("nan")), len(chosen)


def trainer_busy(stack: DemoStack) -> bool:
    """The trainer's mark on the core board: it is computing a step right now."""
    process = stack.supervisor.processes.get("train")
    return process is not None and (stack.up.data_dir / "cores" / f"{process.pid}.busy").exists()


async def one_wave(stack: DemoStack, index: int) -> Wave:
    started, busy_start = time.perf_counter(), trainer_busy(stack)
    headers = {"X-Turn-Type": "side"}
    answers = await asyncio.gather(
        *(
            stack.client.chat_usage(
                [{"role": "user", "content": WAVE_PROMPTS[(index + i) % len(WAVE_PROMPTS)]}],
                headers,
                seed=1000 * index + i,
                max_tokens=WAVE_MAX_TOKENS,
            )
            for i in range(WAVE_CONCURRENCY)
        )
    )
    return Wave(started, time.perf_counter(), sum(answers), busy_start, trainer_busy(stack))


async def generate_until(stack: DemoStack, stop: asyncio.Event, waves: Waves, first_index: int) -> None:
    index = first_index
    while not stop.is_set():
        waves.waves.append(await one_wave(stack, index))
        index += 1


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
        "ORL_TRAIN_MAX_STEPS": str(steps),
        "ORL_TRAIN_BATCH_SIZE": str(batch_size),
        "ORL_TRAIN_PARTIAL_BATCH_AFTER_S": "2",
        "ORL_TRAIN_LR": stack.supervisor.env["ORL_TRAIN_LR"],
        "ORL_TRAIN_TEMPERATURE": stack.supervisor.env["ORL_TRAIN_TEMPERATURE"],
        "ORL_TRAIN_SEED": stack.supervisor.env["ORL_TRAIN_SEED"],
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
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    flags = cpu_flags() or frozenset()
    shown = sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "bf16"})
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{model}; flags {' '.join(shown) or 'none of avx2/avx512/bf16'}; {available_cores()} cores; load {load}"


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
    )
    namespace = f"bench-loop-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"machine: {machine_line()}", flush=True)
    print(compute_budget(up_settings(settings, "combined", namespace))[1], flush=True)
    stack = await start_stack(settings, "combined", namespace)
    prompts = _prompt_stream(scenario, settings.seed)
    waves = Waves()
    try:
        for index in range(2):  # the server alone (nothing trains yet)
            waves.waves.append(await one_wave(stack, index))
        started = time.perf_counter()
        print("  step 1:", await train_one_step(settings, scenario, stack, 1, prompts), flush=True)
        step_wall_s = time.perf_counter() - started
        round_ = await run_round(settings, scenario, stack, 2, prompts)
        stop = asyncio.Event()
        background = asyncio.create_task(generate_until(stack, stop, waves, 100))
        try:
            print("  step 2:", await wait_for_training(stack, round_, time.monotonic() + 1800), flush=True)
        finally:
            stop.set()
            await background
        in_stack = await train_steps(stack, namespace)
    finally:
        await stack.close()
    alone_run = f"{namespace}-alone"
    trainer_alone(stack, alone_run, len(in_stack), args.batch_size)
    alone = await train_steps(stack, alone_run)
    report(machine_line(), waves, step_wall_s, in_stack, alone)


def report(machine: str, waves: Waves, step_wall_s: float, in_stack: list[dict], alone: list[dict]) -> None:
    idle_rate, idle_n = waves.rate(during_training=False)
    busy_rate, busy_n = waves.rate(during_training=True)
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
        f"| server generated tokens/s while a step trains ({busy_n} waves) vs idle ({idle_n} waves) "
        f"| {busy_rate:.1f} | {idle_rate:.1f} | {busy_rate / idle_rate:.2f} | >= 0.5 |"
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
