"""Prompts are rendered and tokenised on a thread of their own: while one prompt is being tokenised,
the event loop goes on answering (health checks, other requests' streams)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from orl.serving.policy.chat_template import ChatTemplate

from tests.component.test_capture_chat import INTERNAL_KEY, Server, template  # noqa: F401 - a fixture


async def test_the_server_answers_while_a_prompt_is_being_tokenised(
    tmp_path: Path,
    template: ChatTemplate,  # noqa: F811
    monkeypatch: Any,
) -> None:
    server = Server(tmp_path, template)
    release, rendering_threads = threading.Event(), []
    original = template.render_text

    def slow_render(*args: Any, **kwargs: Any) -> str:  # a long prompt, as slow as the test wants
        rendering_threads.append(threading.current_thread().name)
        assert release.wait(timeout=30), "the test never released the render"
        return original(*args, **kwargs)

    monkeypatch.setattr(template, "render_text", slow_render)
    try:
        chat = asyncio.create_task(server.chat())
        while not rendering_threads:
            await asyncio.sleep(0.01)
        health = await asyncio.wait_for(server.client.get("/healthz"), timeout=5)
        assert health.status_code == 200  # answered while the prompt is still being rendered
        assert not chat.done()
        release.set()
        reply = await asyncio.wait_for(chat, timeout=30)
        assert reply.status_code == 200, reply.text
        assert rendering_threads == ["orl-tokenize_0"]
        scored = await server.client.post(
            "/v1/orl/score",
            json={"messages": [{"role": "user", "content": "hi"}], "response_token_ids": [504]},
            headers={"authorization": f"Bearer {INTERNAL_KEY}"},
        )
        assert scored.status_code == 200 and rendering_threads == ["orl-tokenize_0"] * 2
    finally:
        release.set()
        await server.client.aclose()
        server.spool.close()
