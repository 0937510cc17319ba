"""POST /v1/orl/score (the teacher's logprobs): the internal key only; bad requests are 400s that name the
field, never 500s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from orl.serving.policy.chat_template import ChatTemplate

from tests.component.test_capture_chat import (  # noqa: F401 - template is a fixture
    INTERNAL_KEY,
    KEY,
    Server,
    template,
)

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def server(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[Server]:  # noqa: F811
    up = Server(tmp_path, template)
    yield up
    await up.client.aclose()
    up.spool.close()


async def score(server: Server, body: dict[str, Any], key: str = INTERNAL_KEY) -> Any:
    return await server.client.post("/v1/orl/score", json=body, headers={"authorization": f"Bearer {key}"})


async def test_a_client_key_gets_a_403_and_the_internal_key_also_takes_the_chat_route(server: Server) -> None:
    body = {"messages": HI, "response_token_ids": [504]}
    refused = await score(server, body, key=KEY)
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "internal_key_required"
    assert "--internal-key" in refused.json()["error"]["message"]
    assert (await score(server, body, key="no-such-key")).status_code == 401
    chat = await server.client.post(
        "/v1/chat/completions",
        json={"messages": HI, "max_tokens": 2},
        headers={"authorization": f"Bearer {INTERNAL_KEY}"},
    )
    assert chat.status_code == 200, chat.text  # the judge asks its questions on the chat route


async def test_a_server_without_an_internal_key_refuses_every_score_request_with_403(
    tmp_path: Path,
    template: ChatTemplate,  # noqa: F811
) -> None:
    up = Server(tmp_path, template, internal_key="")
    try:
        refused = await score(up, {"messages": HI, "response_token_ids": [504]}, key=KEY)
        assert refused.status_code == 403 and "this server has none" in refused.json()["error"]["message"]
        assert (await score(up, {"messages": HI, "response_token_ids": [504]}, key="")).status_code == 401
    finally:
        await up.client.aclose()
        up.spool.close()


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
