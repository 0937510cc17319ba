"""docs/connectors.md: the tutorial's connector is under 40 lines and works as written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from orl.connectors.environment.api import Connector, TurnContext, run_connector

DOC = Path(__file__).resolve().parents[2] / "docs" / "connectors.md"


def tutorial_connector() -> tuple[str, dict[str, Any]]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    source = blocks[0]
    namespace: dict[str, Any] = {}
    exec(compile(source, str(DOC), "exec"), namespace)  # the documented code, run as written
    return source, namespace


def test_the_tutorial_connector_is_short() -> None:
    source, _ = tutorial_connector()
    assert len(source.strip().splitlines()) < 40


def test_the_tutorial_connector_works_as_written() -> None:
    _, namespace = tutorial_connector()
    connector = namespace["JsonAnswer"]()
    assert isinstance(connector, Connector) and connector.name == "json_answer"

    def observe(text: str) -> Any:
        return run_connector(connector, TurnContext("s", "s/t0", response_text=text), timeout_s=5)

    good, bad, no_key = observe('{"result": 42}'), observe("forty-two"), observe("[1]")
    assert good.outcome.reward == 1.0 and not good.failed
    assert bad.outcome.reward == -1.0 and "not JSON" in bad.content
    assert no_key.outcome.reward == -1.0 and 'no "result"' in no_key.content
    assert observe("   ") is None


def test_the_reporting_snippet_uses_names_that_exist() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)
    compile(blocks[1], str(DOC), "exec")
    for line in blocks[1].splitlines():
        if line.startswith("from "):
            exec(line, {})
