"""orl.demo.report: the table, results.json and the learning-curve PNG."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import pytest

from orl.demo.report import render_table, summarize_method, write_report
from orl.demo.scoring import DemoDataError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def curve(rates: dict[int, float], prompts: int = 16, samples: int = 4) -> dict[int, list[list[float]]]:
    """Per-prompt score lists whose overall mean is about `rate` at each step."""
    result = {}
    for step, rate in rates.items():
        ones = round(rate * prompts * samples)
        flat = [1.0 if i < ones else 0.0 for i in range(prompts * samples)]
        result[step] = [flat[p::prompts] for p in range(prompts)]
    return result


SCORES = {
    "combined": curve({0: 0.1, 4: 0.7, 8: 0.92, 12: 0.95, 16: 0.97}),
    "binary": curve({0: 0.1, 4: 0.4, 8: 0.8, 12: 0.85, 16: 0.85}),
    "opd": curve({0: 0.1, 4: 0.5, 8: 0.6, 12: 0.6, 16: 0.62}),
}
RELEVANCE = {m: {s: 0.97 for s in by_step} for m, by_step in SCORES.items()}
WORDS = {m: {s: 60.0 - 2 * s for s in by_step} for m, by_step in SCORES.items()}


def report(out_dir: Path):
    return write_report(out_dir, SCORES, RELEVANCE, WORDS, "frozen reference + hint", "student", {"seed": 0})


def test_report_writes_a_real_png_a_table_and_results(tmp_path: Path) -> None:
    files = report(tmp_path)
    png = files.chart.read_bytes()
    assert len(png) > 0 and png.startswith(PNG_SIGNATURE)
    image = matplotlib.image.imread(files.chart)
    assert image.shape[0] > 100 and image.shape[1] > 100
    table = files.table.read_text()
    for label in ("Binary RL", "OPD", "Combined", "step 0", "step 8", "step 16", "frozen reference + hint"):
        assert label in table
    assert table.index("Binary RL") < table.index("| OPD") < table.index("Combined")
    results = json.loads(files.results.read_text())
    assert results["opd_teacher"] == "frozen reference + hint"
    assert results["methods"]["combined"]["8"]["score"] == pytest.approx(59 / 64)
    assert results["targets"] == {
        "base_score_at_most_0.2": True,
        "combined_at_least_0.9_from_step_8": True,
        "relevance_at_least_0.95_everywhere": True,
    }
    assert results["extra"] == {"seed": 0}


def test_report_is_byte_identical_for_the_same_inputs(tmp_path: Path) -> None:
    first, second = report(tmp_path / "a"), report(tmp_path / "b")
    for a, b in ((first.table, second.table), (first.results, second.results), (first.chart, second.chart)):
        assert a.read_bytes() == b.read_bytes()


def test_table_rows_carry_intervals_and_missing_steps_say_n_a() -> None:
    summaries = {"opd": summarize_method(curve({0: 0.25, 4: 0.5}), {0: 1.0, 4: 0.9}, {0: 50.0, 4: 30.0})}
    table = render_table(summaries, "live policy + hint", "teacher")
    row = next(line for line in table.splitlines() if line.startswith("| OPD"))
    assert "0.25 [" in row
    assert row.count("n/a") == 2  # steps 8 and 16 were not evaluated
    assert "| 0.90 |" in row and "30.0" in row


def test_missing_relevance_is_null_in_results_and_targets_unknown(tmp_path: Path) -> None:
    files = write_report(tmp_path, {"binary": curve({0: 0.5})}, {}, {}, "frozen reference + hint", "student")
    results = json.loads(files.results.read_text())
    assert results["methods"]["binary"]["0"]["relevance"] is None
    assert results["targets"]["relevance_at_least_0.95_everywhere"] is None
    assert results["targets"]["combined_at_least_0.9_from_step_8"] is None


def test_bad_inputs_are_demo_data_errors(tmp_path: Path) -> None:
    with pytest.raises(DemoDataError):
        write_report(tmp_path, {}, {}, {}, "frozen reference + hint", "student")
    with pytest.raises(DemoDataError):
        write_report(tmp_path, {"opd": {0: [[1.5]]}}, {}, {}, "frozen reference + hint", "student")
