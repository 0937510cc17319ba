"""`orl rollout` against a scripted OpenAI-compatible server on loopback (a fake at the process edge).

The fake answers like orl's server does (session start, chat completions with an `x-turn-id`
header, observations, session end) and records every request, so the tests check what the runner
sends: the group headers, the tool loop (assistant message plus the environment's tool messages in
the next request), the step limit, the verdict on the last turn, the session's end, the JSON lines
and the summary. The model is a script: it calls `calculate` on "What is X?" and then repeats the
tool's answer, and says it does not know anything else.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from orl.connectors.environment.tool_env import ToolEnvironment

from orl.cli import main
from orl.rollout import RolloutResult, summary, wilson_interval

KEY = "k-test"


@dataclass
class FakeServer:
    always_call_tools: bool = False
    requests: list[tuple[str, dict[str, str], dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: int = 0
    turns: int = 0

    def answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> tuple[int, dict, dict]:
        with self.lock:
            self.requests.append((path, headers, body))
            if headers.get("authorization") != f"Bearer {KEY}":
                return 401, {"error": {"message": "bad key"}}, {}
            if path == "/v1/sessions/start":
                self.sessions += 1
                return 200, {"session_id": f"s{self.sessions}"}, {}
            if path == "/v1/observations":
                return 202, {"event_id": f"e-{body['turn_id']}"}, {}
            if re.fullmatch(r"/v1/sessions/[^/]+/end", path):
                return 200, {"closed": True}, {}
            if path == "/v1/chat/completions":
                self.turns += 1
                turn_id = f"{headers['x-session-id']}/t{self.turns}"
                return 200, {"choices": [{"message": self.reply(body["messages"])}]}, {"x-turn-id": turn_id}
        return 404, {"error": {"message": "no route"}}, {}

    def reply(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        last = messages[-1]
        if last["role"] == "tool" and not self.always_call_tools:
            return {"role": "assistant", "content": f"It is {last['content']}."}
        planned = self.plan(messages[1]["content"])
        if planned is None:
            return {"role": "assistant", "content": "I do not know."}
        name, arguments = planned
        tool_call = {"id": f"call_{len(messages)}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [tool_call]}

    def plan(self, question: str) -> tuple[str, dict[str, str]] | None:
        """The one tool call that solves `question`, when the script knows one."""
        if asked := re.fullmatch(r"What is (.+)\?", question):
            return "calculate", {"expression": asked.group(1)}
        if asked := re.fullmatch(r"Create a file named (\S+) containing exactly this text: (.+)", question):
            return "shell", {"command": f"printf '%s\\n' '{asked.group(2)}' > {asked.group(1)}"}
        if asked := re.match(r"The file (\S+) is in the working folder", question):
            return "shell", {"command": f"wc -l < {asked.group(1)} > answer.txt"}
        return None


@pytest.fixture
def fake() -> Iterator[tuple[FakeServer, str]]:
    script = FakeServer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, body, extra = script.answer(self.path, headers, json.loads(raw or b"{}"))
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in {"content-type": "application/json", **extra}.items():
                self.send_header(name, value)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield script, f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def rollout(url: str, out: Path, *extra: str) -> int:
    argv = ["rollout", "--env=tool", f"--server-url={url}", f"--api-key={KEY}", f"--out={out}", *extra]
    return main(argv)


def test_rollouts_run_in_groups_and_report_verdicts(
    fake: tuple[FakeServer, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script, url = fake
    out = tmp_path / "r.jsonl"
    args = ("--tasks=4", "--group-size=3", "--concurrency=3", "--seed=7", "--split=eval", "--max-steps=4")
    assert rollout(url, out, *args) == 0

    results = [json.loads(line) for line in out.read_text().splitlines()]
    tasks = {t.task_id: t for t in ToolEnvironment().tasks("eval", 4, seed=7)}
    assert len(results) == 12 and {r["task_id"] for r in results} == set(tasks)
    for result in results:
        task = tasks[result["task_id"]]
        assert result["group_id"] == f"{task.task_id}:7" and result["error"] is None
        chats = [(h, b) for p, h, b in script.requests if p == "/v1/chat/completions" and h["x-session-id"] == result["session_id"]]  # fmt: skip
        assert len(chats) == result["steps"] == len(result["turn_ids"])
        for headers, body in chats:
            assert (headers["x-group-id"], headers["x-group-size"]) == (result["group_id"], "3")
            assert headers["x-turn-type"] == "main"
            assert body["tools"] == [dict(tool) for tool in task.tools] and body["temperature"] == 1.0
        [observation] = [b for p, _, b in script.requests if p == "/v1/observations" and b["session_id"] == result["session_id"]]  # fmt: skip
        assert observation["turn_id"] == result["turn_ids"][-1] and observation["source"] == "env:tool"
        assert observation["role"] == "environment" and "\n" not in observation["content"]
        assert observation["outcome"]["kind"] == "task"
        assert observation["outcome"]["reward"] == result["reward"]
        paths = [p for p, _, b in script.requests if b.get("session_id") == result["session_id"] or p.endswith(f"/{result['session_id']}/end")]  # fmt: skip
        assert paths[-2:] == ["/v1/observations", f"/v1/sessions/{result['session_id']}/end"]
        if task.data["kind"] == "arithmetic":  # the script solves these with one tool call
            assert (result["steps"], result["reward"], len(result["tool_calls"])) == (2, 1.0, 1)
            second = chats[1][1]["messages"]
            assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
            assert second[2]["tool_calls"][0]["function"]["name"] == "calculate"
            assert second[3]["content"] == result["final_text"].removeprefix("It is ").removesuffix(".")
        else:
            assert (result["steps"], result["reward"], result["tool_calls"]) == (1, -1.0, [])
    groups = {r["group_id"] for r in results}
    assert len(groups) == 4 and all(sum(r["group_id"] == g for r in results) == 3 for g in groups)

    printed = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("[") for line in printed) == 12 and printed[-2].startswith(
        summary_prefix(results)
    )
    assert "[95% Wilson" in printed[-2] and "mean steps" in printed[-2]


def summary_prefix(results: list[dict[str, Any]]) -> str:
    won = sum(r["reward"] == 1.0 for r in results)
    return f"{won}/{len(results)} succeeded"


def test_a_rollout_stops_at_max_steps(fake: tuple[FakeServer, str], tmp_path: Path) -> None:
    script, url = fake
    script.always_call_tools = True
    out = tmp_path / "r.jsonl"
    assert rollout(url, out, "--tasks=6", "--group-size=1", "--max-steps=3") == 0
    arithmetic = [r for r in map(json.loads, out.read_text().splitlines()) if r["tool_calls"]]
    assert arithmetic and all(r["steps"] == 3 and len(r["tool_calls"]) == 3 for r in arithmetic)
    assert all(r["reward"] == -1.0 and r["final_text"] == "" for r in arithmetic)


def test_evaluation_rollouts_are_side_turns(fake: tuple[FakeServer, str], tmp_path: Path) -> None:
    script, url = fake
    assert rollout(url, tmp_path / "r.jsonl", "--tasks=2", "--group-size=1", "--turn-type=side") == 0
    chats = [h for p, h, _ in script.requests if p == "/v1/chat/completions"]
    assert chats and {h["x-turn-type"] for h in chats} == {"side"}


def test_a_refused_request_is_an_error_of_that_rollout(fake: tuple[FakeServer, str], tmp_path: Path) -> None:
    _, url = fake
    out = tmp_path / "r.jsonl"
    argv = [
        "rollout",
        f"--server-url={url}",
        "--api-key=wrong",
        f"--out={out}",
        "--tasks=2",
        "--group-size=1",
    ]
    assert main(argv) == 1
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["error"] for r in results] == ["IngestError: HTTP 401: bad key"] * 2


def test_settings_are_checked_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["rollout", "--api-key=k", "--group-size=0", f"--out={tmp_path / 'x'}"]) == 1
    assert "--group-size must be at least 1" in capsys.readouterr().err
    assert main(["rollout", "--api-key=k", "--env=nope", f"--out={tmp_path / 'x'}"]) == 1
    assert "no environment 'nope'; known: terminal, tool, tool_result" in capsys.readouterr().err
    assert main(["rollout", "--api-key=k", "--turn-type=eval", f"--out={tmp_path / 'x'}"]) == 1
    assert "--turn-type: 'eval' is not one of main | side" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_wilson_interval_and_summary() -> None:
    low, high = wilson_interval(8, 10)
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0

    results = [
        RolloutResult("t", "t:0", turn_ids=["a", "b"], reward=1.0),
        RolloutResult("t", "t:0", error="boom"),
    ]
    results.append(RolloutResult("u", "u:0", turn_ids=["c"], reward=-1.0))
    assert summary(results, 2.0) == (
        "1/2 succeeded: 0.50 [95% Wilson 0.09, 0.91]; mean steps 1.50; 1 failed with an error; 2.0 s"
    )


def test_terminal_rollouts_solve_in_their_own_folders_which_are_removed(
    fake: tuple[FakeServer, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = fake
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where the episodes' folders go
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "r.jsonl"
    argv = ["rollout", "--env=terminal", f"--server-url={url}", f"--api-key={KEY}", f"--out={out}"]
    assert main([*argv, "--tasks=6", "--group-size=2", "--concurrency=4", "--max-steps=3"]) == 0
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(results) == 12 and all(r["reward"] == 1.0 and r["steps"] == 2 for r in results), results
    assert {r["tool_calls"][0]["name"] for r in results} == {"shell"}
    assert {json.loads(r["tool_calls"][0]["arguments"])["command"].split()[0] for r in results} == {
        "printf",
        "wc",
    }
    assert list((tmp_path / "tmp").iterdir()) == []
