"""Step rewards with outcomes and group advantages through the real stack (`orl up`, SmolLM2).

Three sessions of one rollout group (X-Group-Id / X-Group-Size) each make two model calls; the
user's reply to the first is that step's next state, which the process judge (the `reaction` rule
judge `orl up` runs without a judge endpoint) scores +1 / -1 / 0; a connector's verdict (outcome
kind "task") then arrives for the last turn, read by the outcome judge. Under
`--reward-rule step_outcome --group-advantage`, every step's reward is 0.5 * process + 0.5 *
outcome, normalised per step index across the group; the expected values are computed here from
the rule's definition, and `orl audit` follows a first step's sample to the verdict's vote on the
other turn.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import httpx
import pytest

from orl.cli import main
from tests.e2e.test_reference_agent import wait_for
from tests.e2e.up_stack import UpStack, running_up
from tests.integration.log_reading import read_events

pytestmark = [pytest.mark.model, pytest.mark.slow]

GROUP = "task-e2e:0"
# session name -> (the user's reply to the first answer, the task's verdict)
SESSIONS = {
    "a": ("Thanks, that works.", 1.0),
    "b": ("That's wrong, try again.", -1.0),
    "c": ("Next one.", 1.0),
}
PROCESS = {"a": [1.0, 1.0], "b": [-1.0, -1.0], "c": [0.0, 1.0]}  # reaction judge: the reply, then the verdict


def play(stack: UpStack, reply: str, verdict: float) -> tuple[str, list[str]]:
    """One rollout as a client and its connector drive it: two turns, the verdict, the session's end."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with httpx.Client(base_url=f"{stack.base_url}/v1", headers=headers, timeout=120) as http:
        session_id = http.post("/sessions/start", json={"task_id": "task-e2e"}).json()["session_id"]
        turn_headers = {"X-Session-Id": session_id, "X-Group-Id": GROUP, "X-Group-Size": "3"}
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2 + 2?"}]
        turn_ids = []
        for next_message in (reply, None):
            body = {"model": "orl", "messages": messages, "max_tokens": 12, "temperature": 1.0}
            answer = http.post("/chat/completions", json=body, headers=turn_headers)
            assert answer.status_code == 200, answer.text
            turn_ids.append(answer.headers["x-turn-id"])
            messages.append(
                {"role": "assistant", "content": answer.json()["choices"][0]["message"]["content"]}
            )
            if next_message is not None:
                messages.append({"role": "user", "content": next_message})
        observation = {
            "session_id": session_id, "turn_id": turn_ids[-1], "source": "env:e2e", "role": "environment",
            "content": f"task verdict {verdict:+g}", "outcome": {"kind": "task", "reward": verdict},
        }  # fmt: skip
        assert http.post("/observations", json=observation).status_code == 202
        assert http.post(f"/sessions/{session_id}/end").status_code == 200
    return session_id, turn_ids


def normalised(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [(v - mean) / (std + 1e-6) for v in values]


def test_a_groups_steps_get_outcome_weighted_normalised_rewards(
    tmp_path: Path, base_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"ORL_REWARD_RULE": "step_outcome", "ORL_GROUP_ADVANTAGE": "true"}
    with running_up(tmp_path, idle_timeout_s=600, extra_env=env) as stack:
        played = {name: play(stack, reply, verdict) for name, (reply, verdict) in SESSIONS.items()}
        samples = asyncio.run(wait_for(stack.log_url, "samples", 6, timeout_s=120))
        assert len(samples) == 6, stack.log_path.read_text()[-3000:]
        events = {
            topic: asyncio.run(read_events(stack.log_url, f"live.{topic}"))
            for topic in ("requests", "rewards", "trajectories")
        }

    sessions = {session_id: name for name, (session_id, _) in played.items()}
    assert {(r["group_id"], r["group_size"]) for r in events["requests"]} == {(GROUP, 3)}
    assert sorted(t["envelope"]["session_id"] for t in events["trajectories"]) == sorted(sessions)

    step_rewards = {r["envelope"]["turn_id"]: r for r in events["rewards"] if r["rule"] == "step_outcome"}
    group_rewards = {
        r["envelope"]["turn_id"]: r for r in events["rewards"] if r["rule"] == "group_step_normalised"
    }
    for name, (_, turn_ids) in played.items():
        verdict = SESSIONS[name][1]
        for step, turn_id in enumerate(turn_ids):
            reward = step_rewards[turn_id]
            assert reward["reward"] == 0.5 * PROCESS[name][step] + 0.5 * verdict, (name, step)
            assert [p["judge_id"] for p in reward["parts"]] == ["prm:reaction", "outcome:outcome"]
    for step in (0, 1):
        names = sorted(SESSIONS)
        expected = normalised([0.5 * PROCESS[n][step] + 0.5 * SESSIONS[n][1] for n in names])
        for name, value in zip(names, expected, strict=True):
            turn_id = played[name][1][step]
            assert group_rewards[turn_id]["reward"] == pytest.approx(value, abs=1e-9), (name, step)
            [sample] = [s for s in samples if s["envelope"]["turn_id"] == turn_id]
            if sample["envelope"]["event_type"] == "SampleReady":
                assert sample["reward"] == group_rewards[turn_id]["reward"]
                assert sample["lineage"]["reward_event_id"] == group_rewards[turn_id]["envelope"]["event_id"]
            else:
                assert sample["reason"] == "reward_zero" and value == 0

    # the audit of b's first step reaches the verdict's vote on b's last turn
    first, last = played["b"][1]
    [sample] = [s for s in samples if s["envelope"]["turn_id"] == first]
    where = ["--data-dir", str(stack.data_dir), "--log-url", stack.log_url, "--namespace", "live"]
    assert main(["audit", sample["envelope"]["event_id"], *where]) == 0
    text = capsys.readouterr().out
    assert f"[of turn {last}]" in text and "outcome reward -1" in text
    assert "= step 0: 0.5 x process -1 + 0.5 x outcome -1 = -1" in text
    assert "group task-e2e:0 (3 rollouts)" in text
