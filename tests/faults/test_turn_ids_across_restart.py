"""A session's turn ids stay unique across a restart of the server (found by the crash-anywhere suite).

The server's session tracker lives in memory: after a kill -9 and a restart it used to give the next
request under the same `X-Session-Id` turn index 0 again, i.e. the turn id of the session's first
turn, and since every pipeline stage keys turns by turn id the second turn was never derived into a
sample. Each session's next turn index is now committed to the spool file with the turn's events and
read back by the restarted server. Real processes: `orl up --components serve` on the real model.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.e2e.up_stack import UpStack, running_up
from tests.faults.harness import kill_and_wait

pytestmark = [pytest.mark.model, pytest.mark.slow]


def turn_id_of(stack: UpStack, session_id: str, messages: list[dict[str, str]]) -> str:
    reply = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        json={"model": "orl-policy", "messages": messages, "max_tokens": 4},
        headers={"Authorization": f"Bearer {stack.api_key}", "X-Session-Id": session_id},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return reply.headers["x-turn-id"]


def test_the_turn_after_a_server_restart_gets_a_new_turn_id(tmp_path: Path, base_model_dir: Path) -> None:
    with running_up(tmp_path, idle_timeout_s=600, components="serve") as stack:
        messages = [{"role": "user", "content": "What is 2 + 2?"}]
        first = turn_id_of(stack, "restart-1", messages)
        assert kill_and_wait(stack, "serve").recovery_s is not None
        messages += [{"role": "assistant", "content": "4"}, {"role": "user", "content": "Thanks!"}]
        second = turn_id_of(stack, "restart-1", messages)
        assert second != first, f"the turn after the restart got the first turn's id {first}"
