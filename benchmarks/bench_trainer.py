"""Trainer step throughput against a bare torch/transformers loop computing the same loss.

Usage: python -m benchmarks.bench_trainer [--kinds lora,full] [--steps 3] [--samples 16]
       [--prompt-tokens 30] [--response-tokens 100] [--threads 2] [--precision auto]
       [--cache-dir ~/.cache/orl-test]

Both sides train SmolLM2-135M on the same batches (binary samples, rewards +-1, fixed token ids,
temperature 0.7) with the same loss: token-mean PPO clipped surrogate with ratio 1 (one step per
batch) + 0.02 * k3 KL to the base (the trainer set to k3; its default is the exact KL), forwards in the machine's numerics (`--precision auto`: bf16
autocast only where the CPU runs bf16 natively, as `orl train` chooses) with fp32 log-softmax, grad clip 1.0,
AdamW. "trainer" is `orl.trainer.torch_backend.train_step` (what `orl train` runs per step); "bare" is the
learnability prototype's loop written out with plain torch/transformers/peft. Each (kind, side)
runs in its own process so peak RSS (getrusage ru_maxrss) is its own. One warm-up step, then
`--steps` timed steps; tokens/s counts response tokens. The trainer side also times one checkpoint
publish (save + upload + manifest) to a local object store.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from orl.compute.machine import choose_numerics
from orl.connectors.model_files import DEFAULT_MODEL, resolve_model
from orl.schemas.numerics import PRECISIONS

EPS_LOW, EPS_HIGH, BETA, LR = 0.2, 0.28, 0.02, {"lora": 5e-4, "full": 1e-5}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_batches(steps: int, samples: int, prompt_tokens: int, response_tokens: int) -> list[list[dict]]:
    """`steps` batches of samples with fixed ids; response lengths vary +-20% around the target."""
    rng = random.Random(0)
    batches = []
    for _ in range(steps):
        batch = []
        for _ in range(samples):
            n = rng.randint(int(response_tokens * 0.8), int(response_tokens * 1.2))
            batch.append({
                "prompt": [1, 9690, 198] + [rng.randrange(100, 20000) for _ in range(prompt_tokens - 3)],
                "response": [rng.randrange(100, 20000) for _ in range(n - 1)] + [2],
                "reward": rng.choice([1.0, -1.0]),
            })  # fmt: skip
        batches.append(batch)
    return batches


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


# ---- bare: the prototype's loop, plain torch / transformers / peft ---------------------------------


def bare_setup(model_dir: Path, kind: str) -> tuple[Any, Any, list, torch.optim.Optimizer]:
    import copy

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model: Any
    if kind == "lora":
        config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM"
        )
        model, ref = get_peft_model(base, config), None
    else:
        ref = copy.deepcopy(base).eval().requires_grad_(False)
        model = base
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    return model, ref, params, torch.optim.AdamW(params, lr=LR[kind], betas=(0.9, 0.999), weight_decay=0.0)


def seq_logps(model: Any, batch: list[dict], temperature: float, autocast: bool) -> list[torch.Tensor]:
    width = max(len(s["prompt"]) + len(s["response"]) for s in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, s in enumerate(batch):
        seq = s["prompt"] + s["response"]
        ids[i, : len(seq)] = torch.tensor(seq)
        att[i, : len(seq)] = 1
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, attention_mask=att).logits
    out = []
    for i, s in enumerate(batch):
        p, r = len(s["prompt"]), len(s["response"])
        lg = logits[i, p - 1 : p + r - 1].float() / temperature
        out.append(torch.log_softmax(lg, -1).gather(-1, torch.tensor(s["response"])[:, None]).squeeze(-1))
    return out


def bare_step(
    model: Any, ref: Any, params: list, opt: torch.optim.Optimizer, batch: list[dict], autocast: bool
) -> float:
    cur = seq_logps(model, batch, 0.7, autocast)
    with torch.no_grad():
        if ref is None:
            with model.disable_adapter():
                refs = seq_logps(model, batch, 0.7, autocast)
        else:
            refs = seq_logps(ref, batch, 0.7, autocast)
    logp = torch.cat(cur)
    old = logp.detach()
    adv = torch.cat([torch.full((len(s["response"]),), s["reward"]) for s in batch])
    rf = torch.cat(refs)
    ratio = torch.exp(logp - old)
    pg = -torch.minimum(ratio * adv, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
    d = (rf - logp).clamp(-10, 10)
    kl = torch.exp(d) - d - 1
    loss = (pg + BETA * kl).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return float(loss)


# ---- trainer: orl.trainer.torch_backend.train_step on TrainingSamples ---------------------------------------------


def trainer_batches(batches: list[list[dict]]) -> list[Any]:
    from orl.connectors.event_log.base import TopicPartition
    from orl.trainer.batching import Batch, TrainingSample

    out = []
    offset = 0
    for batch in batches:
        samples = []
        for s in batch:
            samples.append(TrainingSample(
                sample_id=f"s{offset}", method="binary", prompt_ids=tuple(s["prompt"]),
                response_ids=tuple(s["response"]), rollout_logprobs=tuple([-1.0] * len(s["response"])),
                temperature=0.7, reward=s["reward"], teacher_logprobs=None, policy_version=0,
                position=TopicPartition("bench.samples", 0), offset=offset,
            ))  # fmt: skip
            offset += 1
        out.append(
            Batch(tuple(samples), {TopicPartition("bench.samples", 0): offset}, {}, (0,) * len(samples))
        )
    return out


def trainer_setup(model_dir: Path, kind: str, precision: str) -> tuple[Any, torch.optim.Optimizer, Any]:
    from orl.trainer.policy_model import load_policy
    from orl.trainer.settings import TrainSettings

    torch.manual_seed(0)  # the same LoRA initialisation as bare_setup
    policy = load_policy(model_dir, "full" if kind == "full" else "lora")
    params = policy.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=LR[kind], betas=(0.9, 0.999), weight_decay=0.0)
    # k3, as the bare loop computes it: like for like (the trainer's default is the exact KL)
    settings = TrainSettings(
        kind=kind, run_id="bench", model=str(model_dir), precision=precision, kl_estimator="k3"
    )
    return policy, opt, settings


def time_steps(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """Both sides in one process, alternating step by step (and which goes first), so that a
    busy machine slows both alike; the first step of each side is a warm-up."""
    from orl.trainer.torch_backend import train_step

    batches = make_batches(args.steps + 1, args.samples, args.prompt_tokens, args.response_tokens)
    tokens = [sum(len(s["response"]) for s in b) for b in batches]
    policy, opt, settings = trainer_setup(model_dir, args.kind, args.precision)
    bare = bare_setup(model_dir, args.kind)
    autocast = choose_numerics(args.precision).autocast
    times: dict[str, list[float]] = {"trainer": [], "bare": []}
    losses: dict[str, list[float]] = {"trainer": [], "bare": []}
    for index, (batch, tbatch) in enumerate(zip(batches, trainer_batches(batches), strict=True)):
        order = ("trainer", "bare") if index % 2 == 0 else ("bare", "trainer")
        for side in order:
            start = time.perf_counter()
            if side == "trainer":
                losses[side].append(train_step(policy, opt, tbatch, settings).metrics["loss"])
            else:
                losses[side].append(bare_step(*bare, batch, autocast))
            times[side].append(time.perf_counter() - start)
    timed_tokens = sum(tokens[1:])
    return {
        side: {"step_s": sum(t[1:]) / len(t[1:]), "tokens_per_s": timed_tokens / sum(t[1:]),
               "tokens_per_step": timed_tokens / len(t[1:]), "losses": losses[side]}
        for side, t in times.items()
    }  # fmt: skip


def measure_memory(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """One side alone for one step (its own process): peak RSS; the trainer also times a publish."""
    from orl.connectors.object_store.local_store import LocalObjectStore
    from orl.trainer.checkpointing import publish_step
    from orl.trainer.torch_backend import train_step

    batches = make_batches(1, args.samples, args.prompt_tokens, args.response_tokens)
    if args.side == "bare":
        bare_step(*bare_setup(model_dir, args.kind), batches[0], choose_numerics(args.precision).autocast)
        return {"peak_rss_gb": peak_rss_gb(), "publish_s": None}
    policy, opt, settings = trainer_setup(model_dir, args.kind, args.precision)
    batch = trainer_batches(batches)[0]
    step = train_step(policy, opt, batch, settings)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        store = LocalObjectStore(Path(tmp) / "objects")
        publish_step(store, settings, policy, 1, 0, batch, step, Path(tmp))
        publish_s = time.perf_counter() - start
    return {"peak_rss_gb": peak_rss_gb(), "publish_s": publish_s}


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model_dir = resolve_model(DEFAULT_MODEL, args.cache_dir.expanduser())
    return time_steps(args, model_dir) if args.child == "time" else measure_memory(args, model_dir)


def child_result(args: argparse.Namespace, mode: str, kind: str, side: str = "") -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.bench_trainer",
        "--child",
        mode,
        "--kind",
        kind,
        "--side",
        side,
    ]
    for name in ("steps", "samples", "prompt_tokens", "response_tokens", "threads", "precision", "cache_dir"):
        command += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    print(f"done {mode} {kind} {side}: {result}", file=sys.stderr, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", default="lora,full")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side (after one warm-up)")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=30)
    parser.add_argument("--response-tokens", type=int, default=100)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--precision", default="auto", choices=PRECISIONS, help="auto: bf16 only where native"
    )
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/orl-test"), help="converted model")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--kind", default="lora", help=argparse.SUPPRESS)
    parser.add_argument("--side", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(run_child(args)), flush=True)
        return
    numerics = choose_numerics(args.precision)
    print(f"numerics: {numerics.precision} ({numerics.reason}); torch threads {args.threads}")
    print(
        "| kind | side | step s | tokens/step | tokens/s | ratio trainer/bare | peak RSS GB | publish s | loss step 1 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        timing = child_result(args, "time", kind)
        for side in ("trainer", "bare"):
            t, mem = timing[side], child_result(args, "memory", kind, side)
            ratio = f"{t['tokens_per_s'] / timing['bare']['tokens_per_s']:.2f}" if side == "trainer" else ""
            publish = "" if mem["publish_s"] is None else f"{mem['publish_s']:.2f}"
            print(f"| {kind} | {side} | {t['step_s']:.2f} | {t['tokens_per_step']:.0f} | {t['tokens_per_s']:.0f} | "
                  f"{ratio} | {mem['peak_rss_gb']:.2f} | {publish} | {t['losses'][0]:.4f} |", flush=True)  # fmt: skip
    print(
        f"load average at end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; torch threads {args.threads}"
    )


if __name__ == "__main__":
    main()
