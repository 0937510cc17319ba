"""`orl demo --two-tenants`: two users with opposite preferences on one server, each training its own adapter.

Alice is the "student" (short, plain answers) and Bob the "explainer" (full answers of at least
`MIN_DETAILED_WORDS` words): the same questions, opposite wishes, so one policy trained on both would
trade one user's gain for the other's loss. The demo starts what `orl up --tenants alice,bob
--tenant-adapters --no-gate` starts (a trainer per tenant on its own run `<run>.<tenant>`, the server
answering each tenant's key with that run), holds a round of sessions per tenant each step, waits until
both trainers stepped and the server serves both new versions, and scores each tenant's held-out prompts
answered with her own key. At the last step it also scores each tenant's prompts answered by the other
tenant's adapter: what she would get from a policy trained toward the other one.

It writes results.md, results.json and learning_curve.png to the output folder, like `orl demo`. The
targets are issue 47's: each tenant's score rises by at least 0.3 within the run, and neither falls more
than 0.05 below her base score at any evaluation.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orl.demo.report import (
    ReportFiles,
    StepSummary,
    markdown_table,
    number,
    plot_curves,
    run_lines,
    score_cell,
    summarize_run,
    summarize_seeds,
)
from orl.demo.run import (
    DemoSettings,
    RunClock,
    check_deadline,
    demo_client,
    print_progress,
    prompt_stream,
    round_prompts,
    run_record,
    start_processes,
    step_result,
    trained_counts,
    up_settings,
)
from orl.demo.scenarios import Scenario, evaluation_prompts, get_scenario
from orl.demo.session_driver import DemoClient, Evaluation
from orl.samples import read_samples
from orl.schemas.errors import ConfigError
from orl.schemas.ids import tenant_run
from orl.up import Supervisor, UpSettings

TENANT_SCENARIOS = (("alice", "student"), ("bob", "explainer"))
RISE_MIN = 0.3  # issue 47: each tenant's held-out score rises at least this much
FALL_MAX = 0.05  # ... and never falls more than this below her base score


@dataclass(frozen=True)
class Tenant:
    """One simulated tenant: her name, her preference, her own run and a client holding her key."""

    name: str
    scenario: Scenario
    run_id: str
    client: DemoClient

    @property
    def label(self) -> str:
        return f"{self.name} ({self.scenario.name})"


def tenant_up_settings(settings: DemoSettings, namespace: str) -> UpSettings:
    """What `orl up --tenants alice,bob --tenant-adapters --no-gate` starts, in the demo's namespace."""
    method = settings.methods[0]
    return replace(
        up_settings(settings, method, namespace),
        tenants=tuple(name for name, _ in TENANT_SCENARIOS),
        tenant_adapters=True,
        gate=False,
    )


def run_two_tenants(settings: DemoSettings) -> int:
    """Entry point of `orl demo --two-tenants` (settings already made `effective`)."""
    if len(settings.methods) != 1:
        raise ConfigError("--two-tenants runs one method: name it with --methods (default combined)")
    tag = time.strftime("%Y%m%d-%H%M%S")
    namespace = f"demo-{tag}-tenants"
    out_dir = settings.out_dir if str(settings.out_dir) not in ("", ".") else settings.data_dir / "demo" / tag
    print(
        f"orl demo --two-tenants: {', '.join(f'{n} wants {s}' for n, s in TENANT_SCENARIOS)}, method "
        f"{settings.methods[0]}, {settings.steps} steps of {settings.batch_size} samples per tenant, no "
        f"promotion gate; report -> {out_dir}",
        flush=True,
    )
    started, started_utc = time.perf_counter(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_at_start = os.getloadavg()[0]
    curves, cross = asyncio.run(_run(settings, namespace))
    files = write_tenant_report(
        out_dir,
        curves,
        cross,
        {"namespace": namespace, **run_record(settings, started, started_utc, load_at_start)},
    )
    print(files.table.read_text())
    print(
        f"learning curve: {files.chart}\nresults: {files.results}\ntook {time.perf_counter() - started:.0f} s"
    )
    return 0


async def _run(
    settings: DemoSettings, namespace: str
) -> tuple[dict[str, dict[int, Evaluation]], dict[str, dict[str, Evaluation]]]:
    """Every tenant's curve (label -> step -> evaluation) and the last step's cross-evaluation
    (label of the prompts' tenant -> label of the answering tenant -> evaluation)."""
    up = tenant_up_settings(settings, namespace)
    supervisor, keys = start_processes(settings, up)
    tenants = []
    for name, scenario_name in TENANT_SCENARIOS:
        scenario = get_scenario(scenario_name)
        client = demo_client(settings, scenario, keys.tenant_keys[name], keys.admin_key)
        tenants.append(Tenant(name, scenario, tenant_run(up.run_id, name), client))
    try:
        await tenants[0].client.wait_ready()
        held_out = {t.name: evaluation_prompts(t.scenario, settings.eval_prompts) for t in tenants}
        curves: dict[str, dict[int, Evaluation]] = {t.label: {} for t in tenants}
        clock = RunClock(settings.steps)
        for tenant in tenants:  # step 0: no tenant run has a version, so the base model answers
            curves[tenant.label][0] = await tenant.client.evaluate(
                tenant.scenario, held_out[tenant.name], settings.eval_samples
            )
            print_progress(tenant.label, 0, settings.steps, curves[tenant.label][0], None, clock.text())
        prompts = {t.name: prompt_stream(t.scenario, settings.seed) for t in tenants}
        for step in range(1, settings.steps + 1):
            done = await train_tenants_one_step(settings, up, supervisor, tenants, step, prompts)
            evaluate = step % settings.eval_every == 0 or step == settings.steps
            clock.step_done()
            for tenant in tenants:
                if evaluate:
                    curves[tenant.label][step] = await tenant.client.evaluate(
                        tenant.scenario, held_out[tenant.name], settings.eval_samples
                    )
                print_progress(
                    tenant.label,
                    step,
                    settings.steps,
                    curves[tenant.label].get(step),
                    done[tenant.name],
                    clock.text(),
                )
        cross = {
            asked.label: {
                answering.label: await answering.client.evaluate(
                    asked.scenario, held_out[asked.name], settings.eval_samples
                )
                for answering in tenants
                if answering is not asked
            }
            for asked in tenants
        }
        return curves, cross
    finally:
        for tenant in tenants:
            await tenant.client.close()
        supervisor.stop()


async def train_tenants_one_step(
    settings: DemoSettings,
    up: UpSettings,
    supervisor: Supervisor,
    tenants: Sequence[Tenant],
    step: int,
    prompts: Mapping[str, Iterator[str]],
) -> dict[str, str]:
    """A round of `batch_size` sessions per tenant at once; then wait until every tenant's trainer
    stepped on her full batches and the server serves each one's newest version. Per tenant, a line
    on what the round gave."""
    deadline = time.monotonic() + settings.step_timeout_s
    before = await tenant_sample_counts(up, tenants)
    decided_before = sum(decided for _, decided in before.values())
    satisfied = await asyncio.gather(
        *(
            t.client.sessions(
                t.scenario,
                round_prompts(prompts[t.name], settings.batch_size, settings.sessions_per_prompt),
                session_prefix(up.namespace, t.name, step),
                settings.seed + step,
                seed_label=f"{t.name}-step{step}",
            )
            for t in tenants
        )
    )
    # every session gets two decisions (its answer, and the one-token reply that closed it)
    expected = decided_before + 2 * settings.batch_size * len(tenants)
    while sum(decided for _, decided in (await tenant_sample_counts(up, tenants)).values()) < expected:
        supervisor.check()
        check_deadline(deadline, step, "collecting samples")
        await asyncio.sleep(0.5)
    ready = await tenant_sample_counts(up, tenants)
    lines = {}
    for tenant, happy in zip(tenants, satisfied, strict=True):
        ready_now = ready[tenant.name][0]
        while (trained := await trained_counts(up, up.namespace, tenant.run_id))[0] < ready_now - (
            up.batch_size - 1
        ):
            supervisor.check()
            check_deadline(deadline, step, f"waiting for {tenant.name}'s trainer")
            await asyncio.sleep(0.5)
        while await tenant.client.run_version(tenant.run_id) < trained[1]:
            supervisor.check()
            check_deadline(deadline, step, f"waiting for the server to swap in {tenant.name}'s v{trained[1]}")
            await asyncio.sleep(0.5)
        lines[tenant.name] = (
            f"{happy}/{settings.batch_size} satisfied, {ready_now - before[tenant.name][0]} samples "
            f"({ready_now - trained[0]} pending; {tenant.run_id} v{trained[1]}, KL to base {trained[2]:.3f})"
        )
    return lines


def session_prefix(namespace: str, tenant: str, step: int) -> str:
    """The session ids of a tenant's round: `<namespace>-<tenant>-s<step>-<i>`."""
    return f"{namespace}-{tenant}-s{step}"


async def tenant_sample_counts(up: UpSettings, tenants: Sequence[Tenant]) -> dict[str, tuple[int, int]]:
    """Per tenant, (SampleReady count, all decisions) of her sessions so far (by session id)."""
    rows = await read_samples(up.effective_log_url(), up.namespace)
    counts = {}
    for tenant in tenants:
        prefix = f"{up.namespace}-{tenant.name}-s"
        own = [row for row in rows if str(row["session_id"]).startswith(prefix)]
        counts[tenant.name] = (sum(row["status"] == "ready" for row in own), len(own))
    return counts


def check_tenant_targets(per_tenant: Mapping[str, Mapping[int, StepSummary]]) -> dict[str, dict[str, bool]]:
    """Per tenant: did her score rise by RISE_MIN (last step against step 0), and did it stay within
    FALL_MAX of step 0 at every evaluation?"""
    targets = {}
    for label, curve in per_tenant.items():
        base = number(curve[0], "score")
        scores = [number(curve[step], "score") for step in sorted(curve)]
        targets[label] = {
            f"rose_at_least_{RISE_MIN}": scores[-1] - base >= RISE_MIN,
            f"never_fell_more_than_{FALL_MAX}": min(scores) >= base - FALL_MAX,
        }
    return targets


def render_tenant_table(
    per_tenant: Mapping[str, Mapping[int, StepSummary]],
    cross: Mapping[str, Mapping[str, StepSummary]],
    targets: Mapping[str, Mapping[str, bool]],
) -> str:
    """results.md: each tenant's held-out score per evaluated step, the cross-evaluation, the targets."""
    steps = sorted({step for curve in per_tenant.values() for step in curve})
    rows = [
        [
            label,
            *(score_cell(curve.get(s), curve.get(s)) for s in steps),
            f"{number(curve[max(curve)], 'words'):.1f}",
        ]
        for label, curve in per_tenant.items()
    ]
    cross_rows = [
        [
            asked,
            answering,
            score_cell(summary, summary),
            f"{number(per_tenant[asked][max(per_tenant[asked])], 'score'):.2f}",
        ]
        for asked, by_answering in cross.items()
        for answering, summary in by_answering.items()
    ]
    verdicts = [
        f"- {'met' if met else 'NOT met'}: {label} {name.replace('_', ' ')}"
        for label, by_name in targets.items()
        for name, met in by_name.items()
    ]
    return (
        "\n".join(
            [
                "Two tenants, one server, an adapter each. Held-out score of the first response, 0..1, each "
                "tenant's prompts answered with her own key, with 95% cluster-bootstrap intervals over prompts.",
                "",
                *markdown_table(["tenant", *(f"step {s}" for s in steps), "words (last step)"], rows),
                "",
                "Last step: each tenant's prompts answered by the other tenant's adapter (a policy trained "
                "toward the other preference), against her own.",
                "",
                *markdown_table(["prompts of", "answered by", "score", "own adapter"], cross_rows),
                "",
                "Targets (issue 47):",
                "",
                *verdicts,
            ]
        )
        + "\n"
    )


def write_tenant_report(
    out_dir: Path,
    curves: Mapping[str, Mapping[int, Evaluation]],
    cross: Mapping[str, Mapping[str, Evaluation]],
    extra: Mapping[str, Any],
) -> ReportFiles:
    """Write results.md, results.json and learning_curve.png of a two-tenant run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    per_tenant = {
        label: summarize_run({s: step_result(e) for s, e in curve.items()}) for label, curve in curves.items()
    }
    cross_summaries = {
        asked: {answering: summarize_run({0: step_result(e)})[0] for answering, e in by_answering.items()}
        for asked, by_answering in cross.items()
    }
    targets = check_tenant_targets(per_tenant)
    files = ReportFiles(out_dir / "results.md", out_dir / "results.json", out_dir / "learning_curve.png")
    files.table.write_text(render_tenant_table(per_tenant, cross_summaries, targets) + run_lines(extra))
    results = {
        "tenants": {
            label: {str(step): v for step, v in curve.items()} for label, curve in per_tenant.items()
        },
        "cross": cross_summaries,
        "targets": targets,
        "extra": dict(extra),
    }
    files.results.write_text(json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n")
    over_one_seed = {label: {0: curve} for label, curve in per_tenant.items()}
    summaries = {label: summarize_seeds(by_seed) for label, by_seed in over_one_seed.items()}
    plot_curves(
        summaries, over_one_seed, "orl demo --two-tenants: each tenant on her own adapter", files.chart
    )
    return files
