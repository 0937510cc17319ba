"""An environment from a separately installed package is found through the "orl.environments" group.

Installs tests/fixtures/sample_environment_pkg (a real package with its own pyproject) into this
environment with pip, loads it by name in a fresh interpreter and runs one episode, then uninstalls
it and checks that it is gone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.plugins import installed, last_line_printed

PACKAGE = Path(__file__).resolve().parents[1] / "fixtures" / "sample_environment_pkg"
DISTRIBUTION = "orl-sample-environment"

pytestmark = pytest.mark.slow

PROBE = """
import json
from orl.connectors.environment.episode import Environment, discover_environments, load_environment
env = load_environment("echo_word")
[task] = env.tasks("eval", 1, seed=0)
episode = env.start(task)
said, silent = episode.verdict("ok: " + task.data["word"]), episode.verdict("no")
[tool] = episode.step([{"id": "c1", "type": "function", "function": {"name": "x", "arguments": "{}"}}])
print(json.dumps({"names": sorted(discover_environments()), "is_env": isinstance(env, Environment),
                  "rewards": [said.reward, silent.reward], "kind": said.kind, "tool": tool}))
"""


@pytest.fixture
def installed_plugin(tmp_path: Path) -> Iterator[None]:
    with installed(PACKAGE, DISTRIBUTION, tmp_path):
        yield


def test_an_installed_environment_is_discovered_and_runs(installed_plugin: None) -> None:
    found = json.loads(last_line_printed(PROBE))
    assert {"tool", "terminal", "echo_word"} <= set(found["names"])
    assert found["is_env"] is True
    assert (found["rewards"], found["kind"]) == ([1.0, -1.0], "task")
    assert found["tool"] == {"role": "tool", "tool_call_id": "c1", "content": "error: this task has no tools"}


def test_without_the_package_the_name_is_unknown() -> None:
    code = (
        "from orl.connectors.environment.episode import load_environment\n"
        "try:\n    load_environment('echo_word')\nexcept Exception as e:\n    print(type(e).__name__, e)"
    )
    assert (
        last_line_printed(code)
        == "ConfigError no environment 'echo_word'; known: terminal, tool, tool_result"
    )
