"""A session of key A attacked with key B (issue 44): every attempt is refused, nothing reaches the log.

The real app (`build_app` over the zero-cost echo backend and the real SmolLM2 tokenizer, a real
spool file, test webhook mappings), two client keys. Key A opens sessions four ways (a header, a
body `session_id`, OpenAI's `user`, `prompt_cache_key`) and by POST /v1/sessions/start; key B then
tries every way in to each: chat turns naming the session, feedback, rewards, observations, a
webhook, the end route, and resending A's whole conversation (which links by messages only within
a key, so it starts a session of B's own). The server is then started again on the same spool
file and B tries again. Each attempt must be a 403 `session_forbidden` (or, for the resent
conversation, a new session), A's own posts must still be taken, and the spool must hold no event
of B's in A's sessions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from orl.connectors.environment.webhook import webhook_mappings
from orl.connectors.metrics import Metrics
from orl.schemas.codec import decode
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.ingest import ingest_routes
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool
from starlette.applications import Starlette

from benchmarks.echo_backend import EchoBackend

KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"
WEBHOOKS = {"ci": {"session_id": "$.session", "content": "$.log"}}
QUESTION = [{"role": "user", "content": "What is 7 * 8?"}]


class Server:
    def __init__(self, spool_path: Path, template: ChatTemplate) -> None:
        self.spool = EventSpool(spool_path, sync="normal")
        self.state = ServerState(
            settings=ServeSettings(api_keys=(KEY_A, KEY_B), admin_key="admin"),
            backend=EchoBackend(),
            template=template,
            recorder=EventRecorder(self.spool, "live", clock_ms=lambda: 1_700_000_000_000),
            metrics=Metrics(),
            ready=True,
        )
        routes = [*ingest_routes(self.state, webhook_mappings(WEBHOOKS)), *build_app(self.state).routes]
        transport = httpx.ASGITransport(app=Starlette(routes=routes), raise_app_exceptions=True)
        self.client = httpx.AsyncClient(transport=transport, base_url="http://orl")

    async def post(
        self, key: str, path: str, body: Any, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        return await self.client.post(
            path, json=body, headers={"authorization": f"Bearer {key}", **(headers or {})}
        )

    async def chat(self, key: str, messages: list[dict[str, Any]], **fields: Any) -> httpx.Response:
        headers = fields.pop("headers", None)
        body = {"messages": messages, "max_tokens": 4, **fields}
        return await self.post(key, "/v1/chat/completions", body, headers)

    def events_of(self, session_id: str) -> list[dict[str, Any]]:
        events = [decode(e.value) for e in self.spool.oldest(100_000)]
        return [e for e in events if e["envelope"].get("session_id") == session_id]

    async def close(self) -> None:
        await self.client.aclose()
        self.spool.close()


@pytest.fixture(scope="module")
def template(base_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_dir(base_model_dir)


def forbidden(reply: httpx.Response) -> bool:
    return reply.status_code == 403 and reply.json()["error"]["code"] == "session_forbidden"


async def open_sessions(server: Server) -> dict[str, tuple[str, dict[str, Any]]]:
    """Key A's sessions: name -> (session id, the chat fields that name it)."""
    ways = {
        "header": {"headers": {"x-session-id": "a-header-session"}},
        "body": {"session_id": "a-body-session"},
        "user": {"user": "alice"},
        "cache_key": {"prompt_cache_key": "a-cache:0"},
    }
    sessions = {}
    for name, fields in ways.items():
        reply = await server.chat(
            KEY_A, QUESTION, **{k: dict(v) if isinstance(v, dict) else v for k, v in fields.items()}
        )
        assert reply.status_code == 200, reply.text
        sessions[name] = (reply.headers["x-session-id"], fields)
    started = await server.post(KEY_A, "/v1/sessions/start", {"task_id": "t1"})
    sessions["started"] = (
        started.json()["session_id"],
        {"headers": {"x-session-id": started.json()["session_id"]}},
    )
    return sessions


async def attacks(server: Server, session_id: str, chat_fields: dict[str, Any]) -> list[httpx.Response]:
    """Every way key B can try to act on `session_id`."""
    fields = {k: dict(v) if isinstance(v, dict) else v for k, v in chat_fields.items()}
    return [
        await server.chat(
            KEY_B,
            [*QUESTION, {"role": "assistant", "content": "56"}, {"role": "user", "content": "Wrong!"}],
            **fields,
        ),
        await server.post(KEY_B, "/v1/feedback", {"session_id": session_id, "thumbs": -1, "text": "Bad."}),
        await server.post(KEY_B, "/v1/rewards", {"session_id": session_id, "reward": -1.0}),
        await server.post(
            KEY_B,
            "/v1/observations",
            {"session_id": session_id, "source": "pytest", "content": "0 passed", "role": "tool"},
        ),
        await server.post(KEY_B, "/v1/webhooks/ci", {"session": session_id, "log": "build failed"}),
        await server.post(KEY_B, f"/v1/sessions/{session_id}/end", {}),
    ]


async def test_every_attempt_of_key_b_on_key_as_sessions_is_refused(
    tmp_path: Path, template: ChatTemplate
) -> None:
    server = Server(tmp_path / "spool.db", template)
    try:
        sessions = await open_sessions(server)
        before = {sid: len(server.events_of(sid)) for sid, _ in sessions.values()}
        refused = tried = 0
        for session_id, fields in sessions.values():
            for reply in await attacks(server, session_id, fields):
                tried += 1
                refused += forbidden(reply)
                assert forbidden(reply), (session_id, reply.request.url, reply.status_code, reply.text)
        assert {sid: len(server.events_of(sid)) for sid, _ in sessions.values()} == before

        # B resends A's whole conversation: linked by messages within B's own sessions only
        a_reply = (await server.chat(KEY_A, QUESTION)).json()["choices"][0]["message"]["content"]
        resent = [*QUESTION, {"role": "assistant", "content": a_reply}, {"role": "user", "content": "Thanks"}]
        own = await server.chat(KEY_A, resent)
        theirs = await server.chat(KEY_B, resent)
        tried += 1
        assert own.status_code == theirs.status_code == 200
        assert theirs.headers["x-session-id"] != own.headers["x-session-id"]
        refused += theirs.headers["x-session-id"] != own.headers["x-session-id"]

        # A's own posts are still taken
        header_session = sessions["header"][0]
        assert (
            await server.post(KEY_A, "/v1/feedback", {"session_id": header_session, "thumbs": 1})
        ).status_code == 202
        assert (await server.post(KEY_A, f"/v1/sessions/{header_session}/end", {})).status_code == 200
    finally:
        await server.close()

    # the server starts again on the same spool file: the owners are still known
    again = Server(tmp_path / "spool.db", template)
    try:
        for session_id, fields in sessions.values():
            for reply in await attacks(again, session_id, fields):
                tried += 1
                refused += forbidden(reply)
                assert forbidden(reply), (session_id, reply.request.url, reply.status_code, reply.text)
        assert (
            await again.post(
                KEY_A,
                "/v1/rewards",
                {"session_id": sessions["body"][0], "turn_id": f"{sessions['body'][0]}/t0", "reward": 1.0},
            )
        ).status_code == 202
    finally:
        await again.close()
    print(f"cross-key attempts: {tried}, refused or isolated: {refused}")
    assert refused == tried
