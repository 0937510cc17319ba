"""Crash anywhere (issue 22): kill -9 of serve, both pipeline processes and the trainer at random
moments under live chat and feedback traffic loses and duplicates nothing.

Real processes on the real model (`orl up --method binary --components serve,pipeline,train`, batch
size 4); the run and the checks are tests/faults/harness.py and checks.py, shared with
benchmarks/fault_suite.py, which runs more kills and prints the figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.checks import check_run, results_table
from tests.faults.harness import MIN_TURNS, kill_rounds, run_fault_suite

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_kill_minus_nine_of_every_component_loses_and_duplicates_nothing(
    tmp_path: Path, base_model_dir: Path
) -> None:
    run = run_fault_suite(tmp_path, kill_rounds(kills=2, seed=0), gate=True)
    verdict = check_run(run)
    print(results_table(verdict))
    assert len(run.turns) >= MIN_TURNS and run.feedback, verdict.figures
    assert verdict.figures["checkpoints verified"] >= 1, verdict.figures
    assert verdict.problems == [], results_table(verdict)
