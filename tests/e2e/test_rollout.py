"""`orl rollout` end to end: the real CLI against a real `orl serve` with the real SmolLM2 model.

Two tasks of the tool environment, two rollouts each, two at a time, at most two model calls per
rollout, the first one forced to call a tool: every turn the runner reports is on the log, the
second request carries the environment's tool message (the first step's next state), the verdict
(outcome kind "task") is recorded on the session's last turn with the reward the runner printed
and the verifier gives, and every session is closed at that turn. (The terminal environment is
left to the scripted tests: a 135M model's shell commands are not run on the test machine.)
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from orl.connectors.environment.tool_env import ToolEnvironment

from tests.e2e.test_reference_agent import wait_for
from tests.integration.log_reading import read_events
from tests.integration.serve_process import API_KEY, ServeProcess, serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]


def run_rollout(server: ServeProcess, out: Path) -> tuple[list[dict[str, Any]], str]:
    command = [
        sys.executable, "-m", "orl.cli", "rollout", "--env=tool", "--tasks=2", "--group-size=2",
        "--concurrency=2", "--seed=5", "--max-steps=2", "--max-tokens=48", "--force-tool",
        f"--server-url={server.base_url}/v1", f"--api-key={API_KEY}", f"--out={out}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()], done.stdout


def test_rollouts_record_their_turns_verdicts_and_session_ends(tmp_path: Path, base_model_dir: Path) -> None:
    with serve_process(tmp_path) as server:
        results, printed = run_rollout(server, tmp_path / "rollouts.jsonl")
        turns = sum(len(r["turn_ids"]) for r in results)
        asyncio.run(wait_for(server.log_url, "sessions", len(results)))
        asyncio.run(wait_for(server.log_url, "responses", turns))
    events = {
        topic: asyncio.run(read_events(server.log_url, f"live.{topic}"))
        for topic in ("requests", "responses", "next_states", "sessions")
    }

    tasks = {t.task_id: t for t in ToolEnvironment().tasks("train", 2, seed=5)}
    assert len(results) == 4 and {r["task_id"] for r in results} == set(tasks)
    assert sorted(r["group_id"] for r in results) == sorted(f"{t}:5" for t in tasks for _ in range(2))
    assert len({r["session_id"] for r in results}) == 4
    lines = printed.splitlines()
    assert sum(line.startswith("[") for line in lines) == 4 and "[95% Wilson" in lines[-2]
    for result in results:
        session = result["session_id"]
        assert result["error"] is None and result["steps"] == 2 and len(result["tool_calls"]) >= 1
        for topic in ("requests", "responses"):
            recorded = [
                e["envelope"]["turn_id"] for e in events[topic] if e["envelope"]["session_id"] == session
            ]
            assert sorted(recorded) == sorted(result["turn_ids"]), (topic, result)
        requests = [e for e in events["requests"] if e["envelope"]["session_id"] == session]
        assert {(e["group_id"], e["group_size"]) for e in requests} == {(result["group_id"], 2)}
        [second] = [e for e in events["requests"] if e["envelope"]["turn_id"] == result["turn_ids"][1]]
        sent = json.loads(second["messages_json"])
        assert [m["role"] for m in sent[:3]] == ["system", "user", "assistant"]
        tool_messages = [m for m in sent if m["role"] == "tool"]
        assert tool_messages and tool_messages[0]["tool_call_id"] == sent[2]["tool_calls"][0]["id"]
        assert tool_messages[0]["content"]  # the calculator's answer or what went wrong

        [verdict] = [
            e
            for e in events["next_states"]
            if e["envelope"]["session_id"] == session and e["source"] == "env:tool"
        ]
        assert verdict["envelope"]["turn_id"] == result["turn_ids"][-1] and verdict["role"] == "environment"
        assert verdict["outcome"]["kind"] == "task" and verdict["outcome"]["reward"] == result["reward"]
        episode = ToolEnvironment().start(tasks[result["task_id"]])
        assert episode.verdict(result["final_text"]).reward == result["reward"]
        [closed] = [e for e in events["sessions"] if e["envelope"]["session_id"] == session]
        assert closed["last_turn_id"] == result["turn_ids"][-1]
