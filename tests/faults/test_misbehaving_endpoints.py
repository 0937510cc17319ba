"""A judge and a teacher endpoint that misbehave: every malformed reply is a failed vote or a failed
scoring, never an exception out of the stage (which would end the pipeline process and, replayed
after its restart, end it again). And the server's own key reaches no outside judge.

The endpoints are real HTTP servers on loopback (starlette under uvicorn) that answer 200 with each
malformed body in turn, as a broken or hostile OpenAI-compatible server could.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from orl.pipeline.effects.contract import EffectCall
from orl.pipeline.effects.judge_stage import JudgeStage
from orl.pipeline.effects.judging import JudgeConfig
from orl.pipeline.effects.teacher_stage import TeacherStage
from orl.pipeline.runtime.settings import PipelineSettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tests.fixtures.fake_sglang import free_port, serve_in_thread
from tests.unit.test_pipeline_judge_rules import call as reward_call


def chat(content: Any, usage: Any = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}], "usage": usage}


# 200 answers that are no usable chat completion, or a usable one with a hostile detail
MALFORMED_CHAT: list[Any] = [
    {},
    [],
    "a string",
    None,
    {"choices": []},
    {"choices": None},
    {"choices": ["text"]},
    {"choices": [{"message": "text"}]},
    {"choices": [{"message": None}]},
    {"choices": [{"message": {"content": 5}}]},
    {"choices": [{"message": {"content": ["a", "list"]}}]},
    {"choices": [{"message": {"content": {"a": "dict"}}}]},
    chat("\\boxed{" + "1" * 5000 + "}"),  # int() of more than 4,300 digits raises
    chat("\\boxed{-" + "9" * 50 + "}"),
    chat("\\boxed{1}", usage="lots"),  # usable: the usage is left out
    chat("\\boxed{1}", usage={"prompt_tokens": "ten", "completion_tokens": 2**70}),  # usable too
    chat("\\boxed{1}", usage=[1, 2]),  # usable too
]
USABLE = {14, 15, 16}  # indexes of MALFORMED_CHAT whose vote is a valid +1


def replying(bodies: list[Any], seen_headers: list[dict[str, str]] | None = None) -> Starlette:
    """An endpoint that answers each POST with the next body of `bodies` (and, after them, bad JSON)."""
    answers: Iterator[Any] = itertools.chain(bodies, itertools.repeat(None))
    count = itertools.count()

    async def answer(request: Request) -> Response:
        if seen_headers is not None:
            seen_headers.append(dict(request.headers))
        index, body = next(count), next(answers)
        if index >= len(bodies):
            return PlainTextResponse("{not json", media_type="application/json")
        return JSONResponse(body)

    routes = [Route(path, answer, methods=["POST"]) for path in ("/v1/chat/completions", "/v1/orl/score")]
    return Starlette(routes=routes)


@pytest.fixture
def endpoint(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[dict[str, str]]]]:
    bodies, headers = request.param, []
    port = free_port()
    server, _ = serve_in_thread(replying(bodies, headers), port)
    try:
        yield f"http://127.0.0.1:{port}/v1", headers
    finally:
        server.should_exit = True


@pytest.mark.parametrize("endpoint", [MALFORMED_CHAT], indirect=True)
def test_every_malformed_judge_reply_is_a_failed_vote_and_the_stage_goes_on(
    endpoint: tuple[str, list[dict[str, str]]],
) -> None:
    url, _ = endpoint
    judge = JudgeConfig(judge_id="prm", kind="llm", m=1, endpoint_url=url, retries=0)
    stage = JudgeStage(reward_judges=(judge,), hint_judge=None, api_key="")

    async def vote_all() -> list[dict[str, Any]]:
        try:
            count = len(MALFORMED_CHAT) + 1  # and one reply that is not JSON at all
            return [emit.event for i in range(count) for emit in await stage.perform(reward_call(i, "prm"))]
        finally:
            await stage.close()

    votes = asyncio.run(vote_all())
    assert len(votes) == len(MALFORMED_CHAT) + 1  # one vote per call, none raised
    for index, vote in enumerate(votes):
        if index in USABLE:
            assert (vote["score"], vote["parse_error"]) == (1, None), vote
            assert vote["prompt_tokens"] == 0 and 0 <= vote["completion_tokens"] < 2**31
        else:
            assert vote["score"] is None and vote["parse_error"], (index, vote)


MALFORMED_SCORES: list[Any] = [
    {},
    [],
    {"prompt_token_ids": "1 2 3", "logprobs": [-1.0, -1.0], "policy_version": 0},
    {"prompt_token_ids": [1, 2], "logprobs": [-1.0], "policy_version": 0},  # one logprob for two tokens
    {"prompt_token_ids": [1, 2], "logprobs": ["a", "b"], "policy_version": 0},
    {"prompt_token_ids": [1, 2], "logprobs": [-1.0, -1.0], "policy_version": "1"},
    {"prompt_token_ids": [1, 2], "logprobs": [-1.0, -1.0], "policy_version": None},
    {"prompt_token_ids": [1, 2], "logprobs": [-1.0, -1.0], "policy_version": 0, "top_ids": [[1]]},
    {"prompt_token_ids": [1, 2], "logprobs": [-1.0, -1.0], "policy_version": 0, "top_ids": "x"},
]


def teacher_call(index: int) -> EffectCall:
    envelope = {
        "namespace": "test",
        "session_id": "s1",
        "turn_id": f"s1-t{index}",
        "occurred_at": 1_700_000_000_000,
    }
    turn = {
        "messages": [{"role": "user", "content": "Question?"}],
        "response_token_ids": [5, 6],
        "temperature": 0.7,
    }
    return EffectCall(
        "teacher", {"turn": turn, "hint": "be brief", "envelope": envelope, "hint_event_id": f"hint-{index}"}
    )


@pytest.mark.parametrize("endpoint", [MALFORMED_SCORES], indirect=True)
def test_every_malformed_teacher_reply_is_a_failed_scoring_and_the_stage_goes_on(
    endpoint: tuple[str, list[dict[str, str]]],
) -> None:
    url, _ = endpoint
    stage = TeacherStage(server_url=url, api_key="k", retries=0)

    async def score_all() -> list[Any]:
        try:
            return [await stage.perform(teacher_call(i)) for i in range(len(MALFORMED_SCORES) + 1)]
        finally:
            await stage.close()

    assert asyncio.run(score_all()) == [[]] * (len(MALFORMED_SCORES) + 1)  # no event, no exception
    assert stage.failures == len(MALFORMED_SCORES) + 1  # each counted (the sample builder rejects the turn)


@pytest.mark.parametrize("endpoint", [[chat("\\boxed{1}")] * 3], indirect=True)
def test_the_server_key_reaches_no_outside_judge(endpoint: tuple[str, list[dict[str, str]]]) -> None:
    url, headers = endpoint
    server = "http://127.0.0.1:8000/v1"

    def authorization(settings: PipelineSettings) -> str | None:
        judge = JudgeConfig(judge_id="prm", kind="llm", m=1, endpoint_url=url, retries=0)
        stage = JudgeStage(reward_judges=(judge,), hint_judge=None, api_key=settings.judge_key())

        async def one_vote() -> None:
            try:
                await stage.perform(reward_call(0, "prm"))
            finally:
                await stage.close()

        asyncio.run(one_vote())
        return headers[-1].get("authorization")

    # an outside judge without a key of its own: no Authorization header at all
    assert authorization(PipelineSettings(server_url=server, api_key="server-key", judge_url=url)) is None
    # its own key, never the server's
    own_key = PipelineSettings(
        server_url=server, api_key="server-key", judge_url=url, judge_api_key="judge-key"
    )
    assert authorization(own_key) == "Bearer judge-key"
    # the judge is the orl server itself (no --judge-url, or the same URL): the server's key is its key
    assert PipelineSettings(server_url=server, api_key="server-key").judge_key() == "server-key"
    assert (
        PipelineSettings(server_url=server, api_key="server-key", judge_url=server + "/").judge_key()
        == "server-key"
    )
