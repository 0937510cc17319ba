"""Learning ablations: `orl demo` once per variant (one setting changed), one results table.

Each variant is the demo with a few settings overridden through the environment the demo passes on
to its server, pipeline and trainer (`orl.up.component_env`). The script runs the variants one after
another (they would only share the same cores), reads each run's results.json and prints one
markdown row per variant and seed (and their mean): the held-out score, style and relevance at every
evaluated step and the words at the last one. Reads and writes only the demo's own data folders under --out.

    .venv/bin/python benchmarks/bench_learning.py --variants baseline,center_rewards --steps 8

The committed table and what it showed: docs/demo/ablations.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# name -> (what changes, environment overrides). The baseline is the demo as shipped.
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "baseline": ("the demo as shipped", {}),
    "center_rewards": ("batch-mean reward baseline", {"ORL_TRAIN_CENTER_REWARDS": "true"}),
    "sample_mean": (
        "loss averaged per response, then over the batch (OpenClaw-RL's reduction)",
        {"ORL_TRAIN_LOSS_REDUCTION": "sample"},
    ),
    "opd_clip_2": (
        "each token's OPD advantage clamped to [-2, 2]",
        {"ORL_TRAIN_OPD_ADVANTAGE_CLIP": "2"},
    ),
    "live_teacher": ("OPD teacher = the served policy + hint", {"ORL_TEACHER_KIND": "live_policy"}),
    "topk_opd": (
        "top-K distillation (K=20) instead of the token-level OPD advantage",
        {"ORL_OPD_TOPK": "20", "ORL_OPD_LOSS": "topk"},
    ),  # fmt: skip
    "fp32": ("fp32 forwards instead of bf16 autocast (where auto picks bf16)", {"ORL_PRECISION": "fp32"}),
    "lr_2.5e-4": ("LoRA lr 2.5e-4 (half)", {"ORL_DEMO_LR": "2.5e-4"}),
    "kl_0.1": ("KL weight 0.1 (5x)", {"ORL_TRAIN_BETA_KL": "0.1"}),
    "kl_0": ("no KL to the base", {"ORL_TRAIN_BETA_KL": "0"}),
    "exact_kl": (
        "the KL to the base summed over the vocabulary instead of k3 on the sampled token",
        {"ORL_TRAIN_KL_ESTIMATOR": "exact"},
    ),
    "train_T_sample": (
        "trainer logprobs at the sampling temperature (0.7)",
        {"ORL_TRAIN_TEMPERATURE": "0.7"},
    ),
    "partial_batches": (
        "the trainer steps on each round's samples, however few (the demo before issue 19)",
        {"ORL_DEMO_PARTIAL_BATCHES": "true"},
    ),  # fmt: skip
    "w_opd_0.5": ("OPD weight 0.5 in Combined", {"ORL_TRAIN_W_OPD": "0.5"}),
    "user_restates_length": (
        "the simulated user's redo of a short enough answer also restates the word limit",
        {"ORL_DEMO_USER_RESTATES_LENGTH": "true"},
    ),
    "opd_anchor_0": (
        "OPD advantage teacher - the frozen base without the hint (what the hint changes) instead of - old",
        {"ORL_TRAIN_OPD_ANCHOR": "0"},
    ),
    "opd_anchor_0.5": (
        "OPD advantage teacher - (old + the frozen base without the hint) / 2: half the pull back to the base",
        {"ORL_TRAIN_OPD_ANCHOR": "0.5"},
    ),
    "w_rl_0.5": (
        "the reward's term at half weight in the combined advantage (w_opd 1): less push to short",
        {"ORL_TRAIN_W_RL": "0.5"},
    ),
    "w_opd_2": (
        "the OPD term at twice the weight in the combined advantage (w_rl 1): more pull to the teacher",
        {"ORL_TRAIN_W_OPD": "2"},
    ),
    "prompt_baseline": (
        "each prompt asked by 2 sessions a round, the trainer's per-prompt reward baseline",
        {"ORL_DEMO_SESSIONS_PER_PROMPT": "2", "ORL_TRAIN_PROMPT_BASELINE": "true"},
    ),
    "prompt_baseline_restates": (
        "prompt_baseline and user_restates_length together",
        {
            "ORL_DEMO_SESSIONS_PER_PROMPT": "2",
            "ORL_TRAIN_PROMPT_BASELINE": "true",
            "ORL_DEMO_USER_RESTATES_LENGTH": "true",
        },
    ),
}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def cpu_flags() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none listed"


def run_variant(name: str, args: argparse.Namespace, port: int) -> dict[str, object]:
    """One `orl demo` run of the variant; its results.json."""
    description, overrides = VARIANTS[name]
    data_dir = args.out / name
    env = {**os.environ, **overrides}
    command = [
        sys.executable, "-m", "orl.cli", "demo", "--data-dir", str(data_dir), "--out-dir", str(data_dir / "report"),
        "--methods", args.method, "--steps", str(args.steps), "--eval-every", str(args.eval_every),
        "--seed", str(args.seed), "--seeds", str(args.seeds), "--scenario", args.scenario, "--port", str(port),
        "--no-gate",  # the variants measure learning; the gate would hold some versions back
    ]  # fmt: skip
    print(f"== {name}: {description} {overrides or ''}", flush=True)
    started = time.perf_counter()
    with open(args.out / f"{name}.log", "w") as log:
        done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"variant {name} failed (exit {done.returncode}); see {args.out / f'{name}.log'}")
    results: dict[str, object] = json.loads((data_dir / "report" / "results.json").read_text())
    print(f"   took {time.perf_counter() - started:.0f} s", flush=True)
    return results


def rows(name: str, results: dict[str, object], method: str) -> list[str]:
    """One row per seed, and their mean with several: score / style / relevance at every evaluated step,
    words at the last step."""
    per_seed = results["per_seed"][method]  # type: ignore[index]
    curves = [curve for _, curve in sorted(per_seed.items(), key=lambda item: int(item[0]))]
    steps = sorted(curves[0], key=int)

    def cell(at_step: list[dict[str, Any]]) -> str:
        figures = [[s.get(key) for s in at_step] for key in ("score", "style", "relevance")]
        return " / ".join("n/a" if None in f else f"{sum(f) / len(f):.2f}" for f in figures)

    def words(at_last: list[dict[str, Any]]) -> str:
        known = [s["words"] for s in at_last if s.get("words") is not None]
        return f"{sum(known) / len(known):.0f}" if known else "n/a"

    seeds = sorted(per_seed, key=int)
    out = [
        f"| {name} | {seed} | "
        + " | ".join(cell([curve[s]]) for s in steps)
        + f" | {words([curve[steps[-1]]])} |"
        for seed, curve in zip(seeds, curves, strict=True)
    ]
    if len(curves) > 1:
        means = [cell([curve[s] for curve in curves if s in curve]) for s in steps]
        out.append(
            f"| {name} | mean | " + " | ".join(means) + f" | {words([c[steps[-1]] for c in curves])} |"
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variants", default="baseline", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--method", default="combined")
    parser.add_argument("--scenario", default="student")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--port", type=int, default=8041)
    parser.add_argument("--out", type=Path, default=Path(".orl/ablations"))
    args = parser.parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, {cpu_model()} "
        f"({cpu_flags()}), load {os.getloadavg()[0]:.2f}; {args.method}, scenario {args.scenario}, "
        f"{args.steps} steps, seeds {args.seed}..{args.seed + args.seeds - 1}",
        flush=True,
    )
    table: list[str] = []
    for name in names:
        results = run_variant(name, args, args.port)
        table.extend(rows(name, results, args.method))
        steps = sorted(next(iter(results["per_seed"][args.method].values())), key=int)  # type: ignore[index]
        print("score / style / relevance:", flush=True)
        print("| variant | seed | " + " | ".join(f"step {s}" for s in steps) + " | words |", flush=True)
        print("\n".join(table), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
