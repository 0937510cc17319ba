"""A connector from a separately installed package is discovered through the "orl.connectors" group.

Installs tests/fixtures/sample_connector_pkg (a real package with its own pyproject) into this
environment with pip, checks discovery in a fresh interpreter, then uninstalls it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.plugins import installed, last_line_printed

PACKAGE = Path(__file__).resolve().parents[1] / "fixtures" / "sample_connector_pkg"
DISTRIBUTION = "orl-sample-connector"

pytestmark = pytest.mark.slow

PROBE = """
import json
from orl.connectors.environment.api import TurnContext, discover_connectors, load_connector, run_connector
connector = load_connector("word_count")
observation = run_connector(connector, TurnContext("s", "s/t0", response_text="one two three"), timeout_s=10)
print(json.dumps({"names": sorted(discover_connectors()), "content": observation.content,
                  "reward": observation.outcome.reward}))
"""


@pytest.fixture
def installed_plugin(tmp_path: Path) -> Iterator[None]:
    with installed(PACKAGE, DISTRIBUTION, tmp_path):
        yield


def probe() -> dict:
    found: dict = json.loads(last_line_printed(PROBE))
    return found


def test_an_installed_plugin_is_discovered_and_runs(installed_plugin: None) -> None:
    found = probe()
    assert {"shell", "pytest", "word_count"} <= set(found["names"])
    assert found["content"] == "the answer had 3 words (budget 50)"
    assert found["reward"] == 1.0


def test_after_uninstalling_the_plugin_is_gone(tmp_path: Path) -> None:
    code = "from orl.connectors.environment.api import discover_connectors as d; print(sorted(d()))"
    assert "word_count" not in last_line_printed(code)
