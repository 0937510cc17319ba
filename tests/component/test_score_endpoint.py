"""POST /v1/orl/score (the teacher's logprobs): bad requests are 400s that name the field, never 500s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from orl.serving.policy.chat_template import ChatTemplate

from tests.component.test_capture_chat import KEY, Server, template  # noqa: F401 - template is a fixture

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def server(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[Server]:  # noqa: F811
    up = Server(tmp_path, template)
    yield up
    await up.client.aclose()
    up.spool.close()


async def score(server: Server, body: dict[str, Any]) -> Any:
    return await server.client.post("/v1/orl/score", json=body, headers={"authorization": f"Bearer {KEY}"})


async def test_a_valid_request_gets_one_logprob_per_response_token(server: Server) -> None:
    response = await score(
        server, {"messages": HI, "response_token_ids": [504, 2114, 30], "temperature": 0.7}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert len(body["logprobs"]) == 3
    assert body["prompt_token_ids"] == server.state.template.render(HI, None)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": 5, "content": "x"}], "response_token_ids": [1]}, "messages[0].role"),
        ({"messages": [{"role": "user"}], "response_token_ids": [1]}, "messages[0].content"),
        ({"response_token_ids": [1]}, "messages"),
        ({"messages": HI, "response_token_ids": [1], "temperature": "hot"}, "temperature"),
        ({"messages": HI, "response_token_ids": [1], "temperature": 0}, "temperature"),
        ({"messages": HI, "response_token_ids": [-1, 10**9]}, "response_token_ids"),
        ({"messages": HI, "response_token_ids": []}, "response_token_ids"),
        ({"messages": HI, "response_token_ids": [True]}, "response_token_ids"),
        ({"messages": HI, "response_token_ids": "1,2"}, "response_token_ids"),
        ({"messages": HI, "response_token_ids": [1], "tools": {"x": 1}}, "tools"),
        ({"messages": HI, "response_token_ids": [1], "top_k": -1}, "top_k"),
        ({"messages": HI, "response_token_ids": [1], "top_k": 101}, "top_k"),
        ({"messages": HI, "response_token_ids": [1], "top_k": "5"}, "top_k"),
        ({"messages": HI, "response_token_ids": [1], "top_k": True}, "top_k"),
        ({"messages": HI, "response_token_ids": [1], "top_k": 2.5}, "top_k"),
        ({"messages": HI, "response_token_ids": [1], "top_k": 5}, "top_k"),  # the echo backend has no top-K
    ],
)
async def test_a_bad_request_is_a_400_naming_the_field(
    server: Server, body: dict[str, Any], param: str
) -> None:
    response = await score(server, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
