"""Chat turns on the real app are in the spool before their response leaves the server.

Runs `orl.serving.app.build_app` over the zero-cost echo backend (benchmarks/echo_backend.py) and the real
SmolLM2 tokenizer, with a real recorder and spool file; a spool failure is a real SQLite failure (a
trigger in the spool file aborts inserts of one topic).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from orl.connectors.metrics import Metrics
from orl.schemas.codec import decode
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool

from benchmarks.echo_backend import ECHO_TEXT, EchoBackend
from tests.unit.openclaw_requests import SYSTEM_PROMPT, body, internal_context, resent_assistant, user

KEY = "chat-key"
INTERNAL_KEY = "internal-key"  # the pipeline's and the gate's
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def template(base_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(base_model_dir)


class Server:
    def __init__(
        self, tmp_path: Path, template: ChatTemplate, metrics_key: str = "", internal_key: str = INTERNAL_KEY
    ) -> None:
        self.spool_path = tmp_path / "spool.db"
        self.spool = EventSpool(self.spool_path)
        self.state = ServerState(
            settings=ServeSettings(
                api_keys=(KEY,), admin_key="admin", internal_key=internal_key, metrics_key=metrics_key
            ),
            backend=EchoBackend(),
            template=template,
            recorder=EventRecorder(self.spool, "live", clock_ms=lambda: 1_700_000_000_000),
            metrics=Metrics(),
        )
        transport = httpx.ASGITransport(app=build_app(self.state), raise_app_exceptions=False)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://orl")

    async def chat(self, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
        body = {"model": "orl-policy", "messages": QUESTION, "max_tokens": 4, **body}
        return await self.client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {KEY}", **(headers or {})}
        )

    def spooled(self) -> list[dict[str, Any]]:
        """What the spool file holds right now (committed rows only)."""
        return [decode(e.value) for e in self.spool.oldest(1000)]

    def reject_topic(self, topic: str) -> None:
        db = sqlite3.connect(str(self.spool_path))
        db.execute(
            f"CREATE TRIGGER reject BEFORE INSERT ON spool WHEN NEW.topic = '{topic}' "
            "BEGIN SELECT RAISE(ABORT, 'rejected by the test'); END"
        )
        db.commit()
        db.close()


@pytest.fixture
async def server(tmp_path: Path, template: ChatTemplate) -> AsyncIterator[Server]:
    up = Server(tmp_path, template)
    yield up
    await up.client.aclose()
    up.spool.close()


def event_types(events: list[dict[str, Any]]) -> list[str]:
    return [e["envelope"]["event_type"] for e in events]


async def test_a_completion_returns_only_once_its_events_are_spooled(server: Server) -> None:
    reply = await server.chat(headers={"x-session-id": "s1"})
    assert reply.status_code == 200, reply.text
    events = server.spooled()  # no tick has passed since the response: committed before it was sent
    assert event_types(events) == ["RequestReceived", "ResponseGenerated"]
    request, response = events
    assert request["request_id"] == response["request_id"] == reply.json()["id"]
    assert json.loads(request["messages_json"]) == QUESTION
    assert response["response_token_ids"] == [1000, 1001, 1002, 1003]
    assert response["envelope"]["session_id"] == "s1"


async def test_a_stream_is_spooled_before_its_last_chunk(server: Server) -> None:
    reply = await server.chat(stream=True)
    assert reply.status_code == 200 and reply.text.endswith("data: [DONE]\n\n")
    assert event_types(server.spooled()) == ["RequestReceived", "ResponseGenerated"]


async def test_a_session_end_request_spools_the_close_before_answering(server: Server) -> None:
    reply = await server.chat(headers={"x-session-id": "s2", "x-session-done": "true"})
    assert reply.status_code == 200, reply.text
    events = server.spooled()
    assert event_types(events) == ["RequestReceived", "ResponseGenerated", "SessionClosed"]
    assert events[2]["last_turn_id"] == reply.headers["x-turn-id"]
    closed = await server.client.post("/v1/sessions/s3/end", headers={"authorization": f"Bearer {KEY}"})
    assert closed.status_code == 200
    assert event_types(server.spooled())[-1] == "SessionClosed"


async def test_a_spool_failure_fails_the_request_and_changes_nothing_else(server: Server) -> None:
    server.reject_topic("live.responses")
    reply = await server.chat()
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "spool_unavailable"
    assert reply.headers["retry-after"]
    # The request was recorded when it arrived (as for a client that leaves); no response was.
    assert [e["envelope"]["event_type"] for e in server.spooled()] == ["RequestReceived"]
    # The session tracker never learnt of the reply: resending the conversation does not link to it.
    resent = [
        *QUESTION,
        {"role": "assistant", "content": ECHO_TEXT},
        {"role": "user", "content": "And Spain?"},
    ]
    assert server.state.tracker.assign(resent).link_method == "new"


async def test_capture_off_records_nothing_and_still_answers(server: Server) -> None:
    server.state.recorder.enabled = False
    reply = await server.chat(stream=True)
    assert reply.status_code == 200 and server.spooled() == []


def streamed_message(reply: httpx.Response) -> dict[str, Any]:
    """The assistant message a streamed reply adds up to: its content and tool calls."""
    content, calls = "", []
    for line in reply.text.splitlines():
        if not line.startswith("data: {"):
            continue
        for choice in json.loads(line.removeprefix("data: "))["choices"]:
            content += choice["delta"].get("content") or ""
            calls += [
                {k: v for k, v in c.items() if k != "index"} for c in choice["delta"].get("tool_calls", [])
            ]
    return {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}


@pytest.mark.parametrize("cache_key", [None, "4f1c2b7e-session:0"])
async def test_stock_openclaw_turns_share_one_session(server: Server, cache_key: str | None) -> None:
    # As OpenClaw sends them: streaming, 12 tools, a trailing internal-context message each time,
    # the server's tool call resent with an altered id and compact arguments; no session header.
    system = {"role": "system", "content": SYSTEM_PROMPT}
    ask = user("Which files are in the project?")
    call_text = '<tool_call>\n{"name": "exec", "arguments": {"command": "ls", "timeout": 30}}\n</tool_call>'
    server.state.backend = EchoBackend(text=call_text, context_window=65536)
    first = await server.chat(**body([system, ask, internal_context(0)], cache_key))
    reply = streamed_message(first)
    call_id = reply["tool_calls"][0]["id"]
    assert "_" in call_id  # so that OpenClaw's resend changes it
    history = [
        system,
        ask,
        resent_assistant(reply),
        {"role": "tool", "tool_call_id": call_id.replace("_", ""), "content": "a.txt"},
    ]
    server.state.backend = EchoBackend(text="There is one file, a.txt.", context_window=65536)
    second = await server.chat(**body([*history, internal_context(1)], cache_key))
    history += [resent_assistant(streamed_message(second)), user("Thanks!")]
    third = await server.chat(**body([*history, internal_context(2)], cache_key))
    assert [r.status_code for r in (first, second, third)] == [200, 200, 200]
    requests = [e for e in server.spooled() if e["envelope"]["event_type"] == "RequestReceived"]
    assert len({r["envelope"]["session_id"] for r in requests}) == 1
    assert [r["turn_index"] for r in requests] == [0, 1, 2]
    expected = ["new", "prefix", "prefix"] if cache_key is None else ["cache_key"] * 3
    assert [r["link_method"] for r in requests] == expected
    assert [r["previous_turn_id"] for r in requests[1:]] == [r["envelope"]["turn_id"] for r in requests[:2]]


async def test_metrics_answer_anyone_by_default_and_only_the_metrics_key_once_one_is_set(
    tmp_path: Path, template: ChatTemplate
) -> None:
    open_server = Server(tmp_path / "open", template)
    assert (await open_server.client.get("/metrics")).status_code == 200
    keyed = Server(tmp_path / "keyed", template, metrics_key="scrape-key")
    try:
        assert (await keyed.client.get("/metrics")).status_code == 401
        client_key = {"authorization": f"Bearer {KEY}"}
        assert (await keyed.client.get("/metrics", headers=client_key)).status_code == 401
        reply = await keyed.client.get("/metrics", headers={"authorization": "Bearer scrape-key"})
        assert reply.status_code == 200 and "orl_spool_depth" in reply.text
        assert (await keyed.client.get("/healthz")).status_code == 200  # probes stay open
    finally:
        for server in (open_server, keyed):
            await server.client.aclose()
            server.spool.close()


async def test_a_turn_over_the_record_limit_gets_a_413_before_anything_is_spooled(server: Server) -> None:
    server.state.recorder.max_record_bytes = 4096
    long_question = [{"role": "user", "content": "Why? " * 2000}]  # 10 KB: inside the 4 MB body limit
    reply = await server.chat(messages=long_question)
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert error["code"] == "record_too_large"
    assert "RequestReceived" in error["message"] and "--max-record-bytes" in error["message"]
    assert server.spooled() == []  # refused before acknowledging: the log never sees it
    assert (await server.chat()).status_code == 200  # the next turn goes through
    assert event_types(server.spooled()) == ["RequestReceived", "ResponseGenerated"]


async def test_a_session_named_by_a_non_ascii_user_is_answered_with_its_id_percent_encoded(
    server: Server,
) -> None:
    """A header value is Latin-1: the session id `user:Zoë ᚛` goes out as UTF-8 percent-encoding."""
    reply = await server.chat(user="Zoë ᚛%")
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-session-id"] == "user:Zo%C3%AB %E1%9A%9B%25"
    assert server.spooled()[0]["envelope"]["session_id"] == "user:Zoë ᚛%"


async def test_n_choices_are_one_turn_each_of_new_sessions_in_one_rollout_group(server: Server) -> None:
    reply = await server.chat(n=3, seed=41)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 3 * 4 and body["usage"]["prompt_tokens"] < 4 * 20
    requests = [e for e in server.spooled() if e["envelope"]["event_type"] == "RequestReceived"]
    assert [r["request_id"] for r in requests] == [f"{body['id']}-{i}" for i in range(3)]
    assert {(r["group_id"], r["group_size"]) for r in requests} == {(body["id"], 3)}
    assert [r["sampling"]["seed"] for r in requests] == [41, 42, 43]
    sessions = [r["envelope"]["session_id"] for r in requests]
    assert len(set(sessions)) == 3 and all(r["link_method"] == "new" for r in requests)
    assert reply.headers["x-session-ids"] == ",".join(sessions)
    assert reply.headers["x-group-id"] == body["id"]


@pytest.mark.parametrize(
    ("fields", "headers"),
    [({"n": 2, "stream": True}, {}), ({"n": 2, "user": "u"}, {}), ({"n": 2}, {"x-session-id": "s"}),
     ({"n": 2}, {"x-group-id": "g"}), ({"n": 9}, {})],
)  # fmt: skip
async def test_n_choices_refuse_what_would_put_them_elsewhere(
    server: Server, fields: dict[str, Any], headers: dict[str, str]
) -> None:
    reply = await server.chat(headers=headers, **fields)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "n"
    assert server.spooled() == []
