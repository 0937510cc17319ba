"""Golden regression: a recorded stream of 3 sessions through linker -> judge -> tally -> hints -> teacher -> samples.

The judge and teacher are scripted from the recorded raw outputs in the input file; everything
else is the real pure processors. Regenerate the expected outputs with ORL_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from orl.pipeline.processors.config import LinkerConfig, PipelineConfig, SampleConfig
from orl.schemas.codec import decode, encode

from tests.unit.pipeline_streams import PipelineDriver, ScriptedEffects

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
INPUT = GOLDEN / "pipeline_input.json"


def run_recorded(method: str) -> list[dict[str, Any]]:
    recorded = json.loads(INPUT.read_text())
    config = PipelineConfig(linker=LinkerConfig(idle_timeout_s=600), samples=SampleConfig(method=method))  # type: ignore[arg-type]
    driver = PipelineDriver(config, ScriptedEffects(recorded["reward_outputs"], recorded["hint_outputs"]))
    driver.feed_all(recorded["events"])
    driver.tick(recorded["tick_at_ms"])
    driver.tick(recorded["tick_at_ms"] + 10**8)  # after every retention: state must be gone
    assert all(states == {} for states in driver.states.values())
    return [{"topic": emit.topic, "event": decode(encode(emit.event))} for emit in driver.log]


@pytest.mark.parametrize("method", ["binary", "opd", "combined"])
def test_recorded_stream_gives_the_golden_outputs(method: str) -> None:
    outputs = run_recorded(method)
    expected_path = GOLDEN / f"pipeline_output_{method}.json"
    rendered = json.dumps(outputs, indent=1, sort_keys=True) + "\n"
    if os.environ.get("ORL_UPDATE_GOLDEN") == "1":
        expected_path.write_text(rendered)
    assert rendered == expected_path.read_text(), (
        f"golden mismatch; if intended, rerun with ORL_UPDATE_GOLDEN=1 ({method})"
    )


def test_running_twice_gives_identical_outputs() -> None:
    assert run_recorded("combined") == run_recorded("combined")
