"""POST /v1/responses driven by the official openai SDK: text, tools, streaming, previous_response_id.

Runs `orl.serving.app.build_app` over a backend that returns a fixed reply one text piece per token
(tests/component/test_streaming_tool_calls.py's), the real SmolLM2 tokenizer, a real recorder and
spool file; the SDK talks to the app over httpx's ASGI transport. Each turn must be recorded as a
chat turn is (RequestReceived, ResponseGenerated), with the conversation the Response continues.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from orl.connectors.metrics import Metrics
from orl.schemas.codec import decode
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.session_tracker import SessionTracker
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool

from tests.component.test_streaming_tool_calls import PIECES, PiecesBackend

KEYS = ("alice-key", "bob-key")
TOOL = {"type": "function", "name": "add", "parameters": {"type": "object"}, "strict": False}
TEXT = ["The", " answer", " is", " 3."]


@pytest.fixture(scope="module")
def template(base_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(base_model_dir)


class Server:
    """The app over one spool file; `client(key)` is an openai SDK client with that key."""

    def __init__(self, spool_path: Path, template: ChatTemplate, pieces: list[str]) -> None:
        self.spool = EventSpool(spool_path)
        state = ServerState(
            settings=ServeSettings(api_keys=KEYS, admin_key="admin"),
            backend=PiecesBackend(pieces),
            template=template,
            recorder=EventRecorder(self.spool, "live", clock_ms=lambda: 1_700_000_000_000),
            metrics=Metrics(),
            tracker=SessionTracker(stored_next_turn_index=self.spool.next_turn_index),  # as orl serve has it
        )
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=build_app(state), raise_app_exceptions=False),
            base_url="http://orl",
        )

    def client(self, key: str = KEYS[0]) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url="http://orl/v1", api_key=key, http_client=self.http, max_retries=0)

    def spooled(self, event_type: str) -> list[dict[str, Any]]:
        events = [decode(e.value) for e in self.spool.oldest(1000)]
        return [e for e in events if e["envelope"]["event_type"] == event_type]

    async def close(self) -> None:
        await self.http.aclose()
        self.spool.close()


@pytest.fixture
async def text_server(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[Server]:
    server = Server(tmp_path / "spool.db", template, TEXT)
    yield server
    await server.close()


@pytest.fixture
async def tool_server(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[Server]:
    server = Server(tmp_path / "spool.db", template, PIECES)
    yield server
    await server.close()


async def test_a_text_response_is_recorded_as_a_chat_turn_with_its_instructions(text_server: Server) -> None:
    response = await text_server.client().responses.create(
        model="orl-policy", instructions="Answer briefly.", input="What is 1 plus 2?", max_output_tokens=8
    )
    assert response.status == "completed" and response.output_text == "The answer is 3."
    assert response.usage is not None and response.usage.output_tokens == 4
    [request] = text_server.spooled("RequestReceived")
    [recorded] = text_server.spooled("ResponseGenerated")
    assert request["request_id"] == recorded["request_id"] == response.id
    assert json.loads(request["messages_json"]) == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 1 plus 2?"},
    ]
    assert recorded["response_text"] == "The answer is 3."
    assert recorded["response_token_ids"] == [1000, 1001, 1002, 1003]


async def test_streamed_events_add_up_to_the_response_and_its_logprobs_are_the_recorded_ones(
    text_server: Server,
) -> None:
    client = text_server.client()
    async with client.responses.stream(
        model="orl-policy", input="What is 1 plus 2?", include=["message.output_text.logprobs"]
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 4 and kinds[-1] == "response.completed"
    assert final.output_text == "The answer is 3."
    [recorded] = text_server.spooled("ResponseGenerated")
    part = final.output[0].content[0]
    assert [lp.logprob for lp in part.logprobs] == recorded["response_logprobs"] == [-0.5] * 4


async def test_tools_stream_and_a_tool_result_continues_the_response_in_its_session(
    tool_server: Server,
) -> None:
    client = tool_server.client()
    plain = await client.responses.create(model="orl-policy", input="What is 1 plus 2?", tools=[TOOL])
    async with client.responses.stream(model="orl-policy", input="What is 1 plus 2?", tools=[TOOL]) as stream:
        streamed = await stream.get_final_response()
    for response in (plain, streamed):
        message, call = response.output
        assert message.type == "message" and response.output_text == "Let me add that."
        assert (call.type, call.name, json.loads(call.arguments)) == (
            "function_call",
            "add",
            {"a": 1, "b": 2},
        )

    follow_up = await client.responses.create(
        model="orl-policy",
        previous_response_id=plain.id,
        input=[{"type": "function_call_output", "call_id": plain.output[1].call_id, "output": "3"}],
        tools=[TOOL],
    )
    first, _, second = tool_server.spooled("RequestReceived")
    assert second["request_id"] == follow_up.id
    assert json.loads(second["messages_json"]) == [
        {"role": "user", "content": "What is 1 plus 2?"},
        {
            "role": "assistant",
            "content": "Let me add that.",
            "tool_calls": [
                {
                    "id": plain.output[1].call_id,
                    "type": "function",
                    "function": {"name": "add", "arguments": plain.output[1].arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": plain.output[1].call_id, "content": "3"},
    ]
    assert second["envelope"]["session_id"] == first["envelope"]["session_id"]
    assert (second["turn_index"], second["previous_turn_id"]) == (1, first["envelope"]["turn_id"])


async def test_a_stored_response_outlives_a_restart_and_only_its_own_key_continues_it(
    tmp_path: Path, template: ChatTemplate
) -> None:
    server = Server(tmp_path / "spool.db", template, TEXT)
    first = await server.client().responses.create(model="orl-policy", input="Hi")
    unstored = await server.client().responses.create(model="orl-policy", input="Hi", store=False)
    await server.close()

    restarted = Server(tmp_path / "spool.db", template, TEXT)
    try:
        again = await restarted.client().responses.create(
            model="orl-policy", input="And then?", previous_response_id=first.id
        )
        assert again.previous_response_id == first.id
        for key, previous in ((KEYS[1], first.id), (KEYS[0], unstored.id)):
            with pytest.raises(openai.NotFoundError) as refused:
                await restarted.client(key).responses.create(
                    model="orl-policy", input="And then?", previous_response_id=previous
                )
            assert refused.value.body["code"] == "previous_response_not_found"
        opened, _, request = restarted.spooled("RequestReceived")
        # the restarted server knows the turn it continues from the spool file, not from memory
        assert request["envelope"]["session_id"] == opened["envelope"]["session_id"]
        assert (request["turn_index"], request["previous_turn_id"]) == (1, opened["envelope"]["turn_id"])
        assert [m["content"] for m in json.loads(request["messages_json"])] == [
            "Hi",
            "The answer is 3.",
            "And then?",
        ]
    finally:
        await restarted.close()


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"n": 2}, "n", "unknown_parameter"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "unsupported_parameter"),
        ({"tools": [{**TOOL, "strict": True}]}, "tools[0].strict", "unsupported_parameter"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0]",
            "unsupported_parameter",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "unsupported_parameter"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"include": ["file_search_call.results"]}, "include", "unsupported_parameter"),
        ({"text": {"format": {"type": "json_schema"}}}, "text.format.json_schema", "invalid_value"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
    ],
)
async def test_what_orl_cannot_honour_is_a_400_naming_the_field(
    text_server: Server, fields: dict[str, Any], param: str, code: str
) -> None:
    body = {"model": "orl-policy", "input": "Hi", **fields}
    reply = await text_server.http.post(
        "/v1/responses", json=body, headers={"authorization": f"Bearer {KEYS[0]}"}
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (param, code), error
    assert text_server.spooled("RequestReceived") == []


async def test_json_schema_output_is_parsed_as_chat_response_format(text_server: Server) -> None:
    """text.format json_schema reaches the constrained decoder as chat's response_format does; the echo
    backend does not decode, so this checks that the request is taken and recorded as constrained."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    await text_server.client().responses.create(
        model="orl-policy",
        input="What is 1 plus 2?",
        text={"format": {"type": "json_schema", "name": "sum", "schema": schema}},
    )
    [recorded] = text_server.spooled("RequestReceived")
    constraint = json.loads(recorded["sampling"]["constraint"])
    assert constraint == {"type": "json_schema", "json_schema": {"name": "sum", "schema": schema}}
