"""The embedded log's SQLite file locked by another process under a live `orl up` (issue 22).

Three times, another connection holds an exclusive lock on `log.db` for 10 s (as a backup tool or
a stuck reader would) under chat and feedback traffic: the server, the pipeline and the trainer wait
for it (SQLite's busy timeout is 30 s), and nothing acknowledged may be lost or duplicated. Real
processes on the real model; the run and the checks are tests/faults/harness.py and checks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.checks import check_run, results_table
from tests.faults.harness import MIN_TURNS, lock_rounds, run_fault_suite

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_a_locked_log_file_loses_and_duplicates_nothing(tmp_path: Path, base_model_dir: Path) -> None:
    run = run_fault_suite(tmp_path, lock_rounds(rounds=3, hold_s=10, seed=2))
    verdict = check_run(run)
    print(results_table(verdict))
    assert len(run.turns) >= MIN_TURNS and run.feedback, verdict.figures
    assert [o.kind for o in run.outages] == ["locked"] * 3
    assert verdict.problems == [], results_table(verdict)
    assert verdict.figures["checkpoints verified"] >= 1, results_table(verdict)
