"""Throughput of the in-process transformers policy backend at 1 and 8 concurrent requests.

Usage: python -m benchmarks.bench_policy [--cache-dir DIR] [--max-tokens 64] [--rounds 2]
Converts SmolLM2-135M on first use (see orl.connectors.model_files), then for each concurrency level
runs `rounds` waves of concurrent chat requests and prints aggregate decode throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from orl.compute.machine import choose_numerics
from orl.connectors.model_files import DEFAULT_MODEL, resolve_model
from orl.schemas.numerics import PRECISIONS
from orl.serving.policy.base import Generation, SamplingParams
from orl.serving.policy.transformers_backend import TransformersBackend

PROMPTS = [
    "Explain how photosynthesis works.",
    "Write a short story about a lighthouse keeper.",
    "Describe the water cycle in detail.",
    "What are the causes of the French Revolution?",
    "How do I convert 3/4 to a percentage?",
    "Explain Newton's three laws of motion.",
    "Describe how a bill becomes a law.",
    "Why is the sky blue?",
]


@dataclass(frozen=True)
class Row:
    concurrency: int
    requests: int
    tokens: int
    wall_s: float
    mean_latency_ms: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


async def run_level(backend: TransformersBackend, concurrency: int, max_tokens: int, rounds: int) -> Row:
    gens: list[Generation] = []
    started = time.perf_counter()
    for r in range(rounds):
        prompts = [
            backend.chat_template.render([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
            for i in range(concurrency)
        ]
        params = [
            SamplingParams(temperature=0.7, max_tokens=max_tokens, seed=100 * r + i)
            for i in range(concurrency)
        ]
        gens += await asyncio.gather(*[backend.generate(p, s) for p, s in zip(prompts, params, strict=True)])
    wall = time.perf_counter() - started
    tokens = sum(len(g.token_ids) for g in gens)
    return Row(concurrency, len(gens), tokens, wall, sum(g.latency_ms for g in gens) / len(gens))


async def main(cache_dir: Path, max_tokens: int, rounds: int, precision: str, threads: int | None) -> None:
    model_dir = resolve_model(DEFAULT_MODEL, cache_dir)
    numerics = choose_numerics(precision)
    backend = TransformersBackend(model_dir, autocast_dtype=numerics.autocast_dtype, num_threads=threads)
    await backend.start()
    try:
        await run_level(backend, 1, 8, 1)  # warm-up
        rows = [await run_level(backend, c, max_tokens, rounds) for c in (1, 8)]
    finally:
        await backend.close()
    print(
        f"transformers backend, SmolLM2-135M, {numerics.precision} ({numerics.reason}), "
        f"{torch.get_num_threads()} threads, max_tokens {max_tokens}"
    )
    print(
        f"{'concurrency':>11} {'requests':>8} {'tokens':>7} {'wall s':>7} {'tok/s':>7} {'mean latency ms':>15}"
    )
    for row in rows:
        print(
            f"{row.concurrency:>11} {row.requests:>8} {row.tokens:>7} {row.wall_s:>7.1f} {row.tokens_per_s:>7.1f} {row.mean_latency_ms:>15.0f}"
        )
    print(f"batch sizes seen (decode steps per size): {dict(sorted(backend.batch_size_counts.items()))}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir", type=Path, default=Path("~/.cache/orl-test"), help="where the converted model lives"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per response")
    parser.add_argument("--rounds", type=int, default=2, help="waves of requests per concurrency level")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument(
        "--precision", default="auto", choices=PRECISIONS, help="auto: bf16 only where native"
    )
    args = parser.parse_args()
    asyncio.run(main(args.cache_dir, args.max_tokens, args.rounds, args.precision, args.threads))
