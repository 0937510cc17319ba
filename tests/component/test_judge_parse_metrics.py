"""An LLM judge's parse failures are counted as metrics, per judge, beside the votes themselves.

The judge is a loopback OpenAI-compatible server (a real HTTP server) that answers with the given
raw texts in turn, as a judge model too small for its prompt does: some with a `\\boxed{}` decision,
some without.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from orl.pipeline.effects.judge_stage import JudgeStage
from orl.pipeline.effects.judging import JudgeConfig
from orl.schemas.ids import side_session
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fixtures.fake_sglang import free_port, serve_in_thread
from tests.unit.test_pipeline_judge_rules import call as reward_call

RAW_REPLIES = ("The answer is fine. \\boxed{1}", "It seems good to me.", "Wrong. \\boxed{-1}")


def judge_app(replies: itertools.cycle[str], sessions: list[str] | None = None) -> Starlette:
    async def chat(request: Request) -> JSONResponse:
        await request.json()
        if sessions is not None:
            sessions.append(request.headers.get("x-session-id", ""))
        message = {"role": "assistant", "content": next(replies)}
        usage = {"prompt_tokens": 10, "completion_tokens": 5}
        return JSONResponse(
            {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}], "usage": usage}
        )

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def sample_value(exposition: str, name: str, **labels: str) -> float | None:
    wanted = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    for line in exposition.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    return None


def test_votes_that_fail_to_parse_are_counted_per_judge_with_the_recent_fraction() -> None:
    port = free_port()
    server, _ = serve_in_thread(judge_app(itertools.cycle(RAW_REPLIES)), port)
    try:
        judge = JudgeConfig(judge_id="prm", kind="llm", m=3, endpoint_url=f"http://127.0.0.1:{port}/v1")
        stage = JudgeStage(reward_judges=(judge,), hint_judge=None, api_key="k")

        async def vote_all() -> list[dict[str, Any]]:
            return [
                emit.event for i in range(6) for emit in await stage.perform(reward_call(i, judge.judge_id))
            ]

        votes = asyncio.run(vote_all())
    finally:
        server.should_exit = True
    assert [vote["score"] for vote in votes] == [1, None, -1, 1, None, -1]
    exposition = stage.metrics.exposition().decode()
    assert sample_value(exposition, "orl_judge_votes_total", judge_id="prm", parsed="true") == 4.0
    assert sample_value(exposition, "orl_judge_votes_total", judge_id="prm", parsed="false") == 2.0
    fraction = sample_value(exposition, "orl_judge_recent_unparsed_fraction", judge_id="prm")
    assert fraction is not None and abs(fraction - 2 / 6) < 1e-9


def test_the_judges_calls_name_the_side_session_of_the_judged_session() -> None:
    """orl's server records the judge's calls as side turns there, sealed with a key that `orl forget`
    destroys with the judged session's (orl.schemas.ids.side_session)."""
    port, sessions = free_port(), []
    server, _ = serve_in_thread(judge_app(itertools.cycle(RAW_REPLIES), sessions), port)
    try:
        judge = JudgeConfig(judge_id="prm", kind="llm", m=1, endpoint_url=f"http://127.0.0.1:{port}/v1")
        stage = JudgeStage(reward_judges=(judge,), hint_judge=None, api_key="k")
        call = reward_call(0, judge.judge_id)
        asyncio.run(stage.perform(call))
    finally:
        server.should_exit = True
    assert sessions == [side_session(call.payload["next_state"]["session_id"], "judge")]
