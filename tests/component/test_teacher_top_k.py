"""The teacher stage asks POST /v1/orl/score for top-K rows when configured and records them in TeacherScored.

A loopback HTTP server stands in for `orl serve` (it records each body and answers in the endpoint's shape).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from orl.pipeline.effects.contract import EffectCall
from orl.pipeline.effects.teacher_stage import TeacherStage
from orl.schemas.codec import decode, encode
from orl.schemas.events import make_event
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.fixtures.fake_sglang import free_port, serve_in_thread

RESPONSE_IDS = [11, 12, 13]


class ScoreServer:
    """Answers /v1/orl/score; with `top_k` in the body also top_ids / top_logprobs ([T][K])."""

    def __init__(self, honours_top_k: bool = True) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.honours_top_k = honours_top_k

    async def score(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.bodies.append(body)
        n = len(body["response_token_ids"])
        reply: dict[str, Any] = {"prompt_token_ids": [1, 2], "logprobs": [-0.5] * n, "policy_version": 0}
        if self.honours_top_k and body.get("top_k"):
            k = body["top_k"]
            reply["top_ids"] = [[t + j for j in range(k)] for t in body["response_token_ids"]]
            reply["top_logprobs"] = [[-0.5 - j for j in range(k)] for _ in range(n)]
        return JSONResponse(reply)


@pytest.fixture
def score_server(request: pytest.FixtureRequest) -> Iterator[tuple[ScoreServer, str]]:
    fake = ScoreServer(honours_top_k=getattr(request, "param", True))
    port = free_port()
    server, thread = serve_in_thread(
        Starlette(routes=[Route("/v1/orl/score", fake.score, methods=["POST"])]), port
    )
    yield fake, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=10)


def teacher_call() -> EffectCall:
    hint = make_event(
        "HintSelected",
        namespace="live",
        producer="test",
        occurred_at_ms=1_700_000_000_000,
        id_parts=("hint",),
        session_id="s1",
        turn_id="t1",
        hint_vote_ids=["v"],
        selected_vote_id="v",
        hint="Answer in one word.",
    )
    turn = {
        "messages": [{"role": "user", "content": "capital of France?"}],
        "tools": None,
        "response_token_ids": RESPONSE_IDS,
        "temperature": 0.7,
    }
    payload = {"turn": turn, "hint": hint["hint"], "hint_event_id": hint["envelope"]["event_id"]}
    return EffectCall("teacher", {**payload, "envelope": hint["envelope"]})


async def test_top_k_is_asked_for_and_recorded(score_server: tuple[ScoreServer, str]) -> None:
    fake, url = score_server
    stage = TeacherStage(url, "key", top_k=4)
    try:
        (emit,) = await stage.perform(teacher_call())
    finally:
        await stage.close()
    assert fake.bodies[0]["top_k"] == 4 and fake.bodies[0]["temperature"] == 0.7
    event = decode(encode(emit.event))
    assert event["teacher_top_ids"] == [[t + j for j in range(4)] for t in RESPONSE_IDS]
    assert event["teacher_top_logprobs"] == [[-0.5 - j for j in range(4)] for _ in RESPONSE_IDS]


async def test_token_level_sends_no_top_k_and_keeps_its_event_id(
    score_server: tuple[ScoreServer, str],
) -> None:
    fake, url = score_server
    token_stage, top_stage = TeacherStage(url, "key"), TeacherStage(url, "key", top_k=2)
    try:
        (token,) = await token_stage.perform(teacher_call())
        (top,) = await top_stage.perform(teacher_call())
    finally:
        await token_stage.close()
        await top_stage.close()
    assert "top_k" not in fake.bodies[0]
    assert token.event["teacher_top_ids"] is None and token.event["teacher_top_logprobs"] is None
    assert token.event["envelope"]["event_id"] != top.event["envelope"]["event_id"]


@pytest.mark.parametrize("score_server", [False], indirect=True)
async def test_a_server_without_top_k_gives_a_token_level_event(
    score_server: tuple[ScoreServer, str],
) -> None:
    _, url = score_server
    stage = TeacherStage(url, "key", top_k=4)
    try:
        (emit,) = await stage.perform(teacher_call())
    finally:
        await stage.close()
    assert emit.event["teacher_top_ids"] is None and emit.event["teacher_logprobs"] == [-0.5] * 3
