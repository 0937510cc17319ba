"""`orl up` as the README has a user start it, driven by the README's own `openai` snippet (no session headers).

No judge endpoint is configured, so the stack must judge by rules over the next state (issue 20): the
user's "thanks" rewards the turn before it (+1), "try again" punishes it (-1). Checks that the start-up
output says where rewards come from, that the three turns of the conversation form one session, and
that the judged turns become samples whose rewards come from rule votes that all parsed.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.up_stack import running_up
from tests.integration.log_reading import read_events

pytestmark = [pytest.mark.model, pytest.mark.slow]
NAMESPACE = "live"
README = Path(__file__).resolve().parents[2] / "README.md"
README_URL = "http://127.0.0.1:8000/v1"  # `orl up`'s default port; the test's stack listens on a free one


def readme_client_snippet() -> str:
    (snippet,) = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert snippet.count(README_URL) == 1 and '".orl/keys.json"' in snippet, snippet
    return snippet


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
        (tmp_path / ".orl").symlink_to(stack.data_dir)  # the snippet reads .orl/keys.json from where it runs
        snippet = readme_client_snippet().replace(README_URL, f"{stack.base_url}/v1")
        chat = subprocess.run(
            [sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert chat.returncode == 0, chat.stderr
        assert len(chat.stdout.strip().splitlines()) >= 3  # it printed the three answers

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

        status = subprocess.run(
            [sys.executable, "-m", "orl.cli", "status", "--data-dir", str(stack.data_dir)],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert re.search(r"^  serve +running: 0 restarts$", status, flags=re.MULTILINE), status
        assert re.search(r"^  samples: [2-9]\d* built", status, flags=re.MULTILINE), status
