"""Time to first token of an OpenClaw-sized conversation with the transformers backend's prefix cache on and off.

Usage: python -m benchmarks.bench_prefix_cache [--cache-dir DIR] [--system-reps 600] [--turns 3]
       [--max-tokens 8] [--precision auto] [--threads N]
Two backends (cache on, cache off) are loaded side by side and given the same requests turn by turn,
alternating which goes first, so both see the same machine load. Each request resends the whole
conversation as OpenClaw does: a long system prompt, the history, 12 tools and a trailing
internal-context message that the next request drops. Prints the CPU (model, bf16 flags), the load
average, and per turn the prompt tokens, the tokens actually prefilled, the time to first token and
how far the sampled logprobs of the two backends differ.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orl.compute.machine import choose_numerics
from orl.connectors.model_files import DEFAULT_MODEL, resolve_model
from orl.schemas.numerics import PRECISIONS
from orl.serving.policy.base import Generation, SamplingParams
from orl.serving.policy.transformers_backend import TransformersBackend

from tests.unit.openclaw_requests import TOOLS, internal_context, user

QUESTIONS = [
    "Look at the files in my project and tell me what it does.",
    "Which module is the largest, and why?",
    "Write a one-line summary I can paste into the README.",
]


@dataclass(frozen=True)
class Measured:
    prompt_tokens: int
    computed_tokens: int
    reused_tokens: int
    ttft_s: float
    generation: Generation


async def first_token(backend: TransformersBackend, ids: list[int], params: SamplingParams) -> Measured:
    before = backend.prefill_token_counts
    started = time.perf_counter()
    stream = backend.generate_stream(ids, params)
    await stream.__anext__()
    ttft = time.perf_counter() - started
    gen = await stream.result()
    after = backend.prefill_token_counts
    return Measured(
        len(ids),
        after["computed"] - before["computed"],
        after["reused"] - before["reused"],
        ttft,
        gen,
    )


def cpu_line() -> str:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    wanted = [f for f in flags if "bf16" in f or f.startswith("amx") or f in ("avx2", "avx512f")]
    return f"{fields.get('Model name', '?').strip()}, {os.cpu_count()} cores, flags: {' '.join(wanted) or 'none'}"


def load_line() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


async def conversation(
    backends: dict[str, TransformersBackend], reps: int, turns: int, max_tokens: int
) -> None:
    template = backends["on"].chat_template
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a personal assistant running inside OpenClaw. " * reps}
    ]
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    print(
        f"{'turn':>4} {'cache':>5} {'prompt':>6} {'prefilled':>9} {'reused':>6} {'TTFT s':>7} {'max |dlogp|':>11}"
    )
    for turn in range(turns):
        history.append(user(QUESTIONS[turn % len(QUESTIONS)]))
        ids = template.render([*history, internal_context(turn)], TOOLS)
        order = ["on", "off"] if turn % 2 == 0 else ["off", "on"]
        measured = {name: await first_token(backends[name], ids, params) for name in order}
        on, off = measured["on"].generation, measured["off"].generation
        same = on.token_ids == off.token_ids
        worst = max(abs(a - b) for a, b in zip(on.logprobs, off.logprobs, strict=False))
        for name in ("off", "on"):
            m = measured[name]
            print(
                f"{turn + 1:>4} {name:>5} {m.prompt_tokens:>6} {m.computed_tokens:>9} {m.reused_tokens:>6} "
                f"{m.ttft_s:>7.2f} {worst:>11.2e}{'' if same else '  (tokens differ)'}"
            )
        history.append({"role": "assistant", "content": on.text})


async def main(
    cache_dir: Path, reps: int, turns: int, max_tokens: int, precision: str, threads: int | None
) -> None:
    model_dir = resolve_model(DEFAULT_MODEL, cache_dir)
    numerics = choose_numerics(precision)
    backends = {
        name: TransformersBackend(
            model_dir, autocast_dtype=numerics.autocast_dtype, num_threads=threads, prefix_cache_bytes=size
        )
        for name, size in (("on", 1 << 30), ("off", 0))
    }
    for backend in backends.values():
        await backend.start()
    try:
        print(cpu_line())
        print(
            f"SmolLM2-135M, {numerics.precision} ({numerics.reason}), max_tokens {max_tokens}; {load_line()}"
        )
        for backend in backends.values():  # warm-up
            await backend.generate(backend.chat_template.render([user("Hi")]), SamplingParams(max_tokens=2))
        await conversation(backends, reps, turns, max_tokens)
        entries, nbytes = backends["on"].prefix_cache_size
        print(f"prefix cache after: {entries} prompt(s), {nbytes / 2**20:.0f} MiB; {load_line()}")
    finally:
        for backend in backends.values():
            await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir", type=Path, default=Path("~/.cache/orl-test"), help="where the converted model lives"
    )
    parser.add_argument("--system-reps", type=int, default=600, help="repeats of a 10-token system sentence")
    parser.add_argument("--turns", type=int, default=3, help="requests in the conversation")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per response")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument(
        "--precision", default="auto", choices=PRECISIONS, help="auto: bf16 only where native"
    )
    args = parser.parse_args()
    asyncio.run(
        main(args.cache_dir, args.system_reps, args.turns, args.max_tokens, args.precision, args.threads)
    )
