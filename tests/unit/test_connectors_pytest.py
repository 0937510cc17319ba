"""The pytest connector: a structured verdict and a reward from a real pytest run."""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.connectors.environment.api import TurnContext
from orl.connectors.environment.pytest_runner import PytestConnector, TestVerdict, read_junit

pytestmark = pytest.mark.slow

TESTS = """
def test_one(): assert 1 + 1 == 2
def test_two(): assert "a".upper() == "A"
def test_three(): assert 2 * 2 == 5
"""


def observe(folder: Path, selection: object, timeout_s: float = 60) -> dict:
    connector = PytestConnector(cwd=str(folder), timeout_s=timeout_s)
    observation = connector.observe(TurnContext("s", "s/t0", payload={"selection": selection}))
    assert observation is not None and observation.outcome is not None
    assert observation.outcome.kind == "tests"
    return observation.outcome.record() | {"content": observation.content}


def test_counts_passed_and_failed_and_scores_the_fraction(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    outcome = observe(tmp_path, ["test_sample.py"])
    assert (outcome["passed"], outcome["failed"], outcome["errors"]) == (2, 1, 0)
    assert outcome["reward"] == pytest.approx(2 * 2 / 3 - 1)
    assert outcome["exit_code"] == 1
    assert "2 passed, 1 failed" in outcome["content"]


def test_a_green_selection_scores_one(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    outcome = observe(tmp_path, "test_sample.py::test_one")
    assert (outcome["passed"], outcome["failed"], outcome["reward"]) == (1, 0, 1.0)


def test_a_collection_error_counts_as_an_error(tmp_path: Path) -> None:
    (tmp_path / "test_broken.py").write_text("def test_x(:\n")
    outcome = observe(tmp_path, ["test_broken.py"])
    assert outcome["errors"] >= 1 and outcome["reward"] == -1.0


def test_an_empty_selection_reports_no_reward(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    outcome = observe(tmp_path, ["test_sample.py", "-k", "nothing_matches"])
    assert outcome["passed"] == 0 and outcome["failed"] == 0 and outcome["reward"] is None


def test_a_hanging_test_run_is_killed_and_scored_as_an_error(tmp_path: Path) -> None:
    (tmp_path / "test_slow.py").write_text("import time\ndef test_slow(): time.sleep(60)\n")
    outcome = observe(tmp_path, ["test_slow.py"], timeout_s=3)
    assert outcome["errors"] == 1 and outcome["reward"] == -1.0
    assert "produced no report" in outcome["content"]


def test_a_malformed_selection_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="selection"):
        PytestConnector(cwd=str(tmp_path)).observe(TurnContext("s", "s/t0", payload={"selection": 3}))


def test_read_junit_handles_missing_and_garbled_reports(tmp_path: Path) -> None:
    assert read_junit(tmp_path / "none.xml") is None
    garbled = tmp_path / "bad.xml"
    garbled.write_text("<testsuites><testsuite")
    assert read_junit(garbled) is None
    good = tmp_path / "good.xml"
    good.write_text('<testsuites><testsuite tests="4" failures="1" errors="1" skipped="1"/></testsuites>')
    assert read_junit(good) == TestVerdict(passed=1, failed=1, errors=1, skipped=1, reported=True)
