"""A connector from a separately installed package is discovered through the "orl.connectors" group.

Installs tests/fixtures/sample_connector_pkg (a real package with its own pyproject) into this
environment with pip, checks discovery in a fresh interpreter, then uninstalls it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fixtures" / "sample_connector_pkg"
DISTRIBUTION = "orl-sample-connector"

pytestmark = pytest.mark.slow

PROBE = """
import json
from connectors.environment.api import TurnContext, discover_connectors, load_connector, run_connector
connector = load_connector("word_count")
observation = run_connector(connector, TurnContext("s", "s/t0", response_text="one two three"), timeout_s=10)
print(json.dumps({"names": sorted(discover_connectors()), "content": observation.content,
                  "reward": observation.outcome.reward}))
"""


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def installed_plugin(tmp_path: Path) -> Iterator[None]:
    source = tmp_path / "sample_connector_pkg"
    shutil.copytree(PACKAGE, source)  # build outputs land in the copy, not in the repository
    done = pip("install", "--no-deps", "--no-build-isolation", "--no-index", str(source))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        gone = pip("uninstall", "-y", DISTRIBUTION)
        assert gone.returncode == 0, gone.stderr


def probe() -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_an_installed_plugin_is_discovered_and_runs(installed_plugin: None) -> None:
    found = probe()
    assert {"shell", "pytest", "word_count"} <= set(found["names"])
    assert found["content"] == "the answer had 3 words (budget 50)"
    assert found["reward"] == 1.0


def test_after_uninstalling_the_plugin_is_gone(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from connectors.environment.api import discover_connectors as d; print(sorted(d()))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "word_count" not in done.stdout
