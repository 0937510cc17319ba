"""Decode under bf16 autocast with fp32 Linear weights (what the server runs today) against the same
autocast with the transformer body's Linear weights cast to bf16 once.

Usage: python -m benchmarks.bench_decode_weights [--threads 2] [--steps 24] [--rows 1,16] [--repeats 2]

Loads SmolLM2-135M-Instruct from the model cache (converting it on first use), prefills 50 random
tokens per row, then decodes greedily for `--steps` steps with each model and prints ms per decode
step and the largest absolute difference between their fp32 logits. Autocast casts a Linear's
weight to bf16 at every call, so a weight that is already bf16 gives the same product without the
cast: the difference should be 0. Needs a CPU with native bf16 to mean anything (see bench_numerics).
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from orl.compute.machine import describe_machine
from orl.connectors.model_files import DEFAULT_MODEL, resolve_model
from orl.connectors.settings import ConnectionSettings
from orl.serving.policy.batch_engine import hidden_states, lm_logits
from transformers import AutoModelForCausalLM, DynamicCache


def with_bf16_linear_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose transformer body's Linear weights are bf16; norms, embeddings and the head stay fp32."""
    copied = copy.deepcopy(model)
    for module in copied.model.modules():  # type: ignore[union-attr]
        if isinstance(module, torch.nn.Linear):
            module.weight.data = module.weight.data.to(torch.bfloat16)
    return copied


def decode(model: torch.nn.Module, rows: int, steps: int) -> tuple[float, torch.Tensor]:
    """ms per decode step, and the fp32 logits of every step [steps + 1, rows, vocab], computed as the
    server's batch engine computes them (`hidden_states` under bf16 autocast, then `lm_logits`)."""
    prompt = torch.randint(0, 5000, (rows, 50), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)  # type: ignore[union-attr]
        hidden = hidden_states(model, torch.bfloat16, input_ids=prompt, past_key_values=cache, use_cache=True)
        logits = [lm_logits(model, hidden[:, -1, :])]
        started = time.perf_counter()
        for _ in range(steps):
            next_ids = logits[-1].argmax(-1, keepdim=True)
            hidden = hidden_states(
                model, torch.bfloat16, input_ids=next_ids, past_key_values=cache, use_cache=True
            )
            logits.append(lm_logits(model, hidden[:, -1, :]))
        return (time.perf_counter() - started) / steps * 1000, torch.stack(logits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rows", default="1,16", help="batch sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--cache-dir", type=Path, default=ConnectionSettings().model_cache_dir)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model(DEFAULT_MODEL, args.cache_dir), dtype=torch.float32
    )
    model.eval()
    cast = with_bf16_linear_weights(model)
    print(f"{describe_machine()}; {torch.get_num_threads()} threads; {args.steps} decode steps")
    print("rows | fp32 Linear weights ms/step | bf16 Linear weights ms/step | max |logit difference|")
    for rows in (int(r) for r in args.rows.split(",")):
        for _ in range(args.repeats):
            today_ms, today = decode(model, rows, args.steps)
            cast_ms, casted = decode(cast, rows, args.steps)
            print(f"{rows} | {today_ms:.0f} | {cast_ms:.0f} | {float((today - casted).abs().max()):.3g}")


if __name__ == "__main__":
    main()
