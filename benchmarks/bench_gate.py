"""The promotion gate's accuracy and cost: which trained versions does it promote, which does it hold?

1. Trains three runs of `orl demo` on the student scenario for --steps steps: binary as shipped,
   binary with ORL_TRAIN_W_RL=-1 (every reward inverted: the trainer learns what the simulated user
   rejects), and combined as shipped.
2. Gates each run's last version against the base model --tries times, each try with other sampling
   seeds (ORL_GATE_SEED), exactly as `orl gate --gate-scenario student --judge user_reply` decides:
   the scenario's held-out prompts, its simulated user's reply to every answer, the demo's rule
   judge. (The user is satisfied exactly when the scenario's scorer gives 1, so the gate's approval
   is the demo's held-out score.)
3. Prints one row per try (decision, approvals, relevances, seconds, the share of the cores the gate
   used), then per candidate how many tries each margin would promote (the decision is a pure
   function of the figures, so the margins share the tries).
4. Replays the trainer's automatic-rollback watch (trainer/rollback.py) over each run's recorded
   samples for a few windows: would it have rolled a version back, and which?

    .venv/bin/python benchmarks/bench_gate.py --out /tmp/bench-gate --steps 8 --tries 10

Reads and writes only the demo's data folders under --out (and the gate's downloads there). The
committed table: benchmarks/RESULTS-gate.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from orl.compute.machine import available_cores, describe_machine
from orl.connectors.checkpoint_store import MANIFEST_NAME, complete_versions, read_manifest, version_prefix
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.gate.promotion_rule import VersionScore, gate_decision
from orl.gate.runner import GateLog, gate_once, running_evaluator
from orl.gate.settings import GateSettings
from orl.rules.gate_decisions import PROMOTED
from orl.schemas.codec import decode
from orl.trainer.rollback import RollbackWatch

from orl.gate_scenarios import gate_source

# name -> (method, environment overrides)
RUNS: dict[str, tuple[str, dict[str, str]]] = {
    "binary": ("binary", {}),
    "inverted": ("binary", {"ORL_TRAIN_W_RL": "-1"}),
    "combined": ("combined", {}),
}
DEMO_MAX_TOKENS = 96  # the demo's default: the gate answers as the demo's server does


def train(name: str, args: argparse.Namespace) -> tuple[Path, str]:
    """One `orl demo` binary run (or the one already in --out); its data folder and namespace."""
    data_dir = args.out / name
    results_file = data_dir / "report" / "results.json"
    if not results_file.exists():
        command = [
            sys.executable, "-m", "orl.cli", "demo", "--data-dir", str(data_dir), "--out-dir", str(data_dir / "report"),
            "--methods", RUNS[name][0], "--steps", str(args.steps), "--eval-every", str(args.steps),
            "--scenario", "student", "--port", str(args.port), "--max-tokens", str(DEMO_MAX_TOKENS),
        ]  # fmt: skip
        print(f"== training {name} {RUNS[name][1] or ''}: {' '.join(command[2:])}", flush=True)
        started = time.perf_counter()
        with open(args.out / f"{name}.log", "w") as log:
            done = subprocess.run(
                command,
                env={**os.environ, **RUNS[name][1]},
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
            )
        if done.returncode != 0:
            raise SystemExit(f"run {name} failed (exit {done.returncode}); see {args.out / f'{name}.log'}")
        print(f"   took {time.perf_counter() - started:.0f} s", flush=True)
    results = json.loads(results_file.read_text())
    (namespace,) = results["extra"]["namespaces"][RUNS[name][0]].values()
    return data_dir, namespace


async def gate_tries(
    candidates: list[tuple[str, Path, str, int]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every (run, version) candidate gated against the base model once per seed; one row per try.
    Seeds go outermost, so the base model's answers (the same for every candidate of a seed) are
    generated once per seed, as the gate keeps a baseline's answers for its next candidate."""
    first = candidates[0]
    settings = GateSettings(
        data_dir=first[1], namespace=first[2], run_id=first[2], judge="user_reply", gate_scenario="student",
        gate_prompts=args.gate_prompts, gate_samples=args.gate_samples, gate_max_tokens=DEMO_MAX_TOKENS,
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    async with running_evaluator(settings, gate_source(settings)) as evaluator:
        for seed in range(args.tries):
            evaluator.kept.clear()  # another seed: other answers
            for name, data_dir, namespace, version in candidates:
                tried = dataclasses.replace(settings, gate_seed=seed, run_id=namespace, namespace=namespace)
                evaluator.settings = tried
                evaluator.store = LocalObjectStore(data_dir / "objects")
                evaluator.work_dir = data_dir / "gate"
                state = GateLog(namespace, 0.0, keep=1)  # the base model is the promoted one: v0
                started_wall, started_cpu = time.perf_counter(), time.process_time()
                event = await gate_once(evaluator, tried, state, version)
                wall, cpu = time.perf_counter() - started_wall, time.process_time() - started_cpu
                assert event is not None
                rows.append(
                    {
                        "run": name, "version": version, "seed": seed, "decision": event["decision"],
                        "candidate_approval": event["candidate_approval"], "baseline_approval": event["baseline_approval"],
                        "candidate_relevance": event["candidate_relevance"], "baseline_relevance": event["baseline_relevance"],
                        "seconds": wall, "core_share": cpu / wall / available_cores(),
                        **answer_counts(event["answers"], version), "baseline": answer_counts(event["answers"], 0),
                    }
                )  # fmt: skip
                row = rows[-1]
                print(
                    f"| {name} | v{version} | {seed} | {row['decision']} | {_fmt(row['candidate_approval'])} vs "
                    f"{_fmt(row['baseline_approval'])} | {row['candidate_relevance']:.2f} vs "
                    f"{row['baseline_relevance']:.2f} | {wall:.1f} | {row['core_share']:.2f} |",
                    flush=True,
                )
    return rows


def answer_counts(answers: list[dict[str, Any]], version: int) -> dict[str, int]:
    """How many answers `version` gave, and on how many the judge took a side (+1 or -1)."""
    mine = [a for a in answers if a["version"] == version]
    return {"answers": len(mine), "decisive": sum(a["reward"] in (1, -1) for a in mine)}


def candidate_score(row: dict[str, Any]) -> VersionScore:
    return VersionScore(
        row["answers"], row["decisive"], row["candidate_approval"], row["candidate_relevance"]
    )


def baseline_score(row: dict[str, Any]) -> VersionScore:
    counts = row["baseline"]
    return VersionScore(
        counts["answers"], counts["decisive"], row["baseline_approval"], row["baseline_relevance"]
    )


def decisions_by_margin(rows: list[dict[str, Any]], margins: tuple[float, ...]) -> list[str]:
    """Markdown rows: per candidate, how many tries each margin would promote (the rule is pure)."""
    lines = []
    for name, version in sorted({(r["run"], r["version"]) for r in rows}):
        tries = [r for r in rows if (r["run"], r["version"]) == (name, version)]
        counts = []
        for margin in margins:
            promoted = 0
            for r in tries:
                promoted += gate_decision(candidate_score(r), baseline_score(r), margin)[0] == PROMOTED
            counts.append(f"{promoted}/{len(tries)}")
        approval = sum(r["candidate_approval"] or 0.0 for r in tries) / len(tries)
        base = sum(r["baseline_approval"] or 0.0 for r in tries) / len(tries)
        relevance = sum(r["candidate_relevance"] for r in tries) / len(tries)
        base_relevance = sum(r["baseline_relevance"] for r in tries) / len(tries)
        lines.append(
            f"| {name} v{version} | {approval:.2f} vs {base:.2f} | {relevance:.2f} vs {base_relevance:.2f} | "
            + " | ".join(counts)
            + " |"
        )
    return lines


def decisions_against(rows: list[dict[str, Any]], promoted_run: str, margin: float) -> list[str]:
    """Markdown rows: had `promoted_run`'s version been the promoted one, how many tries would each other
    candidate have been promoted in? Paired per seed: within a seed every candidate answered the same
    prompts with the same sampling seeds, so its figures compare with the promoted one's directly."""
    served = {r["seed"]: r for r in rows if r["run"] == promoted_run}
    lines = []
    for name in sorted({r["run"] for r in rows} - {promoted_run}):
        tries = [(r, served[r["seed"]]) for r in rows if r["run"] == name and r["seed"] in served]
        promoted = 0
        for candidate, baseline in tries:
            promoted += (
                gate_decision(candidate_score(candidate), candidate_score(baseline), margin)[0] == PROMOTED
            )
        lines.append(f"| {name} v{tries[0][0]['version']} | {promoted_run} v{tries[0][1]['version']} | "
                     f"{promoted}/{len(tries)} | {len(tries) - promoted}/{len(tries)} |")  # fmt: skip
    return lines


def rollbacks_replayed(data_dir: Path, namespace: str, window: int, margin: float) -> list[str]:
    """The rollbacks RollbackWatch would have made over the run's samples, in the order it saw them."""
    store = LocalObjectStore(data_dir / "objects")
    parents = {v: read_manifest(store, version_prefix(namespace, v) + MANIFEST_NAME).parent_version or 0
               for v in complete_versions(store, namespace)}  # fmt: skip
    watch = RollbackWatch(window, margin)
    made = []

    async def samples() -> list[dict[str, Any]]:
        async with open_event_log(f"sqlite:///{data_dir / 'log.db'}") as log:
            return [decode(r.value) for r in await read_to_end(log, f"{namespace}.samples")]

    for event in asyncio.run(samples()):
        if event["envelope"]["event_type"] != "SampleReady":
            continue
        version = int(event["policy_version"])
        for published in sorted(v for v in parents if v <= version + 1 and v not in watch.parents):
            watch.published(published, parents[published])
        watch.judged(version, event["reward"], bool(event.get("promoted")))
        rollback = watch.check()
        if rollback is not None:
            made.append(f"v{rollback.from_version}->v{rollback.to_version} "
                        f"({rollback.from_approval:.2f} vs {rollback.to_approval:.2f})")  # fmt: skip
            watch.rolled_back(rollback, max(parents) + len(made))
    return made


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench-gate"))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--gate-prompts", type=int, default=16)
    parser.add_argument("--gate-samples", type=int, default=2)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--skip-gate", action="store_true", help="only the rollback replay (runs already trained)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"# bench_gate {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {describe_machine()}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    trained = {name: train(name, args) for name in RUNS}
    candidates = []
    for name, (data_dir, namespace) in trained.items():
        newest = complete_versions(LocalObjectStore(data_dir / "objects"), namespace)[-1]
        candidates.append((name, data_dir, namespace, newest))
    print("\n| run | version | seed | decision | approval (candidate vs base) | relevance | s | core share |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [] if args.skip_gate else asyncio.run(gate_tries(candidates, args))
    if rows:
        seconds = sorted(r["seconds"] for r in rows)
        print(f"\none evaluation (candidate, and the base once per seed): {seconds[len(seconds) // 2]:.1f} s median "
              f"({seconds[0]:.1f}-{seconds[-1]:.1f}); {args.gate_prompts} prompts x {args.gate_samples} answers; "
              f"core share {sum(r['core_share'] for r in rows) / len(rows):.2f} mean")  # fmt: skip
        margins = (0.0, 0.05, 0.1, 0.2)
        print("\n| candidate | approval vs base (mean) | relevance vs base (mean) | "
              + " | ".join(f"promoted at margin {m:g}" for m in margins) + " |")  # fmt: skip
        print("|---|---|---|" + "---|" * len(margins))
        print("\n".join(decisions_by_margin(rows, margins)))
        print("\n| candidate | promoted version | promoted | held |\n|---|---|---|---|")
        print("\n".join(decisions_against(rows, "combined", 0.1)))
        (args.out / "results.json").write_text(json.dumps(rows, indent=2))
    print("\n| run | rollback window | margin | rollbacks the watch would make |\n|---|---|---|---|")
    for name, (data_dir, ns) in trained.items():
        for window in (4, 8, 16):
            made = rollbacks_replayed(data_dir, ns, window, 0.25)
            print(f"| {name} | {window} | 0.25 | {', '.join(made) or 'none'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
