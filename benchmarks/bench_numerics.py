"""fp32 against bf16 autocast on this machine: what `--precision auto` chooses, and what it is worth.

Usage: python -m benchmarks.bench_numerics [--batch 1] [--tokens 128] [--repeats 2] [--threads 0]

Times a forward and backward of a model with SmolLM2-135M-Instruct's shape (random weights: speed
does not depend on their values, so no model files are needed) on the CPU, and on the GPU when
torch sees one, in fp32 and under bf16 autocast with fp32 weights (what the trainer runs). Prints
the CPU model and its bf16 flags, `choose_numerics("auto")` with its reason, the quick matmul
measurement that decides when the flags cannot be read, and tokens/s per precision.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from orl.compute.machine import (
    available_cores,
    bf16_speedup,
    choose_numerics,
    describe_machine,
)


def smollm2_shaped_model() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def step_seconds(model: torch.nn.Module, ids: torch.Tensor, bf16: bool, repeats: int) -> float:
    device = ids.device.type
    times = []
    for attempt in range(repeats + 1):  # the first is a warm-up
        started = time.perf_counter()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=ids).logits
        logits.float().log_softmax(-1).mean().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if attempt:
            times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per precision (best is kept)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every available core)")
    args = parser.parse_args()
    threads = args.threads or available_cores()
    torch.set_num_threads(threads)
    print(f"machine: {describe_machine()}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()}); "
          f"{threads} threads; load {os.getloadavg()[0]:.2f}")  # fmt: skip
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        numerics = choose_numerics("auto", device)
        print(f"auto on {device}: {numerics.precision} ({numerics.reason})")
    print(f"bf16 matmul speed-up measured on the CPU (the fallback decision): {bf16_speedup():.2f}x")
    print("| device | precision | step s | tokens/s | x fp32 |")
    print("|---|---|---|---|---|")
    for device in devices:
        model = smollm2_shaped_model().to(device)
        ids = torch.randint(100, 20000, (args.batch, args.tokens), device=device)
        fp32_s = step_seconds(model, ids, False, args.repeats)
        bf16_s = step_seconds(model, ids, True, args.repeats)
        for name, seconds in (("fp32", fp32_s), ("bf16 autocast", bf16_s)):
            print(
                f"| {device} | {name} | {seconds:.3f} | {ids.numel() / seconds:.0f} | {fp32_s / seconds:.2f} |"
            )


if __name__ == "__main__":
    main()
