"""orl.demo.report: the multi-seed table, results.json, the targets and the learning-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest
from orl.gate.scoring import DemoDataError

from orl.demo.report import (
    StepResult,
    check_targets,
    merge_results,
    summarize_run,
    summarize_seeds,
    write_report,
    write_summaries,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROMPTS, SAMPLES = 16, 4
STEPS = (0, 4, 8, 12, 16, 20, 24, 28, 32)


def exact(rate: float) -> float:
    """The mean score `curve` really gives for `rate` (a whole number of 64 samples)."""
    return round(rate * PROMPTS * SAMPLES) / (PROMPTS * SAMPLES)


def curve(rates: dict[int, float], relevance: float | None = 0.97) -> dict[int, StepResult]:
    """One seed's evaluations: per-prompt score lists whose overall mean is `exact(rate)` at each step."""
    result = {}
    for step, rate in rates.items():
        ones = round(rate * PROMPTS * SAMPLES)
        flat = [1.0 if i < ones else 0.0 for i in range(PROMPTS * SAMPLES)]
        scores = [flat[p::PROMPTS] for p in range(PROMPTS)]
        result[step] = StepResult(scores, relevance, 60.0 - step, style=min(1.0, rate + 0.05))
    return result


def rising(final: float) -> dict[int, float]:
    """0.1 at step 0, then `final` from step 8 on (0.5 at step 4)."""
    return {s: 0.1 if s == 0 else 0.5 if s == 4 else final for s in STEPS}


SEEDS = (3, 4, 5)  # the first seed is --seed, not always 0
COMBINED_FINAL = {3: 0.92, 4: 0.95, 5: 0.89}
RUNS = {
    "combined": {seed: curve(rising(COMBINED_FINAL[seed])) for seed in SEEDS},
    "binary": {seed: curve(rising(0.8 + 0.01 * i)) for i, seed in enumerate(SEEDS)},
    "opd": {seed: curve(rising(0.6)) for seed in SEEDS},
}
ALL_MET = {
    "base_score_at_most_0.2": True,
    "combined_mean_at_least_0.9_at_steps_8_16_24_32": True,
    "combined_every_seed_at_least_0.8_from_step_8": True,
    "combined_relevance_at_least_0.95_everywhere": True,
    "no_drift_after_step_8": True,
}


def report(out_dir: Path, runs: dict[str, dict[int, dict[int, StepResult]]] = RUNS):
    return write_report(out_dir, runs, "frozen reference + hint", "student", {"namespaces": {"combined": {}}})


def row(table: str, start: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(start))


def test_results_json_has_means_spreads_and_every_seed(tmp_path: Path) -> None:
    results = json.loads(report(tmp_path).results.read_text())
    assert results["seeds"] == [3, 4, 5]
    assert set(results["methods"]) == {"binary", "opd", "combined"}
    at_8 = results["methods"]["combined"]["8"]
    finals = [exact(COMBINED_FINAL[s]) for s in SEEDS]
    assert at_8["score"] == pytest.approx(sum(finals) / 3)
    assert (at_8["score_min"], at_8["score_max"]) == (min(finals), max(finals))
    assert at_8["relevance"] == pytest.approx(0.97) and at_8["relevance_min"] == 0.97 and at_8["seeds"] == 3
    assert at_8["style"] == pytest.approx(sum(COMBINED_FINAL[s] + 0.05 for s in SEEDS) / 3)
    assert set(results["per_seed"]["combined"]) == {"3", "4", "5"}
    assert set(results["per_seed"]["combined"]["5"]) == {str(s) for s in STEPS}
    assert results["per_seed"]["combined"]["5"]["32"]["score"] == exact(0.89)
    assert results["per_seed"]["combined"]["5"]["32"]["ci_low"] <= exact(0.89)
    assert results["targets"] == ALL_MET
    assert results["extra"] == {"namespaces": {"combined": {}}}


def test_table_has_every_evaluated_step_spreads_relevance_seeds_and_targets(tmp_path: Path) -> None:
    table = report(tmp_path).table.read_text()
    assert table.startswith("Scenario: student.") and "mean over 3 seeds (3, 4, 5)" in table
    assert "frozen reference + hint" in table
    header = row(table, "| method | step 0")
    assert all(f"| step {s} |" in header for s in STEPS)
    mean_8 = sum(exact(COMBINED_FINAL[s]) for s in SEEDS) / 3
    assert f"| {mean_8:.2f} ({exact(0.89):.2f}-{exact(0.95):.2f}) |" in row(table, "| Combined |")
    assert table.index("| Binary RL |") < table.index("| OPD |") < table.index("| Combined |")
    relevance = table.split("Relevance")[1]
    assert "| 0.97 (min 0.97) |" in row(relevance, "| Combined |")
    style = table.split("Style:")[1]
    assert row(style, "| Combined |").startswith("| Combined | 0.15 | 0.55 | 0.97 |")
    per_seed = table.split("Score of each seed.")[1]
    assert row(per_seed, "| Combined | 5 |").endswith(f"| {exact(0.89):.2f} |")
    assert len([line for line in per_seed.splitlines() if line.startswith("| OPD |")]) == 3
    assert "Targets (issue 19):" in table
    assert table.count("- met: ") == 5 and "NOT met" not in table


def test_report_writes_a_real_png(tmp_path: Path) -> None:
    files = report(tmp_path)
    assert files.chart.read_bytes().startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(files.chart)
    assert image.shape[0] > 100 and image.shape[1] > image.shape[0]  # two panels side by side


def test_report_is_byte_identical_for_the_same_inputs(tmp_path: Path) -> None:
    first, second = report(tmp_path / "a"), report(tmp_path / "b")
    for a, b in ((first.table, second.table), (first.results, second.results), (first.chart, second.chart)):
        assert a.read_bytes() == b.read_bytes()


def targets_for(runs: dict[str, dict[int, dict[int, StepResult]]]) -> dict[str, bool | None]:
    per_seed = {m: {seed: summarize_run(c) for seed, c in by_seed.items()} for m, by_seed in runs.items()}
    return check_targets({m: summarize_seeds(per_seed[m]) for m in per_seed}, per_seed)


@pytest.mark.parametrize(
    ("runs", "missed"),
    [
        # the base model already scores 0.3 (every seed and method shares step 0)
        (
            {m: {s: {**c, 0: curve({0: 0.3})[0]} for s, c in by_seed.items()} for m, by_seed in RUNS.items()},
            "base_score_at_most_0.2",
        ),
        # every seed >= 0.8, but the mean stays under 0.9
        (
            {"combined": {s: curve(rising(f)) for s, f in zip(SEEDS, (0.85, 0.88, 0.9), strict=True)}},
            "combined_mean_at_least_0.9_at_steps_8_16_24_32",
        ),
        # the mean is fine, one seed falls to 0.75 at step 28
        (
            {"combined": {**RUNS["combined"], 6: curve({**rising(1.0), 28: 0.75})}},
            "combined_every_seed_at_least_0.8_from_step_8",
        ),
        # one seed's answers drift off topic at one evaluation
        (
            {"combined": {**RUNS["combined"], 6: {**curve(rising(0.95)), 16: curve({16: 0.95}, 0.9)[16]}}},
            "combined_relevance_at_least_0.95_everywhere",
        ),
        # OPD falls from 0.6 at step 8 to 0.45 at step 32
        ({**RUNS, "opd": {s: curve({**rising(0.6), 32: 0.45}) for s in SEEDS}}, "no_drift_after_step_8"),
    ],
)
def test_each_target_can_be_missed(runs: dict[str, dict[int, dict[int, StepResult]]], missed: str) -> None:
    assert targets_for(runs) == {**ALL_MET, missed: False}


def test_targets_without_the_steps_they_need_are_not_evaluated(tmp_path: Path) -> None:
    quick = {"combined": {0: curve({0: 0.12, 1: 0.38, 2: 0.62})}}  # what `orl demo --quick` evaluates
    assert targets_for(quick) == {
        "base_score_at_most_0.2": True,
        "combined_mean_at_least_0.9_at_steps_8_16_24_32": None,
        "combined_every_seed_at_least_0.8_from_step_8": None,
        "combined_relevance_at_least_0.95_everywhere": True,
        "no_drift_after_step_8": None,
    }
    table = report(tmp_path, quick).table.read_text()
    assert table.count("- not evaluated: ") == 3 and table.count("- met: ") == 2


def test_a_mean_checked_only_at_evaluated_steps() -> None:
    # steps 16 and 24 were not evaluated: only 8 and 32 count, and they are met
    runs = {"combined": {0: curve({0: 0.1, 8: 0.95, 32: 0.95}), 1: curve({0: 0.1, 8: 0.9, 32: 0.92})}}
    assert targets_for(runs)["combined_mean_at_least_0.9_at_steps_8_16_24_32"] is True


def test_one_seed_reads_like_one_run(tmp_path: Path) -> None:
    runs = {m: {0: by_seed[3]} for m, by_seed in RUNS.items()}
    files = report(tmp_path, runs)
    table = files.table.read_text()
    assert "seed 0, with 95% cluster-bootstrap intervals" in table
    assert "Score of each seed" not in table and "(min " not in table
    combined = row(table, "| Combined |")
    assert f"| {exact(0.92):.2f} [" in combined and "-" not in combined
    assert "| 0.97 |" in row(table.split("Relevance")[1], "| Combined |")
    results = json.loads(files.results.read_text())
    assert results["seeds"] == [0]
    for step in ("0", "8", "32"):  # the mean over one seed is that seed's score
        assert (
            results["methods"]["combined"][step]["score"]
            == results["per_seed"]["combined"]["0"][step]["score"]
        )
    assert results["methods"]["combined"]["8"]["score"] == exact(0.92)


def test_missing_relevance_is_null_in_results_and_its_target_unknown(tmp_path: Path) -> None:
    files = report(tmp_path, {"combined": {0: curve({0: 0.5, 8: 0.95}, relevance=None)}})
    results = json.loads(files.results.read_text())
    assert results["methods"]["combined"]["0"]["relevance"] is None
    assert results["targets"]["combined_relevance_at_least_0.95_everywhere"] is None
    assert "| n/a | n/a |" in row(files.table.read_text().split("Relevance")[1], "| Combined |")


def test_bad_inputs_are_demo_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DemoDataError):
        report(tmp_path, {})
    with pytest.raises(DemoDataError):
        report(tmp_path, {"opd": {}})
    with pytest.raises(DemoDataError):
        report(tmp_path, {"opd": {0: {}}})
    with pytest.raises(DemoDataError):
        report(tmp_path, {"opd": {0: {0: StepResult([[1.5]])}}})


def test_runs_of_one_method_each_merge_into_the_report_of_all(tmp_path: Path) -> None:
    # Each method run on its own (as a small machine would) merges into the report one run of all gives.
    parts = [report(tmp_path / method, {method: RUNS[method]}).results for method in RUNS]
    scenario, opd_teacher, per_seed, runs = merge_results(parts)
    merged = write_summaries(tmp_path / "merged", per_seed, opd_teacher, scenario, {"runs": runs})
    whole = report(tmp_path / "whole")
    assert merged.table.read_text() == whole.table.read_text()
    assert merged.chart.read_bytes() == whole.chart.read_bytes()
    results = json.loads(merged.results.read_text())
    assert results["targets"] == ALL_MET
    assert [r["results"] for r in results["extra"]["runs"]] == [str(p) for p in parts]


def test_a_run_written_before_the_style_was_reported_merges_without_it(tmp_path: Path) -> None:
    path = report(tmp_path / "old", {"combined": RUNS["combined"]}).results
    results = json.loads(path.read_text())
    for curve_by_step in results["per_seed"]["combined"].values():
        for summary in curve_by_step.values():
            del summary["style"]
    path.write_text(json.dumps(results))
    _, _, per_seed, _ = merge_results([path])
    table = write_summaries(tmp_path / "merged", per_seed, "frozen", "student").table.read_text()
    assert "Style:" not in table and "| Combined |" in table


def test_merging_refuses_a_seed_twice_other_scenarios_and_foreign_files(tmp_path: Path) -> None:
    combined = report(tmp_path / "a", {"combined": RUNS["combined"]}).results
    again = report(tmp_path / "b", {"combined": {3: RUNS["combined"][3]}}).results
    with pytest.raises(DemoDataError, match="combined seed 3 is already in an earlier results.json"):
        merge_results([combined, again])
    teacher = write_report(tmp_path / "c", {"binary": RUNS["binary"]}, "frozen reference + hint", "teacher")
    with pytest.raises(DemoDataError, match="differ in scenario or OPD teacher"):
        merge_results([combined, teacher.results])
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(DemoDataError, match="is not an `orl demo` results.json"):
        merge_results([tmp_path / "other.json"])
    with pytest.raises(DemoDataError, match="at least one"):
        merge_results([])


def test_orl_demo_merge_writes_the_report_where_asked_and_needs_a_place(tmp_path: Path) -> None:
    from orl.schemas.errors import ConfigError

    from orl.demo.run import DemoSettings, run_demo

    part = report(tmp_path / "binary", {"binary": RUNS["binary"]}).results
    with pytest.raises(ConfigError, match="--merge needs --out-dir"):
        run_demo(DemoSettings(merge=(str(part),)))
    assert run_demo(DemoSettings(merge=(str(part),), out_dir=tmp_path / "merged")) == 0
    assert "| Binary RL |" in (tmp_path / "merged" / "results.md").read_text()


def test_the_report_names_each_runs_machine_and_load(tmp_path: Path) -> None:
    def machine(cpu: str, numerics: str) -> dict:
        return {
            "cpu": cpu,
            "numerics": numerics,
            "started": "2026-11-27 16:00 UTC",
            "load": [0.5, 2.1, 2.0, 1.8],
        }

    avx2 = write_report(
        tmp_path / "a",
        {"combined": RUNS["combined"]},
        "frozen reference + hint",
        "student",
        {"machine": machine("EPYC", "fp32")},
    )
    table = avx2.table.read_text()
    assert "- this run: 2026-11-27 16:00 UTC, ? s, EPYC, fp32, load 0.5 at the start, 2.1 at the end" in table
    bf16 = write_report(
        tmp_path / "b",
        {"binary": RUNS["binary"]},
        "frozen reference + hint",
        "student",
        {
            "machine": machine("Xeon", "bf16"),
            "seconds": 60,
            "settings": {"environment": {"ORL_TRAIN_CENTER_REWARDS": "true"}},
        },
    )
    unrecorded = report(
        tmp_path / "c", {"opd": RUNS["opd"]}
    ).results  # written before runs kept their machine
    _, _, per_seed, runs = merge_results([avx2.results, bf16.results, unrecorded])
    merged = write_summaries(
        tmp_path / "m", per_seed, "frozen reference + hint", "student", {"merged_runs": runs}
    )
    lines = [
        line for line in merged.table.read_text().splitlines() if line.startswith("- ") and " UTC, " in line
    ]
    assert [line.split(":")[0] for line in lines] == [f"- {avx2.results}", f"- {bf16.results}"]
    assert "60 s, Xeon, bf16" in lines[1]
    assert lines[1].endswith("; with ORL_TRAIN_CENTER_REWARDS=true") and "; with" not in lines[0]
    assert "Runs:" not in report(tmp_path / "d").table.read_text()
