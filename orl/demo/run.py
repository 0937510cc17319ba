"""`orl demo`: the whole loop on one CPU, for Binary RL, OPD and Combined, with a paper-style report.

For each seed and method it starts the embedded stack as separate processes (`orl serve`,
`orl pipeline`, `orl train`, supervised as by `orl up`) in a fresh namespace and run
(`demo-<run>-s<seed>-<method>`), lets the scripted user of the scenario hold training sessions with
the server, waits for the trainer to publish a checkpoint and the server to hot-swap it, and
evaluates the held-out prompts after every `eval_every` steps.
The seed orders the training prompts, seeds the user's phrasing and the trainer (ORL_TRAIN_SEED);
`--seeds N` repeats every method for seeds `seed .. seed+N-1`. The evaluation's own seeds are fixed,
so the base model (step 0) is evaluated once and reused for every seed and method.
It writes results.md, results.json and learning_curve.png to the output folder; the namespaces
stay in the data folder, so `orl samples` (and the audit tools) work on the demo's data.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from orl.compute.machine import describe_machine, resolved_numerics
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.settings import ConnectionSettings, PrecisionSettings, same_deployment, setting
from orl.demo.report import StepResult, merge_results, write_report, write_summaries
from orl.demo.scenarios import Scenario, evaluation_prompts, get_scenario
from orl.demo.session_driver import DemoClient, Evaluation, Sampling
from orl.pipeline.processors.config import SampleMethod
from orl.pipeline.runtime.settings import TeacherSettings
from orl.rules.gate_decisions import HELD, PROMOTED, GateDecisions
from orl.samples import read_samples
from orl.schemas.codec import decode
from orl.schemas.errors import ConfigError, OrlError
from orl.schemas.topics import topic_name
from orl.serving.settings import ServeSettings
from orl.settings_binding import build_settings
from orl.stack_settings import StackSettings
from orl.trainer.settings import OpdLossSettings
from orl.up import (
    StackKeys,
    Supervisor,
    UpSettings,
    component_env,
    compute_budget,
    prepare_model_once,
    stack_keys,
    stack_launches,
)

logger = logging.getLogger(__name__)

FLUSH_EVERY_S = 10.0  # how often the demo repeats its flush request while waiting for the trainer


@dataclass(frozen=True)
class DemoSettings(ConnectionSettings, StackSettings, PrecisionSettings, TeacherSettings, OpdLossSettings):
    scenario: str = setting("student", "ORL_DEMO_SCENARIO", "Simulated user: student | teacher.")
    methods: tuple[SampleMethod, ...] = setting(
        ("binary", "opd", "combined"), "ORL_DEMO_METHODS", "Methods to compare, comma-separated."
    )
    steps: int = setting(16, "ORL_DEMO_STEPS", "Training steps per method.")
    batch_size: int = setting(16, "ORL_DEMO_BATCH_SIZE", "Effective samples per training step.")
    eval_every: int = setting(
        4, "ORL_DEMO_EVAL_EVERY", "Evaluate the held-out prompts every this many steps.", advanced=True
    )
    eval_prompts: int = setting(16, "ORL_DEMO_EVAL_PROMPTS", "Held-out prompts per evaluation (at most 16).")
    eval_samples: int = setting(
        2, "ORL_DEMO_EVAL_SAMPLES", "Responses per held-out prompt per evaluation.", advanced=True
    )
    lr: float = setting(5e-4, "ORL_DEMO_LR", "LoRA learning rate.")
    partial_batches: bool = setting(
        False,
        "ORL_DEMO_PARTIAL_BATCHES",
        "Train each round's samples as one step even when fewer than --batch-size (OPD's rounds shrink as "
        "users become satisfied); off: the trainer steps on full batches, as under `orl up`.",
        advanced=True,
    )
    max_tokens: int = setting(
        96, "ORL_DEMO_MAX_TOKENS", "Response length limit (the scenario asks for <= 40 words)."
    )
    user_restates_length: bool = setting(
        False,
        "ORL_DEMO_USER_RESTATES_LENGTH",
        "The simulated user's redo of an answer that was short enough also restates the word limit, so "
        "the OPD hint for an off-topic answer keeps asking for short answers.",
        advanced=True,
    )
    sessions_per_prompt: int = setting(
        1,
        "ORL_DEMO_SESSIONS_PER_PROMPT",
        "Sessions that ask each of a round's prompts (a round asks batch_size / this many prompts); with "
        "ORL_TRAIN_PROMPT_BASELINE the trainer compares the answers to one prompt with each other.",
        advanced=True,
    )
    port: int = setting(8011, "ORL_DEMO_PORT", "Port of the demo's server.")
    out_dir: Path = setting(
        Path(""), "ORL_DEMO_OUT", "Where the report goes (default <data-dir>/demo/<run>)."
    )
    seed: int = setting(
        0, "ORL_DEMO_SEED", "First seed of the prompt order, the user's phrasing and the trainer."
    )
    seeds: int = setting(
        1, "ORL_DEMO_SEEDS", "Seeds per method: --seed, --seed+1, ... (the report gives their spread)."
    )
    step_timeout_s: float = setting(
        1800.0, "ORL_DEMO_STEP_TIMEOUT_S", "Give up if one step takes longer.", advanced=True
    )
    merge: tuple[str, ...] = setting(
        (),
        "ORL_DEMO_MERGE",
        "Run nothing: write one report (to --out-dir) from these earlier runs' results.json files, "
        "comma-separated (e.g. each method run on its own); same scenario and OPD teacher, no seed twice.",
    )
    quick: bool = setting(
        False,
        "ORL_DEMO_QUICK",
        "A short run: Combined only, 4 steps of 8 samples, each version scored on 16 evaluation prompts, one answer each.",
    )

    two_tenants: bool = setting(
        False,
        "ORL_DEMO_TWO_TENANTS",
        "Two tenants with opposite preferences on one server (alice: student, bob: explainer), each training "
        "her own adapter, without the promotion gate; Combined unless --methods names one method.",
    )

    def effective(self) -> DemoSettings:
        settings = self
        if self.two_tenants and len(self.methods) != 1:
            settings = replace(self, methods=("combined",))
        if not self.quick:
            return settings
        return replace(
            settings,
            methods=("combined",),
            steps=4,
            batch_size=8,
            eval_every=1,
            eval_prompts=16,
            eval_samples=1,
            max_tokens=64,
        )


def run_demo(settings: DemoSettings) -> int:
    """Entry point of `orl demo`."""
    settings = settings.effective()
    if settings.merge:
        return merge_reports(settings)
    if settings.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, not {settings.seeds}")
    if settings.sessions_per_prompt < 1 or settings.batch_size % settings.sessions_per_prompt:
        raise ConfigError(
            f"--sessions-per-prompt must divide --batch-size ({settings.batch_size}), not {settings.sessions_per_prompt}"
        )
    scenario = get_scenario(settings.scenario)
    tag = time.strftime("%Y%m%d-%H%M%S")
    out_dir = settings.out_dir if str(settings.out_dir) not in ("", ".") else settings.data_dir / "demo" / tag
    print(
        f"orl demo: scenario {scenario.name!r}, methods {', '.join(settings.methods)}, seeds "
        f"{', '.join(map(str, demo_seeds(settings)))}, {settings.steps} steps of {settings.batch_size} samples; "
        f"report -> {out_dir}",
        flush=True,
    )
    started = time.perf_counter()  # "took" counts the model's conversion on a fresh machine
    started_utc, load_at_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()[0]
    print(compute_budget(up_settings(settings, "combined", "demo")), flush=True)
    print(f"base model: {prepare_model_once(settings)}", flush=True)
    clock = RunClock(len(demo_seeds(settings)) * len(settings.methods) * settings.steps)
    results = asyncio.run(_run_all(settings, scenario, tag, clock))
    gate = asyncio.run(_gate_summaries(settings, tag, results)) if settings.gate else {}
    files = write_report(
        out_dir,
        {
            method: {
                seed: {step: step_result(e) for step, e in curve.items()} for seed, curve in by_seed.items()
            }
            for method, by_seed in results.items()
        },
        opd_teacher=settings.teacher_kind,
        scenario=scenario.name,
        extra={
            "namespaces": {
                m: {str(seed): _namespace(tag, seed, m) for seed in by_seed} for m, by_seed in results.items()
            },
            "gate": gate,
            **run_record(settings, started, started_utc, load_at_start),
        },
    )
    print(files.table.read_text())
    for method, by_seed in gate.items():
        for seed, summary in by_seed.items():
            print(f"promotion gate, {method} seed {seed}: {summary}")
    print(
        f"learning curve: {files.chart}\nresults: {files.results}\ntook {time.perf_counter() - started:.0f} s"
    )
    return 0


def run_record(
    settings: DemoSettings, started: float, started_utc: str, load_at_start: float
) -> dict[str, Any]:
    """What results.json records of a run: how long it took, on what machine under what load, and
    the settings that shaped it."""
    return {
        "seconds": round(time.perf_counter() - started),
        "machine": {
            "cpu": describe_machine(),
            "numerics": resolved_numerics(settings.precision).precision,
            "started": started_utc,
            "load": [round(load_at_start, 1), *(round(v, 1) for v in os.getloadavg())],
        },
        "settings": recorded_settings(settings),
    }


def step_result(evaluation: Evaluation) -> StepResult:
    """An evaluation as the report summarises it."""
    return StepResult(evaluation.scores, evaluation.relevance, evaluation.words, evaluation.style)


# Demo settings that do not change what a run measures, so its results.json leaves them out.
UNRECORDED_SETTINGS = frozenset({"port", "out_dir", "merge", "quick", "step_timeout_s", "seed"})


def recorded_settings(settings: DemoSettings) -> dict[str, Any]:
    """Every demo setting that shapes the run (the seeds as a list), and the ORL_* variables it inherited."""
    inherited = {f.name for f in fields(ConnectionSettings)}
    own = [f.name for f in fields(DemoSettings) if f.name not in inherited]
    recorded: dict[str, Any] = {
        name: getattr(settings, name) for name in own if name not in UNRECORDED_SETTINGS
    }
    recorded["seeds"] = demo_seeds(settings)
    recorded["environment"] = orl_environment()
    return recorded


def orl_environment() -> dict[str, str]:
    """The ORL_* variables this run's components inherit (a trainer flag set as ORL_TRAIN_..., say),
    without secrets: what a reader needs to repeat the run beyond the demo's own settings."""
    secret = ("KEY", "SECRET", "PASSWORD", "TOKEN")
    return {
        name: value
        for name, value in sorted(os.environ.items())
        if name.startswith("ORL_") and not any(word in name for word in secret)
    }


def merge_reports(settings: DemoSettings) -> int:
    """`orl demo --merge a/results.json,b/results.json`: one report over earlier runs, nothing run."""
    if str(settings.out_dir) in ("", "."):
        raise ConfigError("--merge needs --out-dir: where the merged report goes")
    scenario, opd_teacher, per_seed, runs = merge_results([Path(p) for p in settings.merge])
    files = write_summaries(settings.out_dir, per_seed, opd_teacher, scenario, {"merged_runs": runs})
    print(files.table.read_text())
    print(f"learning curve: {files.chart}\nresults: {files.results}")
    return 0


async def _gate_summaries(
    settings: DemoSettings, tag: str, results: dict[str, dict[int, dict[int, Evaluation]]]
) -> dict[str, dict[str, str]]:
    """What the gate promoted and held in every method's run, from its log."""
    summaries: dict[str, dict[str, str]] = {}
    for method in settings.methods:
        for seed in results[method]:
            namespace = _namespace(tag, seed, method)
            _, decisions = await read_gate(up_settings(settings, method, namespace), namespace)
            summaries.setdefault(method, {})[str(seed)] = gate_summary(decisions)
    return summaries


def demo_seeds(settings: DemoSettings) -> list[int]:
    """The seeds the demo runs: `seed`, `seed + 1`, ..., `seeds` of them."""
    return list(range(settings.seed, settings.seed + settings.seeds))


def _namespace(tag: str, seed: int, method: str) -> str:
    return f"demo-{tag}-s{seed}-{method}".replace("_", "-")


async def _run_all(
    settings: DemoSettings, scenario: Scenario, tag: str, clock: RunClock
) -> dict[str, dict[int, dict[int, Evaluation]]]:
    """Every (seed, method), each a fresh stack; results[method][seed][step]."""
    results: dict[str, dict[int, dict[int, Evaluation]]] = {m: {} for m in settings.methods}
    base: Evaluation | None = None
    for seed in demo_seeds(settings):
        seeded = replace(settings, seed=seed)  # the one seed every function below reads
        for method in settings.methods:
            curve = await _run_method(seeded, scenario, method, _namespace(tag, seed, method), base, clock)
            results[method][seed] = curve
            # evaluation uses fixed seeds, so the base model scores the same for every seed and method
            base = curve[0]
    return results


def up_settings(settings: DemoSettings, method: SampleMethod, namespace: str) -> UpSettings:
    """The stack `orl up` would start for one method of the demo, in its own namespace and run."""
    return UpSettings(
        **same_deployment(settings),
        namespace=namespace,
        port=settings.port,
        method=method,
        judge="user_reply",
        hint_judge="user_hint",
        run_id=namespace,
        batch_size=settings.batch_size,
        cores=settings.cores,
        precision=settings.precision,
        teacher_kind=settings.teacher_kind,
        opd_topk=settings.opd_topk,
        opd_loss=settings.opd_loss,
        gate=settings.gate,
        holdout_share=0.0,  # the gate asks the scenario's gate prompts, which no session uses
    )


@dataclass
class DemoStack:
    """One method's running stack: the supervised `orl serve` / `pipeline` / `train` and a client."""

    up: UpSettings
    supervisor: Supervisor
    client: DemoClient
    namespace: str
    partial_batches: bool = False

    async def close(self) -> None:
        await self.client.close()
        self.supervisor.stop()


async def start_stack(settings: DemoSettings, method: SampleMethod, namespace: str) -> DemoStack:
    """Start the stack `orl up` would start for `method` in `namespace` and wait until it serves."""
    up = up_settings(settings, method, namespace)
    supervisor, keys = start_processes(settings, up)
    client = demo_client(settings, get_scenario(settings.scenario), keys.api_key, keys.admin_key)
    stack = DemoStack(up, supervisor, client, namespace, settings.partial_batches)
    try:
        await client.wait_ready()
    except BaseException:
        await stack.close()
        raise
    return stack


def start_processes(settings: DemoSettings, up: UpSettings) -> tuple[Supervisor, StackKeys]:
    """Start `up`'s processes, supervised as by `orl up`, with the demo's trainer and gate settings."""
    env = {
        **component_env(up),
        "ORL_TRAIN_LR": str(settings.lr),
        "ORL_SERVED_MODEL_NAME": "orl-policy",
        "ORL_TRAIN_SEED": str(settings.seed),
        # the gate evaluates as the demo does, on its own prompts: the scenario's gate prompts, as many,
        # answers of the same length
        "ORL_GATE_SCENARIO": settings.scenario,
        "ORL_GATE_PROMPTS": str(settings.eval_prompts),
        "ORL_GATE_SAMPLES": str(settings.eval_samples),
        "ORL_GATE_MAX_TOKENS": str(get_scenario(settings.scenario).max_tokens or settings.max_tokens),
    }
    supervisor = Supervisor(stack_launches(up, env), settings.data_dir / "logs" / up.namespace)
    keys = stack_keys(up)
    supervisor.start_all()
    return supervisor, keys


def demo_client(settings: DemoSettings, scenario: Scenario, api_key: str, admin_key: str) -> DemoClient:
    """A client of the demo's server that holds `scenario`'s sessions with `api_key`."""
    return DemoClient(
        f"http://127.0.0.1:{settings.port}",
        api_key,
        admin_key,
        Sampling(max_tokens=scenario.max_tokens or settings.max_tokens),
        concurrency=settings.batch_size,  # one wave per round: its samples reach the trainer together
        restate_length=settings.user_restates_length,
        # held-out answers as many at a time as the server decodes together
        eval_concurrency=build_settings(ServeSettings, argparse.Namespace(), os.environ).max_batch_size,
    )


async def _run_method(
    settings: DemoSettings,
    scenario: Scenario,
    method: SampleMethod,
    namespace: str,
    base: Evaluation | None,
    clock: RunClock,
) -> dict[int, Evaluation]:
    stack = await start_stack(settings, method, namespace)
    client = stack.client
    try:
        held_out = evaluation_prompts(scenario, settings.eval_prompts)
        evaluations = {0: base or await client.evaluate(scenario, held_out, settings.eval_samples)}
        label = f"seed {settings.seed} {method}"
        print_progress(label, 0, settings.steps, evaluations[0], None, clock.text())
        prompts = prompt_stream(scenario, settings.seed)
        for step in range(1, settings.steps + 1):
            satisfied = await train_one_step(settings, scenario, stack, step, prompts)
            if step % settings.eval_every == 0 or step == settings.steps:
                evaluations[step] = await client.evaluate(scenario, held_out, settings.eval_samples)
            clock.step_done()
            print_progress(label, step, settings.steps, evaluations.get(step), satisfied, clock.text())
        return evaluations
    finally:
        await stack.close()


async def train_one_step(
    settings: DemoSettings, scenario: Scenario, stack: DemoStack, step: int, prompts: Iterator[str]
) -> str:
    """One round of `batch_size` sessions, then wait until the trainer trained on all of its samples
    and the server serves the resulting checkpoint.

    Every method gets the same traffic per step. Binary RL and Combined learn from every answer, so
    a round fills a batch; OPD learns only from corrected answers, so its rounds give fewer samples
    as users become satisfied. By default the trainer steps only on full batches of N, as under
    `orl up`, so a round may train nothing and OPD takes fewer optimizer steps than rounds. With
    `partial_batches` the demo asks the trainer to flush once all of a round's decisions are in
    (SIGUSR1, trainer/flush_request.py), so every round is one step whatever its number of samples:
    OPD's late steps then rest on 3-6 samples each, and drifted (docs/demo/ablations.md).
    """
    deadline = time.monotonic() + settings.step_timeout_s
    round_ = await run_round(settings, scenario, stack, step, prompts)
    return await wait_for_training(stack, round_, deadline)


@dataclass(frozen=True)
class Round:
    step: int
    sessions: int
    satisfied: int
    ready_before: int
    decided_before: int


async def run_round(
    settings: DemoSettings, scenario: Scenario, stack: DemoStack, step: int, prompts: Iterator[str]
) -> Round:
    """The round's `batch_size` sessions with the simulated user (the first half of `train_one_step`)."""
    ready_before, decided_before = await sample_counts(stack.up, stack.namespace)
    batch = round_prompts(prompts, settings.batch_size, settings.sessions_per_prompt)
    satisfied = await stack.client.sessions(
        scenario, batch, f"{stack.namespace}-s{step}", settings.seed + step, seed_label=f"step{step}"
    )
    return Round(step, len(batch), satisfied, ready_before, decided_before)


async def wait_for_training(stack: DemoStack, round_: Round, deadline: float) -> str:
    """Wait for the round's decisions, have the trainer step on them and the server swap to the result."""
    up, supervisor, client, namespace = stack.up, stack.supervisor, stack.client, stack.namespace
    step, ready_before = round_.step, round_.ready_before
    # every session gets two decisions (its answer, and the one-token reply that closed it)
    expected = round_.decided_before + 2 * round_.sessions
    await _wait_for_decisions(up, namespace, expected, deadline, supervisor)
    check_deadline(deadline, step, "collecting samples")
    ready, _ = await sample_counts(up, namespace)
    # partial batches: the trainer steps on whatever the round gave; full: on every complete batch of N
    # (fewer than N left pending wait for the next round, as under `orl up`)
    left_pending = 0 if stack.partial_batches else up.batch_size - 1
    asked_s = 0.0
    while (trained := await trained_counts(up, namespace))[0] < ready - left_pending:
        supervisor.check()
        check_deadline(deadline, step, "waiting for the trainer")
        if stack.partial_batches and time.monotonic() - asked_s > FLUSH_EVERY_S:  # again after a restart
            supervisor.signal("train", signal.SIGUSR1)  # train the round's samples, even fewer than N
            asked_s = time.monotonic()
        await asyncio.sleep(0.5)
    served, gate = trained[1], ""
    if up.gate and trained[1] > 0:
        served, gate = await _wait_for_gate(stack, trained[1], deadline, step)
    while await client.policy_version() < served:
        supervisor.check()
        check_deadline(deadline, step, "waiting for the hot swap")
        await asyncio.sleep(0.5)
    return (
        f"{round_.satisfied}/{round_.sessions} users satisfied, {ready - ready_before} samples "
        f"({ready - trained[0]} pending; policy v{trained[1]}, KL to base {trained[2]:.3f}){gate}"
    )


async def _wait_for_gate(stack: DemoStack, version: int, deadline: float, step: int) -> tuple[int, str]:
    """Wait until the gate decided `version` and, if it held it, promoted the trainer's restore of the
    promoted weights; (the version the server is to serve, the decision in words)."""
    while True:
        stack.supervisor.check()
        check_deadline(deadline, step, "waiting for the promotion gate")
        published, decisions = await read_gate(stack.up, stack.namespace)
        newest = max(published, default=0)
        if newest >= version and decisions.reasons.get(newest, ("",))[0] == PROMOTED:
            decision, reason = decisions.reasons.get(version, ("passed over", f"the gate decided v{newest}"))
            return newest, f"; gate: v{version} {decision} ({reason})"
        await asyncio.sleep(0.5)


async def read_gate(up: UpSettings, namespace: str) -> tuple[set[int], GateDecisions]:
    """The versions the trainer published, and the gate's decisions on them (from `checkpoints`)."""
    async with open_event_log(up.effective_log_url(), up.topic_policy()) as log:
        events = [decode(r.value) for r in await read_to_end(log, topic_name(namespace, "checkpoints"))]
    decisions = GateDecisions(up.run_id)
    published: set[int] = set()
    for event in events:
        decisions.read(event)
        if event["envelope"]["event_type"] == "CheckpointPublished" and event["run_id"] == up.run_id:
            published.add(int(event["version"]))
    return published, decisions


def gate_summary(decisions: GateDecisions) -> str:
    """One line: what the gate promoted and held."""
    held = sorted(v for v, (decision, _) in decisions.reasons.items() if decision == HELD)
    promoted = sorted(v for v, (decision, _) in decisions.reasons.items() if decision == PROMOTED)
    return f"{len(promoted)} versions promoted, {len(held)} held" + (
        f" ({', '.join(f'v{v}' for v in held)})" if held else ""
    )


async def sample_counts(up: UpSettings, namespace: str) -> tuple[int, int]:
    """(SampleReady count, all decisions) in the namespace so far."""
    rows = await read_samples(up.effective_log_url(), namespace)
    return sum(row["status"] == "ready" for row in rows), len(rows)


async def trained_counts(up: UpSettings, namespace: str, run_id: str = "") -> tuple[int, int, float]:
    """(samples the trainer of `run_id` (default: up's run) has consumed (trained or dropped as stale),
    its newest version, that step's KL)."""
    async with open_event_log(up.effective_log_url(), up.topic_policy()) as log:
        records = await read_to_end(log, topic_name(namespace, "train_steps"))
    run_id = run_id or up.run_id
    steps = [event for event in map(decode, (r.value for r in records)) if event["run_id"] == run_id]
    consumed = sum(len(s["sample_ids"]) + int(s["dropped_stale"]) for s in steps)
    newest = max(steps, key=lambda s: int(s["policy_version"]), default=None)
    if newest is None:
        return consumed, 0, 0.0
    return consumed, int(newest["policy_version"]), float(newest["kl"])


async def _wait_for_decisions(
    up: UpSettings, namespace: str, expected: int, deadline: float, supervisor: Supervisor
) -> None:
    while time.monotonic() < deadline and (await sample_counts(up, namespace))[1] < expected:
        supervisor.check()
        await asyncio.sleep(0.5)


def check_deadline(deadline: float, step: int, doing: str) -> None:
    if time.monotonic() > deadline:
        raise OrlError(f"demo step {step} timed out while {doing}; see the logs under <data-dir>/logs/")


def round_prompts(prompts: Iterator[str], batch_size: int, sessions_per_prompt: int) -> list[str]:
    """A round's prompts: `batch_size / sessions_per_prompt` of the stream's next prompts, each asked
    by `sessions_per_prompt` sessions one after another."""
    return [
        prompt
        for _ in range(batch_size // sessions_per_prompt)
        for prompt in [next(prompts)] * sessions_per_prompt
    ]


def prompt_stream(scenario: Scenario, seed: int) -> Iterator[str]:
    """The training prompts in a seeded order, repeated: every method sees the same sequence."""
    rng = random.Random(seed)
    for _ in itertools.count():
        order = list(scenario.train_prompts)
        rng.shuffle(order)
        yield from order


@dataclass
class RunClock:
    """The whole run's elapsed time and an estimate of what is left, for the progress lines."""

    total_steps: int  # seeds x methods x steps
    done_steps: int = 0
    started: float = field(default_factory=time.monotonic)

    def step_done(self) -> None:
        self.done_steps += 1

    def text(self) -> str:
        return run_time_text(time.monotonic() - self.started, self.done_steps, self.total_steps)


def run_time_text(elapsed_s: float, done_steps: int, total_steps: int) -> str:
    """'12 min so far, about 40 min left': what is left at the mean pace of the steps done (evaluations
    and stack starts included), once there is one."""
    so_far = f"{elapsed_s / 60:.0f} min so far"
    if done_steps == 0:
        return so_far
    left_s = elapsed_s / done_steps * (total_steps - done_steps)
    return f"{so_far}, about {left_s / 60:.0f} min left" if left_s > 0 else so_far


def print_progress(
    label: str, step: int, steps: int, evaluation: Evaluation | None, satisfied: str | None, clock: str
) -> None:
    parts = [f"[{label}] step {step}/{steps}"]
    if satisfied:
        parts.append(satisfied)
    if evaluation is not None:
        flat = [s for scores in evaluation.scores for s in scores]
        parts.append(
            f"held-out score {sum(flat) / len(flat):.2f} (style {evaluation.style:.2f}, "
            f"relevance {evaluation.relevance:.2f}), {evaluation.words:.0f} words"
        )
    parts.append(clock)
    print("  " + " | ".join(parts), flush=True)
