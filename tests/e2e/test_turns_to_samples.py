"""Chat through a real `orl serve`, run the real pipeline stages over the same SQLite log, get samples.

Judging uses the demo's rule judges (the user's reply decides the reward; a directive correction
becomes the hint), the teacher is scored by the server's /v1/orl/score on the real model.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.pipeline.runtime.settings import PipelineSettings
from orl.pipeline.runtime.stream_runner import StreamRunner

from tests.integration.log_reading import read_events
from tests.integration.serve_process import API_KEY, INTERNAL_KEY, serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]


def chat(base_url: str, messages: list[dict], session: str, **extra: object) -> str:
    headers = {"Authorization": f"Bearer {API_KEY}", "X-Session-Id": session}
    headers.update({k: str(v) for k, v in extra.pop("headers", {}).items()})  # type: ignore[union-attr]
    body = {
        "model": "orl-policy",
        "messages": messages,
        "max_tokens": 24,
        "temperature": 0.7,
        "seed": 1,
        **extra,
    }
    response = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=120)
    response.raise_for_status()
    return str(response.json()["choices"][0]["message"]["content"])


async def run_stages(settings: PipelineSettings) -> None:
    config = pipeline_config(settings)
    async with open_event_log(settings.effective_log_url()) as log:
        for stage in build_stages(settings):  # topological order: each stage sees what the previous wrote
            await StreamRunner(log, stage, config, settings.namespace).run_until_idle()


def test_a_corrected_turn_becomes_a_combined_sample(tmp_path: Path, base_model_dir: Path) -> None:
    with serve_process(tmp_path) as server:
        question = [{"role": "user", "content": "How do I simplify the fraction 18/24?"}]
        answer = chat(server.base_url, question, "s1")
        correction = "Please redo this: answer in under 40 words, in plain sentences, no bold or lists."
        chat(
            server.base_url,
            [*question, {"role": "assistant", "content": answer}, {"role": "user", "content": correction}],
            "s1",
            max_tokens=1,
            headers={"X-Session-Done": "true"},
        )
        settings = PipelineSettings(
            data_dir=tmp_path,
            log_url=server.log_url,
            method="combined",
            judge="user_reply",
            hint_judge="user_hint",
            api_key=INTERNAL_KEY,
            server_url=f"{server.base_url}/v1",
        )
        asyncio.run(_wait_for_spool(server.log_url))
        asyncio.run(run_stages(settings))

    samples = asyncio.run(read_events(server.log_url, "live.samples"))
    by_turn = {s["envelope"]["turn_id"]: s for s in samples}
    first = by_turn["s1/t0"]
    assert first["envelope"]["event_type"] == "SampleReady"
    assert first["method"] == "combined" and first["reward"] == -1.0
    assert len(first["teacher_logprobs"]) == len(first["response_token_ids"]) == len(first["old_logprobs"])
    assert first["teacher_kind"] == "frozen_reference"
    votes = asyncio.run(read_events(server.log_url, "live.judge_votes"))
    assert any(
        v["envelope"]["turn_id"] == "s1/t0" and v["score"] == -1 and "redo" in v["prompt_text"].lower()
        for v in votes
    )
    hints = [
        h
        for h in asyncio.run(read_events(server.log_url, "live.hints"))
        if h["envelope"]["event_type"] == "HintSelected"
    ]
    assert hints and "40 words" in hints[0]["hint"]
    assert first["lineage"]["hint_event_id"] == hints[0]["envelope"]["event_id"]
    # the hinted teacher differs from the sampling policy on at least one response token
    assert any(
        abs(t - o) > 1e-3 for t, o in zip(first["teacher_logprobs"], first["old_logprobs"], strict=True)
    )
    last = by_turn["s1/t1"]
    assert last["envelope"]["event_type"] == "SampleRejected"
    (closed,) = asyncio.run(read_events(server.log_url, "live.sessions"))
    assert closed["last_turn_id"] == "s1/t1"  # serving names the turn the pipeline must end


async def _wait_for_spool(log_url: str, timeout_s: float = 15.0) -> None:
    """The server appends to the log in the background: wait until the session's close is there."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        if await read_events(log_url, "live.sessions"):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the server never appended SessionClosed")
