"""Streamed chat turns with tools offered: text arrives token by token, calls as they close, and the
stream adds up to the response that is recorded.

Runs `orl.serving.app.build_app` over a backend that returns a fixed reply in several tokens (the echo
benchmark backend, one text piece per token) and the real SmolLM2 tokenizer, with a real recorder and
spool file.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from orl.connectors.metrics import Metrics
from orl.schemas.codec import decode
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.policy.base import Generation, GenerationStream, SamplingParams, TokenStep
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool
from orl.serving.tool_calls import forced_call, merged_tool_calls, parse_reply

from benchmarks.echo_backend import EchoBackend

KEY = "chat-key"
QUESTION = [{"role": "user", "content": "What is 1 plus 2?"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
PIECES = [
    "Let",
    " me",
    " add",
    " that.",
    "\n<tool",
    "_call>\n",
    '{"name": "add", ',
    '"arguments": {"a": 1, "b": 2}}',
    "\n</tool_call>",
]


class PiecesBackend(EchoBackend):
    """The echo backend, but its reply comes as one token per text piece, as a model's does."""

    def __init__(self, pieces: list[str]) -> None:
        super().__init__(list(range(1000, 1000 + len(pieces))), text="".join(pieces))
        self.pieces = pieces

    def generate_stream(
        self, prompt_ids: list[int], params: SamplingParams, run: str = ""
    ) -> GenerationStream:
        stream = GenerationStream()
        ids = list(range(1000, 1000 + len(self.pieces)))
        for token_id, piece in zip(ids, self.pieces, strict=True):
            stream.publish(TokenStep(token_id, -0.5, piece))
        text = "".join(self.pieces)
        stream.publish(Generation(list(prompt_ids), ids, [-0.5] * len(ids), text, "stop", 0, 0.0))
        return stream


@pytest.fixture(scope="module")
def template(base_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(base_model_dir)


@pytest.fixture
async def app(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[tuple[httpx.AsyncClient, EventSpool]]:
    spool = EventSpool(tmp_path / "spool.db")
    state = ServerState(
        settings=ServeSettings(api_keys=(KEY,), admin_key="admin"),
        backend=PiecesBackend(PIECES),
        template=template,
        recorder=EventRecorder(spool, "live", clock_ms=lambda: 1_700_000_000_000),
        metrics=Metrics(),
    )
    transport = httpx.ASGITransport(app=build_app(state), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://orl") as client:
        yield client, spool
    spool.close()


async def stream_chat(client: httpx.AsyncClient, **body: Any) -> list[dict[str, Any]]:
    """The chunks of one streamed chat completion (the `[DONE]` line checked and dropped)."""
    body = {"model": "orl-policy", "messages": QUESTION, "tools": TOOLS, "stream": True, **body}
    reply = await client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}"})
    assert reply.status_code == 200, reply.text
    lines = [line.removeprefix("data: ") for line in reply.text.split("\n\n") if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def recorded_response(spool: EventSpool) -> dict[str, Any]:
    (response,) = [e for e in map(decode, (r.value for r in spool.oldest(100))) if "response_text" in e]
    return response


def assembled(chunks: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    return content, merged_tool_calls(call for d in deltas for call in d.get("tool_calls", []))


async def test_text_streams_before_a_call_and_the_stream_adds_up_to_the_recorded_reply(app: Any) -> None:
    client, spool = app
    chunks = await stream_chat(client, stream_options={"include_usage": True})
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    content_deltas = [d["content"] for d in deltas[1:] if d.get("content")]
    assert content_deltas == ["Let", " me", " add", " that."]  # token by token, not one final chunk
    call_at = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    assert call_at > 4 and call_at == len(deltas) - 2  # the call comes after the text, before the finish
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(PIECES)

    want = parse_reply("".join(PIECES), chunks[0]["id"])  # what the non-streaming body holds
    assert assembled(chunks) == (want.content, want.tool_calls)
    response = recorded_response(spool)
    assert response["response_text"] == want.content == "Let me add that."
    assert json.loads(response["tool_calls_json"]) == want.tool_calls
    metrics = (await client.get("/metrics")).text
    assert "stream_reply_mismatches" not in metrics
    assert "orl_time_to_first_token_seconds_count 1.0" in metrics  # one streamed reply, timed once


async def test_with_tool_choice_none_the_reply_is_plain_text(app: Any) -> None:
    client, spool = app
    chunks = await stream_chat(client, tool_choice="none")
    content, calls = assembled(chunks)
    assert content == "".join(PIECES) and calls == []
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) == len(PIECES)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert recorded_response(spool)["response_text"] == content


async def test_a_forced_call_opens_first_and_gets_its_arguments_last(app: Any) -> None:
    client, spool = app
    chunks = await stream_chat(client, tool_choice={"type": "function", "function": {"name": "add"}})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": ""}
    assert not any(d.get("content") for d in deltas)
    want = forced_call("add", "".join(PIECES), chunks[0]["id"]).tool_calls
    assert assembled(chunks) == ("", want)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(recorded_response(spool)["tool_calls_json"]) == want
