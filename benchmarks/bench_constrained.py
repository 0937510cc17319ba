"""Decode speed with and without constrained decoding (response_format json_schema), side by side.

Usage: python -m benchmarks.bench_constrained [--cache-dir DIR] [--max-tokens 64] [--rounds 3]
On the in-process transformers backend (SmolLM2-135M), at 1 and 8 concurrent requests, alternates
rounds of plain and constrained requests (the same prompts and seeds) and prints each mode's decode
throughput in tokens per second. A constrained reply may end sooner (the JSON is complete), so
the comparison is per token: the mask's cost is what the tokens/s ratio shows. The schema holds one
free string so that constrained replies run long too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch
from orl.compute.machine import choose_numerics
from orl.connectors.model_files import DEFAULT_MODEL, resolve_model
from orl.serving.policy.base import SamplingParams
from orl.serving.policy.transformers_backend import TransformersBackend

from benchmarks.bench_policy import PROMPTS

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "text": {"type": "string"}},
    "required": ["title", "text"],
    "additionalProperties": False,
}
CONSTRAINT = json.dumps({"type": "json_schema", "json_schema": {"name": "essay", "schema": SCHEMA}})


async def one_round(
    backend: TransformersBackend, concurrency: int, max_tokens: int, seed: int, constrained: bool
) -> tuple[int, float]:
    """(tokens decoded, wall seconds) of `concurrency` requests at once."""
    prompts = [
        backend.chat_template.render([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        for i in range(concurrency)
    ]
    params = [
        SamplingParams(
            temperature=0.7,
            max_tokens=max_tokens,
            seed=seed + i,
            constraint=CONSTRAINT if constrained else None,
        )
        for i in range(concurrency)
    ]
    started = time.perf_counter()
    gens = await asyncio.gather(*[backend.generate(p, s) for p, s in zip(prompts, params, strict=True)])
    return sum(len(g.token_ids) for g in gens), time.perf_counter() - started


async def main(cache_dir: Path, max_tokens: int, rounds: int) -> None:
    model_dir = resolve_model(DEFAULT_MODEL, cache_dir)
    numerics = choose_numerics("auto")
    backend = TransformersBackend(model_dir, autocast_dtype=numerics.autocast_dtype)
    await backend.start()
    results: dict[tuple[int, bool], list[tuple[int, float]]] = {}
    try:
        for constrained in (False, True):  # warm-up, and the tokenizer's grammar tables
            await one_round(backend, 1, 8, 0, constrained)
        for concurrency in (1, 8):
            for r in range(rounds):
                for constrained in (False, True) if r % 2 == 0 else (True, False):
                    run = await one_round(backend, concurrency, max_tokens, 100 * r, constrained)
                    results.setdefault((concurrency, constrained), []).append(run)
    finally:
        await backend.close()
    print(
        f"transformers backend, SmolLM2-135M, {numerics.precision} ({numerics.reason}), "
        f"{torch.get_num_threads()} threads, max_tokens {max_tokens}, {rounds} rounds per mode, alternating"
    )
    print(f"{'concurrency':>11} {'mode':>11} {'tokens':>7} {'wall s':>7} {'tok/s':>7} {'vs plain':>8}")
    for concurrency in (1, 8):
        plain = None
        for constrained in (False, True):
            runs = results[(concurrency, constrained)]
            tokens, wall = sum(t for t, _ in runs), sum(w for _, w in runs)
            speed = tokens / wall
            plain = plain or speed
            mode = "json_schema" if constrained else "plain"
            print(
                f"{concurrency:>11} {mode:>11} {tokens:>7} {wall:>7.1f} {speed:>7.1f} {speed / plain:>8.2f}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir", type=Path, default=Path("~/.cache/orl-test"), help="where the converted model lives"
    )
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per response at most")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode and concurrency")
    args = parser.parse_args()
    asyncio.run(main(args.cache_dir.expanduser(), args.max_tokens, args.rounds))
