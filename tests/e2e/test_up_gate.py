"""`orl up` (the gate is on by default): the server serves a trained version only after the promotion gate promoted it.

The stack (server, pipeline, trainer, gate) runs as a user starts it, with half the sessions held out.
Four two-question sessions, each closed with a "thanks" and a "try again", give every session two
judged turns. The trainer trains on the two kept sessions only (their samples, none of the held-out
ones); the gate evaluates every new version on the held-out sessions' recorded questions with the
stack's rule judge, and the server activates a version only once a PolicyGated promoted it. The
margin is 1.0 here (promote whatever the figures), so the test does not rest on what two tiny
training steps did to the answers; holding a worse version back is tests/integration/test_promotion_gate.py.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from orl.schemas.ids import held_out_session

from tests.e2e.up_stack import running_up
from tests.integration.log_reading import read_events

pytestmark = [pytest.mark.model, pytest.mark.slow]
NAMESPACE, SHARE = "live", 0.5


def sessions() -> tuple[list[str], list[str]]:
    """Two session ids the trainer keeps and two it holds out."""
    ids = [f"gate-session-{i}" for i in range(40)]
    kept = [s for s in ids if not held_out_session(s, SHARE)][:2]
    held = [s for s in ids if held_out_session(s, SHARE)][:2]
    return kept, held


def converse(base_url: str, api_key: str, session_id: str, topic: str) -> None:
    messages: list[dict[str, str]] = []
    for text in (
        f"What is a {topic}?",
        f"Thanks, that is exactly it. And a big {topic}?",
        "Try again, that is wrong.",
    ):
        messages.append({"role": "user", "content": text})
        reply = httpx.post(
            f"{base_url}/v1/chat/completions",
            json={"model": "orl-policy", "messages": messages, "max_tokens": 16},
            headers={"Authorization": f"Bearer {api_key}", "X-Session-Id": session_id},
            timeout=120,
        )
        reply.raise_for_status()
        messages.append(
            {"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"] or ""}
        )


def events_until(log_url: str, topic: str, done: Any, timeout_s: float = 420) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        events = asyncio.run(read_events(log_url, f"{NAMESPACE}.{topic}"))
        if done(events):
            return events
        assert time.monotonic() < deadline, f"{topic}: {[e['envelope']['event_type'] for e in events]}"
        time.sleep(2)


def test_up_with_the_gate_serves_only_promoted_versions_and_never_trains_on_held_out_sessions(
    tmp_path: Path, base_model_dir: Path
) -> None:
    kept, held = sessions()
    gate_env = {
        "ORL_HOLDOUT_SHARE": str(SHARE), "ORL_GATE_PROMPTS": "4", "ORL_GATE_SAMPLES": "1",
        "ORL_GATE_MAX_TOKENS": "16", "ORL_GATE_MARGIN": "1.0", "ORL_TRAIN_BATCH_SIZE": "2",
    }  # fmt: skip
    with running_up(
        tmp_path, idle_timeout_s=600, extra_env=gate_env, components="serve,pipeline,train", gate=True
    ) as stack:
        assert "started gate (pid" in stack.log_path.read_text()
        for session, topic in zip(held + kept, ("noun", "verb", "cat", "river"), strict=True):
            converse(stack.base_url, stack.api_key, session, topic)

        def promoted(events: list[dict[str, Any]]) -> bool:
            return any(e["envelope"]["event_type"] == "PolicyGated" for e in events)

        checkpoints = events_until(stack.log_url, "checkpoints", promoted)
        (gated, *_) = [e for e in checkpoints if e["envelope"]["event_type"] == "PolicyGated"]
        activations = events_until(
            stack.log_url,
            "policy_activations",
            lambda events: any(e["version"] == gated["version"] for e in events),
        )
        steps = asyncio.run(read_events(stack.log_url, f"{NAMESPACE}.train_steps"))
        samples = asyncio.run(read_events(stack.log_url, f"{NAMESPACE}.samples"))
        requests = asyncio.run(read_events(stack.log_url, f"{NAMESPACE}.requests"))

    assert (gated["decision"], gated["baseline_version"], gated["prompt_source"]) == ("promoted", 0, "log")
    held_turns = {r["envelope"]["turn_id"] for r in requests if r["envelope"]["session_id"] in held}
    asked = {a["prompt_id"] for a in gated["answers"]}
    assert asked and asked <= held_turns  # the gate asks only what held-out sessions asked
    assert {a["version"] for a in gated["answers"]} == {0, gated["version"]}
    served = [a["version"] for a in activations if a["envelope"]["event_type"] == "PolicyActivated"]
    assert served and set(served) <= {e["version"] for e in checkpoints if e.get("decision") == "promoted"}
    trained = {sample_id for step in steps for sample_id in step["sample_ids"]}
    session_of = {s["envelope"]["event_id"]: s["envelope"]["session_id"] for s in samples}
    assert trained and {session_of[s] for s in trained} <= set(kept)
    assert {s["envelope"]["session_id"] for s in samples} & set(held)  # held-out turns became samples
