"""The pytest connector: runs a test selection and reports the verdict as a structured outcome.

Runs `<python> -m pytest <selection> -q --junitxml=<temp file>` through the shell runner (same
time and output limits, same process-group kill), reads passed / failed / errors from the JUnit
report (not from the console text) and reports outcome kind "tests" with reward
`2 * passed / total - 1` (1 when every test passed, -1 when none did: terminal-rl's
`2 * accuracy - 1`). A run that produced no report (timeout, crash, usage error) counts as one
error with reward -1; a selection that collected no test reports no reward. Reads and writes no
topics.
"""

from __future__ import annotations

import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orl.connectors.environment.api import Observation, Outcome, TurnContext
from orl.connectors.environment.shell import CommandResult, render_result, run_command


@dataclass(frozen=True)
class TestVerdict:
    passed: int
    failed: int
    errors: int
    skipped: int
    reported: bool  # False: pytest wrote no report (timeout, crash, usage error)

    __test__ = False  # not a pytest test class, despite the name

    @property
    def reward(self) -> float | None:
        if not self.reported:
            return -1.0
        total = self.passed + self.failed + self.errors
        return None if total == 0 else 2.0 * self.passed / total - 1.0


def read_junit(path: Path) -> TestVerdict | None:
    """Counts from a JUnit XML report (pytest writes <testsuites><testsuite .../></testsuites>)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    try:
        root = ElementTree.parse(path).getroot()
    except ElementTree.ParseError:
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
    passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
    return TestVerdict(max(passed, 0), totals["failures"], totals["errors"], totals["skipped"], True)


def run_pytest(
    selection: list[str],
    *,
    cwd: str | Path,
    timeout_s: float,
    max_output_bytes: int = 65_536,
    python: str = sys.executable,
) -> tuple[TestVerdict, CommandResult]:
    with tempfile.TemporaryDirectory(prefix="orl-pytest-") as folder:
        report = Path(folder) / "report.xml"
        command = [python, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        result = run_command(command, cwd=cwd, timeout_s=timeout_s, max_output_bytes=max_output_bytes)
        verdict = None if result.timed_out else read_junit(report)
    if verdict is None:
        verdict = TestVerdict(0, 0, 1, 0, reported=False)
    return verdict, result


def tests_observation(verdict: TestVerdict, result: CommandResult) -> Observation:
    summary = (
        f"tests: {verdict.passed} passed, {verdict.failed} failed, {verdict.errors} errors, "
        f"{verdict.skipped} skipped"
        if verdict.reported
        else "tests: pytest produced no report"
    )
    detail: dict[str, Any] = {**result.detail(), "skipped": verdict.skipped, "reported": verdict.reported}
    return Observation(
        content=summary + "\n" + render_result(result),
        role="tool",
        outcome=Outcome(
            kind="tests",
            reward=verdict.reward,
            exit_code=result.exit_code,
            passed=verdict.passed,
            failed=verdict.failed,
            errors=verdict.errors,
            detail=detail,
        ),
    )


@dataclass
class PytestConnector:
    """Runs `context.payload["selection"]` (a list of pytest arguments, or one string) in `cwd`."""

    cwd: str = "."
    timeout_s: float = 300.0
    max_output_bytes: int = 65_536
    python: str = sys.executable
    name: str = "pytest"

    def observe(self, context: TurnContext) -> Observation | None:
        selection = context.payload.get("selection", [])
        if isinstance(selection, str):
            selection = [selection]
        if not isinstance(selection, list) or not all(isinstance(s, str) for s in selection):
            raise ValueError("payload 'selection' must be a string or a list of strings")
        verdict, result = run_pytest(
            selection,
            cwd=self.cwd,
            timeout_s=self.timeout_s,
            max_output_bytes=self.max_output_bytes,
            python=self.python,
        )
        return tests_observation(verdict, result)
