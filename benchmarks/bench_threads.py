"""How two torch processes share one machine's cores: the alternatives behind `orl.compute.machine`.

Usage: python -m benchmarks.bench_threads [--seconds 40] [--cache-dir ~/.cache/orl/models]

Runs a trainer-like process (SmolLM2-135M forward + backward on 4 x 128 tokens, over and over) and
a server-like process (the transformers backend generating 8 concurrent 64-token answers, wave
after wave) first each alone with every core, then both at once under each policy: torch threads
per process and the OpenMP wait policy (ACTIVE spins after each parallel region, PASSIVE sleeps).
Prints each side's tokens/s and its ratio to alone. Numerics follow `--precision` (auto: the
machine's choice). The chosen policy (fair share on the core board, PASSIVE) is what `orl up` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from orl.compute.machine import available_cores, choose_numerics


def train_loop(model_dir: Path, threads: int, seconds: float, precision: str) -> str:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(100, 20000, (4, 128), generator=torch.Generator().manual_seed(0))
    autocast = choose_numerics(precision).autocast
    started, tokens = time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids).logits
        logits.float().log_softmax(-1).mean().backward()
        tokens += ids.numel()
    return f"{tokens / (time.perf_counter() - started):.1f}"


def generate_loop(model_dir: Path, threads: int, seconds: float, precision: str) -> str:
    from orl.serving.policy.base import SamplingParams
    from orl.serving.policy.transformers_backend import TransformersBackend

    async def run() -> str:
        backend = TransformersBackend(
            model_dir, autocast_dtype=choose_numerics(precision).autocast_dtype, num_threads=threads
        )
        await backend.start()
        try:
            prompt = backend.chat_template.render([{"role": "user", "content": "Tell me a long story."}])
            await backend.generate(prompt, SamplingParams(max_tokens=4))
            started, tokens, wave = time.perf_counter(), 0, 0
            while time.perf_counter() - started < seconds:
                params = [
                    SamplingParams(temperature=0.7, max_tokens=64, seed=100 * wave + i) for i in range(8)
                ]
                answers = await asyncio.gather(*(backend.generate(prompt, p) for p in params))
                tokens += sum(len(a.token_ids) for a in answers)
                wave += 1
            return f"{tokens / (time.perf_counter() - started):.1f}"
        finally:
            await backend.close()

    return asyncio.run(run())


def child(args: argparse.Namespace) -> None:
    loop = train_loop if args.child == "train" else generate_loop
    print("RESULT", loop(args.model_dir, args.threads, args.seconds, args.precision), flush=True)


def start(side: str, threads: int, wait_policy: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    env = {**os.environ, "OMP_WAIT_POLICY": wait_policy, "TRANSFORMERS_VERBOSITY": "error"}
    command = [sys.executable, "-m", "benchmarks.bench_threads", "--child", side, "--threads", str(threads)]
    command += [
        "--seconds",
        str(args.seconds),
        "--model-dir",
        str(args.model_dir),
        "--precision",
        args.precision,
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def result(process: subprocess.Popen[str]) -> float:
    out, _ = process.communicate()
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    return float(line.split()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=40.0, help="how long each side runs per policy")
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/orl/models"))
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from orl.connectors.model_files import DEFAULT_MODEL, resolve_model

    args.model_dir = resolve_model(DEFAULT_MODEL, args.cache_dir.expanduser())
    cores = available_cores()
    half = max(1, cores // 2)
    numerics = choose_numerics(args.precision)
    print(f"{cores} cores, numerics {numerics.precision} ({numerics.reason}), load {os.getloadavg()[0]:.2f}")
    alone_train = result(start("train", cores, "PASSIVE", args))
    alone_gen = result(start("generate", cores, "PASSIVE", args))
    print(
        "| trainer threads | server threads | OpenMP wait | trainer tok/s | x alone | server tok/s | x alone |"
    )
    print("|---|---|---|---|---|---|---|")
    print(f"| {cores} (alone) | - | PASSIVE | {alone_train:.1f} | 1.00 | | |")
    print(f"| - | {cores} (alone) | PASSIVE | | | {alone_gen:.1f} | 1.00 |")
    policies = [
        (cores, cores, "ACTIVE"),
        (cores, cores, "PASSIVE"),
        (cores, half, "PASSIVE"),
        (half, half, "PASSIVE"),
    ]
    for train_threads, gen_threads, wait in policies:
        trainer, server = (
            start("train", train_threads, wait, args),
            start("generate", gen_threads, wait, args),
        )
        train_rate, gen_rate = result(trainer), result(server)
        print(
            f"| {train_threads} | {gen_threads} | {wait} | {train_rate:.1f} | {train_rate / alone_train:.2f} "
            f"| {gen_rate:.1f} | {gen_rate / alone_gen:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
