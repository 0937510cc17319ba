"""The reference agent end to end: a real `orl serve`, the agent as a subprocess, the pipeline, samples.

The calculator agent (examples/calculator_agent.py) solves two tasks through the official openai
client; its verdict connector's outcome reaches the log as a NextStateObserved; the pipeline
(outcome rule judge, binary method) turns it into the last turn's reward and a sample.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.pipeline.runtime.settings import PipelineSettings
from orl.pipeline.runtime.stream_runner import StreamRunner

from tests.integration.log_reading import read_events
from tests.integration.serve_process import API_KEY, INTERNAL_KEY, ServeProcess, serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]

AGENT = Path(__file__).resolve().parents[2] / "examples" / "calculator_agent.py"


def run_agent(server: ServeProcess, tasks: int) -> list[dict[str, Any]]:
    command = [
        sys.executable,
        str(AGENT),
        f"--base-url={server.base_url}/v1",
        f"--api-key={API_KEY}",
        f"--tasks={tasks}",
        "--max-steps=2",
        "--max-tokens=32",
        "--force-tool",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


async def wait_for(log_url: str, topic: str, count: int, timeout_s: float = 20.0) -> list[dict[str, Any]]:
    """The server appends to the log in the background: wait until `count` events are there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        found = await read_events(log_url, f"live.{topic}")
        if len(found) >= count or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.2)


async def run_pipeline(settings: PipelineSettings) -> None:
    config = pipeline_config(settings)
    async with open_event_log(settings.effective_log_url()) as log:
        for stage in build_stages(settings):  # topological order: each stage sees what the previous wrote
            await StreamRunner(log, stage, config, settings.namespace).run_until_idle()


def test_the_calculator_agent_produces_samples_rewarded_by_its_connector(
    tmp_path: Path, base_model_dir: Path
) -> None:
    with serve_process(tmp_path) as server:
        results = run_agent(server, tasks=2)
        assert len(results) == 2
        turns = sum(len(r["turn_ids"]) for r in results)
        asyncio.run(wait_for(server.log_url, "sessions", 2))
        asyncio.run(wait_for(server.log_url, "responses", turns))
        settings = PipelineSettings(
            data_dir=tmp_path, log_url=server.log_url, method="binary", judge="outcome", api_key=INTERNAL_KEY
        )
        asyncio.run(run_pipeline(settings))

    events = {
        topic: asyncio.run(read_events(server.log_url, f"live.{topic}"))
        for topic in ("requests", "responses", "next_states", "samples")
    }
    for result in results:
        session = result["session_id"]
        for topic in ("requests", "responses"):
            recorded = {
                e["envelope"]["turn_id"] for e in events[topic] if e["envelope"]["session_id"] == session
            }
            assert recorded == set(result["turn_ids"]), (topic, result)
        last_turn = result["turn_ids"][-1]
        [verdict] = [e for e in events["next_states"] if e["envelope"]["event_id"] == result["event_id"]]
        assert (verdict["envelope"]["turn_id"], verdict["source"]) == (last_turn, "calculator")
        assert verdict["outcome"]["kind"] == "task"
        expected_reward = 1.0 if result["correct"] else -1.0
        assert verdict["outcome"]["reward"] == expected_reward
        assert json.loads(verdict["outcome"]["detail_json"])["steps"] == result["turn_ids"]
        samples = [
            s
            for s in events["samples"]
            if s["envelope"]["turn_id"] == last_turn and s["envelope"]["event_type"] == "SampleReady"
        ]
        assert samples, f"no sample for {last_turn}"
        assert samples[0]["reward"] == expected_reward
        assert samples[0]["lineage"]["next_state_event_id"] == result["event_id"]
