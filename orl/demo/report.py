"""The demo's report over seeds: a paper-style table, a learning-curve PNG and results.json.

Input: runs[method][seed][step], one `StepResult` per held-out evaluation (per-prompt score lists of
the first response, several samples per prompt; the relevance and style rates; the mean words). Per
seed and step it gives the mean score with a 95% cluster-bootstrap interval; per method and step, the
mean over seeds with the lowest and highest seed. results.md shows the score, the relevance and the
style at every evaluated step, each seed's curve (with several seeds) and the issue-19 targets. The
same inputs always give byte-identical files. Writes `<out_dir>/results.md`, `results.json`, `learning_curve.png`;
`merge_results` reads several runs' results.json back for one report over all of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from orl.gate.scoring import DemoDataError, bootstrap_ci

METHOD_ORDER = ("binary", "opd", "combined")
METHOD_LABELS = {"binary": "Binary RL", "opd": "OPD", "combined": "Combined"}
METHOD_COLORS = {"binary": "tab:blue", "opd": "tab:orange", "combined": "tab:green"}

# The targets of issue 19, each checked over all seeds.
BASE_SCORE_MAX = 0.2
COMBINED_MEAN_MIN = 0.9
COMBINED_MEAN_STEPS = (8, 16, 24, 32)
COMBINED_EVERY_SEED_MIN = 0.8
LATE_FROM_STEP = 8
RELEVANCE_MIN = 0.95
DRIFT_TOLERANCE = 0.1
TARGETS = {  # name in results.json: what results.md says
    "base_score_at_most_0.2": "base model (step 0) mean score <= 0.2",
    "combined_mean_at_least_0.9_at_steps_8_16_24_32": (
        "Combined mean score >= 0.9 at step 8 and at each of steps 16, 24, 32 that were evaluated"
    ),
    "combined_every_seed_at_least_0.8_from_step_8": (
        "every seed's Combined score >= 0.8 at every evaluation from step 8 on"
    ),
    "combined_relevance_at_least_0.95_everywhere": "Combined relevance >= 0.95 at every evaluation of every seed",
    "no_drift_after_step_8": "every method's mean score at its last step >= its mean score at step 8 - 0.1",
}
VERDICTS = {True: "met", False: "NOT met", None: "not evaluated"}

StepSummary = dict[str, float | None]


@dataclass(frozen=True)
class StepResult:
    """One held-out evaluation: per-prompt score lists (0..1), relevance rate, mean words and style rate
    (every check but relevance passed; None if unknown)."""

    scores: Sequence[Sequence[float]]
    relevance: float | None = None
    words: float | None = None
    style: float | None = None


Runs = Mapping[str, Mapping[int, Mapping[int, StepResult]]]  # method -> seed -> step
PerSeed = Mapping[str, Mapping[int, Mapping[int, StepSummary]]]  # method -> seed -> step
Summaries = Mapping[str, Mapping[int, StepSummary]]  # method -> step, over seeds


@dataclass(frozen=True)
class ReportFiles:
    """Where the report was written."""

    table: Path
    results: Path
    chart: Path


def ordered_methods(methods: Sequence[str]) -> list[str]:
    """Binary, OPD, Combined first (the paper's order), then any other method by name."""
    known = [m for m in METHOD_ORDER if m in methods]
    return known + sorted(m for m in methods if m not in METHOD_ORDER)


def summarize_run(results: Mapping[int, StepResult], bootstrap_seed: int = 0) -> dict[int, StepSummary]:
    """One seed's curve, per step: mean score, 95% interval, prompts, samples, relevance and words."""
    summary: dict[int, StepSummary] = {}
    for step in sorted(results):
        per_prompt = [list(map(float, s)) for s in results[step].scores]
        if any(not 0.0 <= x <= 1.0 for s in per_prompt for x in s):
            raise DemoDataError(f"step {step}: scores must lie in 0..1")
        mean, low, high = bootstrap_ci(per_prompt, seed=bootstrap_seed)
        summary[step] = {
            "score": mean,
            "ci_low": low,
            "ci_high": high,
            "prompts": len(per_prompt),
            "samples": sum(len(s) for s in per_prompt),
            "relevance": optional_float(results[step].relevance),
            "style": optional_float(results[step].style),
            "words": optional_float(results[step].words),
        }
    return summary


def summarize_seeds(curves: Mapping[int, Mapping[int, StepSummary]]) -> dict[int, StepSummary]:
    """Per step, over the seeds that evaluated it: mean, min and max of score and relevance, mean words."""
    summary: dict[int, StepSummary] = {}
    for step in sorted({step for curve in curves.values() for step in curve}):
        at_step = [curves[seed][step] for seed in sorted(curves) if step in curves[seed]]
        scores = [number(s, "score") for s in at_step]
        relevances = [s["relevance"] for s in at_step if s["relevance"] is not None]
        words = [s["words"] for s in at_step if s["words"] is not None]
        styles = [style for s in at_step if (style := s["style"]) is not None]
        summary[step] = {
            "score": mean(scores),
            "score_min": min(scores),
            "score_max": max(scores),
            "relevance": mean(relevances) if relevances else None,
            "relevance_min": min(relevances) if relevances else None,
            "relevance_max": max(relevances) if relevances else None,
            "style": mean(styles) if styles else None,
            "words": mean(words) if words else None,
            "seeds": len(at_step),
        }
    return summary


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


def number(step_summary: Mapping[str, float | None], key: str) -> float:
    value = step_summary[key]
    if value is None:
        raise DemoDataError(f"step summary has no {key}")
    return value


def seeds_of(per_seed: PerSeed) -> list[int]:
    return sorted({seed for curves in per_seed.values() for seed in curves})


def evaluated_steps(summaries: Summaries) -> list[int]:
    return sorted({step for by_step in summaries.values() for step in by_step})


def check_targets(summaries: Summaries, per_seed: PerSeed) -> dict[str, bool | None]:
    """The issue-19 targets over seeds, each True/False, or None where the run has no data for it."""
    combined = summaries.get("combined", {})
    combined_seeds = per_seed.get("combined", {})
    base = [number(by_step[0], "score") for by_step in summaries.values() if 0 in by_step]
    checked_means = [number(combined[s], "score") for s in COMBINED_MEAN_STEPS if s in combined]
    late = [
        number(v, "score")
        for curve in combined_seeds.values()
        for step, v in curve.items()
        if step >= LATE_FROM_STEP
    ]
    relevances = [
        v["relevance"]
        for curve in combined_seeds.values()
        for v in curve.values()
        if v["relevance"] is not None
    ]
    drifts = [held(by_step) for by_step in summaries.values()]
    known_drifts = [d for d in drifts if d is not None]
    return {
        "base_score_at_most_0.2": (max(base) <= BASE_SCORE_MAX) if base else None,
        "combined_mean_at_least_0.9_at_steps_8_16_24_32": (
            (min(checked_means) >= COMBINED_MEAN_MIN) if checked_means else None
        ),
        "combined_every_seed_at_least_0.8_from_step_8": (min(late) >= COMBINED_EVERY_SEED_MIN)
        if late
        else None,
        "combined_relevance_at_least_0.95_everywhere": (
            (min(relevances) >= RELEVANCE_MIN) if relevances else None
        ),
        "no_drift_after_step_8": all(known_drifts) if known_drifts else None,
    }


def held(by_step: Mapping[int, StepSummary]) -> bool | None:
    """Whether the mean score at the last step stays within the tolerance of step 8 (None without step 8)."""
    if LATE_FROM_STEP not in by_step:
        return None
    last, at_8 = number(by_step[max(by_step)], "score"), number(by_step[LATE_FROM_STEP], "score")
    return last >= at_8 - DRIFT_TOLERANCE


def score_cell(over_seeds: StepSummary | None, one_seed: StepSummary | None) -> str:
    """ "0.91 (0.84-0.97)" (mean, lowest and highest seed); with one seed, "0.91 [0.83, 0.97]" (95% CI)."""
    if over_seeds is None:
        return "n/a"
    if one_seed is not None:
        score, low, high = (number(one_seed, k) for k in ("score", "ci_low", "ci_high"))
        return f"{score:.2f} [{low:.2f}, {high:.2f}]"
    score, low, high = (number(over_seeds, k) for k in ("score", "score_min", "score_max"))
    return f"{score:.2f} ({low:.2f}-{high:.2f})"


def relevance_cell(over_seeds: StepSummary | None, several_seeds: bool) -> str:
    """ "0.97 (min 0.94)" (mean, lowest seed); with one seed "0.97"; "n/a" when not measured."""
    if over_seeds is None or over_seeds["relevance"] is None:
        return "n/a"
    if not several_seeds:
        return f"{over_seeds['relevance']:.2f}"
    return f"{over_seeds['relevance']:.2f} (min {number(over_seeds, 'relevance_min'):.2f})"


def style_cell(over_seeds: StepSummary | None) -> str:
    """ "0.94" (the mean over seeds); "n/a" when not measured."""
    if over_seeds is None or over_seeds["style"] is None:
        return "n/a"
    return f"{number(over_seeds, 'style'):.2f}"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def render_table(summaries: Summaries, per_seed: PerSeed, opd_teacher: str, scenario: str) -> str:
    """results.md: score and relevance at every evaluated step per method, each seed's curve, the targets."""
    seeds, steps, methods = seeds_of(per_seed), evaluated_steps(summaries), ordered_methods(list(summaries))
    several = len(seeds) > 1
    spread = (
        f"mean over {len(seeds)} seeds ({', '.join(map(str, seeds))}) with the lowest and highest seed"
        if several
        else f"seed {seeds[0]}, with 95% cluster-bootstrap intervals over prompts"
    )
    step_labels = [f"step {s}" for s in steps]
    score_rows = []
    for method in methods:
        by_step = summaries[method]
        one_seed = {} if several else per_seed[method][seeds[0]]  # its cells show the 95% interval
        last_words = by_step[max(by_step)]["words"]
        cells = [score_cell(by_step.get(s), one_seed.get(s)) for s in steps]
        words = f"{last_words:.1f}" if last_words is not None else "n/a"
        score_rows.append([METHOD_LABELS.get(method, method), *cells, words])
    relevance_rows = [
        [METHOD_LABELS.get(m, m), *(relevance_cell(summaries[m].get(s), several) for s in steps)]
        for m in methods
    ]
    lines = [
        f"Scenario: {scenario}. Held-out score of the first response, 0..1: {spread}. "
        f"OPD teacher: {opd_teacher}.",
        "",
        *markdown_table(["method", *step_labels, "words (last step)"], score_rows),
        "",
        "Relevance (on-topic rate of the answers)" + (": mean over seeds (lowest seed)." if several else "."),
        "",
        *markdown_table(["method", *step_labels], relevance_rows),
    ]
    if any(v["style"] is not None for by_step in summaries.values() for v in by_step.values()):
        style_rows = [
            [METHOD_LABELS.get(m, m), *(style_cell(summaries[m].get(s)) for s in steps)] for m in methods
        ]
        lines += [
            "",
            "Style: the share of answers that pass every check but relevance"
            + (" (mean over seeds)" if several else "")
            + ". The score asks for both; the CPU prototype's score was style alone.",
            "",
            *markdown_table(["method", *step_labels], style_rows),
        ]
    if several:
        seed_rows = [
            [METHOD_LABELS.get(m, m), str(seed), *seed_cells(per_seed[m].get(seed, {}), steps)]
            for m in methods
            for seed in seeds
        ]
        lines += ["", "Score of each seed.", "", *markdown_table(["method", "seed", *step_labels], seed_rows)]
    targets = check_targets(summaries, per_seed)
    lines += ["", "Targets (issue 19):", ""]
    lines += [f"- {VERDICTS[targets[name]]}: {text}" for name, text in TARGETS.items()]
    return "\n".join(lines) + "\n"


def run_lines(extra: Mapping[str, Any]) -> str:
    """results.md's closing lines: when, how long, on what machine, under what load and with which
    ORL_* variables each run was made (one line per merged run); empty for runs that did not record
    their machine."""
    runs = extra.get("merged_runs", [extra])
    lines = [
        f"- {run.get('results', 'this run')}: {run['machine']['started']}, {run.get('seconds', '?')} s, "
        f"{run['machine']['cpu']}, {run['machine']['numerics']}, load {load_text(run['machine']['load'])}"
        f"{environment_text(run.get('settings', {}).get('environment', {}))}"
        for run in runs
        if "machine" in run
    ]
    return "\n".join(["", "Runs:", "", *lines, ""]) if lines else ""


def environment_text(environment: Mapping[str, str]) -> str:
    """The ORL_* variables a run inherited (a trainer setting changed for it, say), as a clause."""
    return (
        "; with " + " ".join(f"{name}={value}" for name, value in environment.items()) if environment else ""
    )


def load_text(load: Sequence[float]) -> str:
    """[1-min at start, 1-, 5-, 15-min at the end] as words."""
    at_start, one, _, fifteen = load
    return f"{at_start:.1f} at the start, {one:.1f} at the end (15-min average {fifteen:.1f})"


def seed_cells(curve: Mapping[int, StepSummary], steps: Sequence[int]) -> list[str]:
    return [f"{number(curve[s], 'score'):.2f}" if s in curve else "n/a" for s in steps]


def plot_curves(summaries: Summaries, per_seed: PerSeed, title: str, path: Path) -> None:
    """Score (left) and relevance (right) per method against the step: the mean over seeds with the
    min-max band across seeds, or with one seed its 95% interval (Agg canvas, no pyplot)."""
    several = len(seeds_of(per_seed)) > 1
    figure = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    score_axes, relevance_axes = figure.subplots(1, 2)
    for method in ordered_methods(list(summaries)):
        by_step = summaries[method]
        steps = sorted(by_step)
        if several:
            low, high = (
                [number(by_step[s], "score_min") for s in steps],
                [number(by_step[s], "score_max") for s in steps],
            )
        else:
            curve = next(iter(per_seed[method].values()))
            low, high = (
                [number(curve[s], "ci_low") for s in steps],
                [number(curve[s], "ci_high") for s in steps],
            )
        band(score_axes, method, steps, [number(by_step[s], "score") for s in steps], low, high)
        measured = [s for s in steps if by_step[s]["relevance"] is not None]
        if measured:
            band(
                relevance_axes, method, measured, [number(by_step[s], "relevance") for s in measured],
                [number(by_step[s], "relevance_min") for s in measured],
                [number(by_step[s], "relevance_max") for s in measured],
            )  # fmt: skip
    spread = "min-max over seeds" if several else "95% CI"
    figure.suptitle(title)
    score_axes.set(xlabel="training step", ylabel=f"held-out score (mean, {spread})", ylim=(-0.02, 1.02))
    relevance_axes.axhline(RELEVANCE_MIN, color="gray", linestyle="--", linewidth=1, label="target")
    relevance_axes.set(xlabel="training step", ylabel="relevance (on-topic rate)", ylim=(-0.02, 1.02))
    for axes in (score_axes, relevance_axes):
        axes.grid(alpha=0.3)
        axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, format="png", metadata={"Software": None})


def band(
    axes: Axes, method: str, steps: list[int], middle: list[float], low: list[float], high: list[float]
) -> None:
    color = METHOD_COLORS.get(method)
    axes.plot(steps, middle, marker="o", color=color, label=METHOD_LABELS.get(method, method))
    axes.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)


def write_report(
    out_dir: Path, runs: Runs, opd_teacher: str, scenario: str, extra: Mapping[str, Any] | None = None
) -> ReportFiles:
    """Write results.md, results.json (every seed's steps, the summaries over seeds, the targets, `extra`)
    and learning_curve.png."""
    if not runs or any(not curves or not all(curves.values()) for curves in runs.values()):
        raise DemoDataError("write_report needs evaluation results for every method and seed it is given")
    per_seed = {m: {seed: summarize_run(runs[m][seed]) for seed in sorted(runs[m])} for m in runs}
    return write_summaries(out_dir, per_seed, opd_teacher, scenario, extra)


def write_summaries(
    out_dir: Path, per_seed: PerSeed, opd_teacher: str, scenario: str, extra: Mapping[str, Any] | None = None
) -> ReportFiles:
    """`write_report` from each seed's summarised curve (what results.json keeps under "per_seed")."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {m: summarize_seeds(per_seed[m]) for m in per_seed}
    methods = ordered_methods(list(per_seed))
    files = ReportFiles(out_dir / "results.md", out_dir / "results.json", out_dir / "learning_curve.png")
    files.table.write_text(render_table(summaries, per_seed, opd_teacher, scenario) + run_lines(extra or {}))
    results = {
        "scenario": scenario,
        "opd_teacher": opd_teacher,
        "seeds": seeds_of(per_seed),
        "methods": {m: {str(step): v for step, v in summaries[m].items()} for m in methods},
        "per_seed": {
            m: {str(seed): {str(step): v for step, v in curve.items()} for seed, curve in per_seed[m].items()}
            for m in methods
        },
        "targets": check_targets(summaries, per_seed),
        "extra": dict(extra or {}),
    }
    files.results.write_text(json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n")
    plot_curves(summaries, per_seed, f"orl demo: {scenario} (OPD teacher: {opd_teacher})", files.chart)
    return files


# Keys of a seed's step summary that runs written before they existed lack (read as not measured).
OPTIONAL_STEP_KEYS = ("relevance", "style", "words")


def merge_results(paths: Sequence[Path]) -> tuple[str, str, PerSeed, list[dict[str, Any]]]:
    """(scenario, OPD teacher, per-seed curves, each run's "extra" with its path) of several demo runs'
    results.json, for one report over all of them: e.g. each method run on its own, as a small machine
    would. The runs must share the scenario and the OPD teacher, and no (method, seed) may repeat."""
    if not paths:
        raise DemoDataError("merging needs at least one results.json")
    scenarios: set[tuple[str, str]] = set()
    per_seed: dict[str, dict[int, dict[int, StepSummary]]] = {}
    extras: list[dict[str, Any]] = []
    for path in paths:
        try:
            results = json.loads(Path(path).read_text())
            scenarios.add((str(results["scenario"]), str(results["opd_teacher"])))
            runs = results["per_seed"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DemoDataError(f"{path} is not an `orl demo` results.json: {error!r}") from error
        for method, curves in runs.items():
            for seed, curve in curves.items():
                if int(seed) in per_seed.get(method, {}):
                    raise DemoDataError(f"{path}: {method} seed {seed} is already in an earlier results.json")
                per_seed.setdefault(method, {})[int(seed)] = {
                    int(step): {**dict.fromkeys(OPTIONAL_STEP_KEYS), **summary}
                    for step, summary in curve.items()
                }
        extras.append({"results": str(path), **results.get("extra", {})})
    if len(scenarios) > 1:
        raise DemoDataError(f"the runs differ in scenario or OPD teacher: {sorted(scenarios)}")
    scenario, opd_teacher = scenarios.pop()
    return scenario, opd_teacher, per_seed, extras
