"""`orl demo --quick` end to end: the README's main command, on the real model, as a user runs it.

Checks that it completed, that the server activated the new checkpoints, and only those the
promotion gate promoted, that the table and the PNG were written, and that it learned: with its
fixed seed, the score on the evaluation prompts (which neither the sessions nor the gate ask) after
four steps is at least 0.125 above the base model's (2 more of its 16 answers satisfy the user).
Runs with one seed differ from each other, so the bound sits below their spread: over seeds 0-4 on
the 2-core AMD EPYC VM (bf16) the rise at step 4 was +0.19..+0.50, and seed 0 alone gave +0.50,
+0.38 and, twice inside the CI suite, +0.19 (docs/results.md, "The quick demo"). The time it takes
is the loop benchmark's business, not this test's.
`orl report` then rebuilds the demo's held-out scores from the log alone, one version per step.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.model import test_cache_dir
from tests.integration.log_reading import read_events
from tests.integration.serve_process import free_port

pytestmark = [pytest.mark.model, pytest.mark.slow]


# A guard against a hang, not a speed check: the quick demo took 432 s alone on the 2-core Intel Xeon VM
# (2026-12-07) and over 600 s beside another test worker in CI.
@pytest.mark.timeout(1200)
def test_quick_demo_trains_swaps_and_reports(tmp_path: Path, base_model_dir: Path) -> None:
    out = tmp_path / "report"
    env = {**os.environ, "ORL_MODEL_CACHE": str(test_cache_dir())}
    done = subprocess.run(
        [sys.executable, "-m", "orl.cli", "demo", "--quick", "--data-dir", str(tmp_path / "data"),
         "--out-dir", str(out), "--port", str(free_port())],
        env=env, capture_output=True, text=True, timeout=1150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| Combined |" in done.stdout
    assert "compute budget: " in done.stdout and "numerics " in done.stdout
    assert (out / "results.md").read_text().startswith("Scenario: student")
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "results.json").read_text())
    namespace = results["extra"]["namespaces"]["combined"][str(results["seeds"][0])]
    log_url = f"sqlite:///{tmp_path / 'data' / 'log.db'}"
    activations = asyncio.run(read_events(log_url, f"{namespace}.policy_activations"))
    versions = [e["version"] for e in activations if e["envelope"]["event_type"] == "PolicyActivated"]
    assert versions and max(versions) >= 2, versions
    # the promotion gate (on by default) decided every trained version; only promoted ones were served
    checkpoints = asyncio.run(read_events(log_url, f"{namespace}.checkpoints"))
    decided = {
        e["version"]: e["decision"] for e in checkpoints if e["envelope"]["event_type"] == "PolicyGated"
    }
    published = {e["version"] for e in checkpoints if e["envelope"]["event_type"] == "CheckpointPublished"}
    assert decided and set(decided) == published, (decided, published)
    assert {v for v in versions if v > 0} <= {v for v, decision in decided.items() if decision == "promoted"}
    summary = results["extra"]["gate"]["combined"][str(results["seeds"][0])]
    assert summary.startswith(f"{sum(d == 'promoted' for d in decided.values())} versions promoted"), summary
    scores = {step: row["score"] for step, row in results["methods"]["combined"].items()}
    assert set(scores) == {"0", "1", "2", "3", "4"}
    assert scores["4"] >= scores["0"] + 0.125, scores

    from orl.cli import main

    report_dir = tmp_path / "orl-report"
    where = ["--data-dir", str(tmp_path / "data"), "--namespace", namespace]
    assert main(["report", *where, "--scenario", "student", "--out-dir", str(report_dir)]) == 0
    rows = json.loads((report_dir / "report.json").read_text())
    held_out = {r["version"]: r["held_out_score"]["mean"] for r in rows if r["held_out_score"]}
    # the demo waits for each step's version (or, if the gate held it, the promoted one) before it evaluates
    served = sorted({0, *versions})
    assert sorted(held_out) == served, rows
    steps = ("0", "1", "2", "3", "4")
    demo_styles = [results["methods"]["combined"][step]["style"] for step in steps]
    assert all(style >= scores[step] for style, step in zip(demo_styles, steps, strict=True))
    if served == [0, 1, 2, 3, 4]:  # every version promoted: step k evaluated version k alone
        assert [held_out[v] for v in served] == [scores[step] for step in steps]
        # style (every check but relevance) agrees between the demo's report and the log's
        styles = {r["version"]: r["held_out_style"] for r in rows if r["held_out_score"]}
        assert [styles[v] for v in served] == pytest.approx(demo_styles)
    assert all(
        r["approval"] is not None for r in rows if r["version"] < 2
    )  # versions 0 and 1 served sessions
    assert (report_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
