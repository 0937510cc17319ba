"""`orl up` as the README has a user start it, driven by the official `openai` client with no session headers.

No judge endpoint is configured, so the stack must judge by rules over the next state (issue 20): the
user's "thanks" rewards the turn before it (+1), "try again" punishes it (-1). Checks that the start-up
output says where rewards come from, that the three turns of the conversation form one session, and
that the judged turns become samples whose rewards come from rule votes that all parsed.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from openai import OpenAI

from tests.e2e.up_stack import running_up
from tests.integration.log_reading import read_events

pytestmark = [pytest.mark.model, pytest.mark.slow]
NAMESPACE = "live"


def samples_of(log_url: str, expected: int, timeout_s: float = 180) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        samples = asyncio.run(read_events(log_url, f"{NAMESPACE}.samples"))
        if len(samples) >= expected:
            return samples
        time.sleep(2)
    raise AssertionError(f"fewer than {expected} samples after {timeout_s} s")


def test_up_with_the_official_client_gives_rule_rewards_out_of_the_box(
    tmp_path: Path, base_model_dir: Path
) -> None:
    with running_up(tmp_path, idle_timeout_s=600) as stack:
        assert "reward signal: rule judge 'reaction'" in stack.log_path.read_text()
        client = OpenAI(base_url=f"{stack.base_url}/v1", api_key=stack.api_key)
        messages: list[dict[str, str]] = []
        for text in ("What is 2 + 2?", "Thanks, that is exactly it. And 3 + 3?", "Try again, that is wrong."):
            messages.append({"role": "user", "content": text})
            reply = client.chat.completions.create(model="orl-policy", messages=messages, max_tokens=12)  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})

        log_url = stack.log_url
        samples = samples_of(log_url, expected=2)  # turns 0 and 1 have a next state; turn 2 waits for one
        requests = asyncio.run(read_events(log_url, f"{NAMESPACE}.requests"))
        sessions = {
            e["envelope"]["session_id"] for e in requests if e["envelope"]["event_type"] == "RequestReceived"
        }
        assert len(sessions) == 1, sessions
        rewards = {s["envelope"]["turn_id"]: s.get("reward") for s in samples}
        assert sorted(float(reward or 0) for reward in rewards.values()) == [-1.0, 1.0], samples
        votes = asyncio.run(read_events(log_url, f"{NAMESPACE}.judge_votes"))
        assert votes and {v["judge_kind"] for v in votes} == {"rule"}
        assert all(v["parse_error"] is None for v in votes)
