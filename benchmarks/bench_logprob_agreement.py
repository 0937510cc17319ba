"""Do the loop's three logprob paths agree on the same tokens? fp32 against bf16 autocast.

The OPD advantage subtracts numbers from two code paths: the teacher's logprobs come from the
server's scoring forward (POST /v1/orl/score, one full forward), the baseline from the logprobs the
server recorded while it sampled (incremental decoding with a KV cache, batched with other rows);
the trainer recomputes a third set. Any systematic gap between the paths reaches every token of an
OPD sample as if it were teacher signal. This script samples answers to the demo's training prompts
with the real model, scores the same tokens through the other two paths with NO hint (so the true
advantage is 0), and prints the gap per precision: mean (bias) and mean absolute (noise) per token.
With `--adapter` (a LoRA checkpoint folder the trainer wrote) the server serves that checkpoint and
the trainer's path is the trainer's own model (`orl.trainer.policy_model.load_policy` from the adapter):
the gap then also shows whether the server computes the policy the trainer trained.

    .venv/bin/python -m benchmarks.bench_logprob_agreement [--prompts 16] [--max-tokens 96] [--adapter DIR]

Loads the shipped SmolLM2-135M (converted once into the model cache); writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import torch
from orl.compute.machine import describe_machine
from orl.connectors.settings import ConnectionSettings
from orl.serving.policy.base import SamplingParams
from orl.serving.policy.transformers_backend import TransformersBackend
from orl.trainer.logprobs import response_logprobs
from orl.trainer.policy_model import load_policy

from orl.demo.scenarios import get_scenario
from orl.up import prepare_model_once


async def measure(
    model_dir: Path, precision: str, prompts: list[str], max_tokens: int, adapter: Path | None
) -> str:
    autocast = torch.bfloat16 if precision == "bf16" else None
    backend = TransformersBackend(model_dir, autocast_dtype=autocast)
    await backend.start()
    try:
        if adapter is not None:
            await backend.load_checkpoint(adapter, 1, "lora")
        template = backend.chat_template
        prompt_ids = [template.render([{"role": "user", "content": p}]) for p in prompts]
        params = [SamplingParams(temperature=0.7, max_tokens=max_tokens, seed=i) for i in range(len(prompts))]
        generations = await asyncio.gather(
            *(backend.generate(ids, p) for ids, p in zip(prompt_ids, params, strict=True))
        )
        rollout, scored = [], []
        for ids, generation in zip(prompt_ids, generations, strict=True):
            rollout.extend(generation.logprobs)
            scored.extend(await backend.score(ids, generation.token_ids, 0.7))
        if adapter is None:
            model = backend._served_base  # noqa: SLF001 - the served base model, for the trainer's path
        else:
            model = load_policy(model_dir, "lora", init_dir=adapter).module.eval()
        with torch.no_grad():
            recomputed_rows = response_logprobs(
                model,
                prompt_ids,
                [g.token_ids for g in generations],
                [0.7] * len(prompts),
                autocast is not None,
            )
        recomputed = [float(x) for row in recomputed_rows for x in row]
    finally:
        await backend.close()
    r, s, t = (torch.tensor(x) for x in (rollout, scored, recomputed))
    tokens = len(rollout)

    def gap(a: torch.Tensor, b: torch.Tensor) -> str:
        d = a - b
        return f"{float(d.mean()):+.4f} / {float(d.abs().mean()):.4f} / {float(d.abs().max()):.3f}"

    return f"| {precision} | {tokens} | {gap(s, r)} | {gap(t, r)} | {gap(t, s)} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--adapter", type=Path, default=None, help="a LoRA checkpoint folder to serve")
    args = parser.parse_args()
    model_dir = prepare_model_once(ConnectionSettings())
    prompts = list(get_scenario("student").train_prompts[: args.prompts])
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {describe_machine()}; load {os.getloadavg()[0]:.2f}"
    )
    print("gap per token, mean / mean |.| / max |.| (nats), same tokens, no hint (true gap 0):")
    print(
        "| precision | tokens | score - rollout (the OPD advantage's error) | trainer - rollout | trainer - score |"
    )
    print("|---|---|---|---|---|")
    for precision in args.precisions.split(","):
        print(asyncio.run(measure(model_dir, precision, prompts, args.max_tokens, args.adapter)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
