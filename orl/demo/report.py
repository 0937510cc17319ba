"""The demo's report: a paper-style table, a learning-curve PNG and results.json from evaluation results.

Input, per method ("binary", "opd", "combined"): {step: per-prompt score lists} (the held-out score of the
first response, several samples per prompt), plus {step: relevance rate} and {step: mean words}. The
table shows the score at steps 0, 8 and 16 with 95% cluster-bootstrap intervals, the lowest relevance
over all evaluations, the words at the last step, and which OPD teacher was used. The same inputs
always give byte-identical files. Writes `<out_dir>/results.md`, `results.json`, `learning_curve.png`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from orl.demo.scoring import DemoDataError, bootstrap_ci

METHOD_ORDER = ("binary", "opd", "combined")
METHOD_LABELS = {"binary": "Binary RL", "opd": "OPD", "combined": "Combined"}
METHOD_COLORS = {"binary": "tab:blue", "opd": "tab:orange", "combined": "tab:green"}
TABLE_STEPS = (0, 8, 16)
RELEVANCE_TARGET = 0.95
BASE_SCORE_TARGET = 0.2
COMBINED_TARGET = 0.9

ScoresByStep = Mapping[int, Sequence[Sequence[float]]]
StepSummary = dict[str, float | None]  # score, ci_low, ci_high, prompts, samples; relevance, words or None


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


def summarize_method(
    scores: ScoresByStep, relevance: Mapping[int, float], words: Mapping[int, float], seed: int = 0
) -> dict[int, StepSummary]:
    """Per step: mean score, 95% interval, prompts, samples, relevance and mean words (None if not given)."""
    summary: dict[int, StepSummary] = {}
    for step in sorted(scores):
        per_prompt = [list(map(float, s)) for s in scores[step]]
        if any(not 0.0 <= x <= 1.0 for s in per_prompt for x in s):
            raise DemoDataError(f"step {step}: scores must lie in 0..1")
        mean, low, high = bootstrap_ci(per_prompt, seed=seed)
        summary[step] = {
            "score": mean,
            "ci_low": low,
            "ci_high": high,
            "prompts": len(per_prompt),
            "samples": sum(len(s) for s in per_prompt),
            "relevance": optional_float(relevance.get(step)),
            "words": optional_float(words.get(step)),
        }
    return summary


def optional_float(value: float | None) -> float | None:
    return None if value is None else float(value)


Summaries = Mapping[str, Mapping[int, StepSummary]]


def check_targets(summaries: Summaries) -> dict[str, bool | None]:
    """The demo's targets (issue 9), each True/False, or None where the run has no data for it."""
    base = [number(s[0], "score") for s in summaries.values() if 0 in s]
    late = [number(v, "score") for step, v in summaries.get("combined", {}).items() if step >= 8]
    relevances = [
        v["relevance"] for s in summaries.values() for v in s.values() if v["relevance"] is not None
    ]
    return {
        "base_score_at_most_0.2": (max(base) <= BASE_SCORE_TARGET) if base else None,
        "combined_at_least_0.9_from_step_8": (min(late) >= COMBINED_TARGET) if late else None,
        "relevance_at_least_0.95_everywhere": (min(relevances) >= RELEVANCE_TARGET) if relevances else None,
    }


def number(step_summary: Mapping[str, float | None], key: str) -> float:
    value = step_summary[key]
    if value is None:
        raise DemoDataError(f"step summary has no {key}")
    return value


def cell(step_summary: Mapping[str, float | None] | None) -> str:
    """ "0.91 [0.83, 0.97]", or "n/a" for a step that was not evaluated."""
    if step_summary is None:
        return "n/a"
    score, low, high = (number(step_summary, k) for k in ("score", "ci_low", "ci_high"))
    return f"{score:.2f} [{low:.2f}, {high:.2f}]"


def render_table(
    summaries: Summaries, opd_teacher: str, scenario: str, steps: Sequence[int] = TABLE_STEPS
) -> str:
    """The markdown table: score [95% CI] at `steps` per method, min relevance, words at the last step."""
    header = ["method", *(f"step {s}" for s in steps), "min relevance", "words (last step)"]
    lines = [
        f"Scenario: {scenario}. Held-out score of the first response, 0..1, with 95% cluster-bootstrap "
        f"intervals over prompts. OPD teacher: {opd_teacher}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for method in ordered_methods(list(summaries)):
        by_step = summaries[method]
        relevances = [v["relevance"] for v in by_step.values() if v["relevance"] is not None]
        last_words = by_step[max(by_step)]["words"] if by_step else None
        row = [
            METHOD_LABELS.get(method, method),
            *(cell(by_step.get(s)) for s in steps),
            f"{min(relevances):.2f}" if relevances else "n/a",
            f"{last_words:.1f}" if last_words is not None else "n/a",
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(summaries: Summaries, title: str, path: Path) -> None:
    """Score against training step per method, with the 95% interval as a band (Agg canvas, no pyplot)."""
    figure = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots()
    for method in ordered_methods(list(summaries)):
        steps = sorted(summaries[method])
        points = [summaries[method][s] for s in steps]
        color = METHOD_COLORS.get(method)
        label = METHOD_LABELS.get(method, method)
        axes.plot(steps, [number(p, "score") for p in points], marker="o", color=color, label=label)
        low, high = [number(p, "ci_low") for p in points], [number(p, "ci_high") for p in points]
        axes.fill_between(steps, low, high, color=color, alpha=0.2, linewidth=0)
    axes.set(xlabel="training step", ylabel="held-out score (95% CI)", ylim=(-0.02, 1.02), title=title)
    axes.grid(alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, format="png", metadata={"Software": None})


def write_report(
    out_dir: Path,
    scores: Mapping[str, ScoresByStep],
    relevance: Mapping[str, Mapping[int, float]],
    words: Mapping[str, Mapping[int, float]],
    opd_teacher: str,
    scenario: str,
    extra: Mapping[str, Any] | None = None,
    steps: Sequence[int] = TABLE_STEPS,
) -> ReportFiles:
    """Write results.md (the table), results.json (every step, the targets, `extra`) and learning_curve.png."""
    if not scores:
        raise DemoDataError("write_report needs evaluation results for at least one method")
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {m: summarize_method(scores[m], relevance.get(m, {}), words.get(m, {})) for m in scores}
    files = ReportFiles(out_dir / "results.md", out_dir / "results.json", out_dir / "learning_curve.png")
    files.table.write_text(render_table(summaries, opd_teacher, scenario, steps))
    results = {
        "scenario": scenario,
        "opd_teacher": opd_teacher,
        "methods": {
            m: {str(k): v for k, v in summaries[m].items()} for m in ordered_methods(list(summaries))
        },
        "targets": check_targets(summaries),
        "extra": dict(extra or {}),
    }
    files.results.write_text(json.dumps(results, indent=2, sort_keys=True, allow_nan=False) + "\n")
    plot_curves(summaries, f"orl demo: {scenario} (OPD teacher: {opd_teacher})", files.chart)
    return files
