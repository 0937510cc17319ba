"""Erasure on the embedded log, as a user does it: `orl forget --tenant alice --retrain`.

Two client keys talk to SmolLM2 through `orl serve`: the named tenant alice's (--tenant-keys) and a
plain client key B's. Alice's turns carry a planted canary (chat turns and a stored Responses API
conversation), B's do not. The pipeline's stages judge the
traffic, `orl train` trains one step on every sample, `orl archive` copies the namespace to the
object store and `orl replay` copies it into a second namespace. With the key store the canary reads
back through `orl export`, yet no file holds it in clear (everything is sealed at rest). After
`orl forget --tenant alice --retrain` (by name: the server recorded which key id is alice's, the
key itself is nowhere but the server's settings): the report lists the checkpoint trained on A's samples; a new run
was trained without them; export, replay and audit say "forgotten" instead of failing; and not one
byte of the canary is readable anywhere: every file under the data dir, the object store, the key
store, and a fresh export.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.runtime.settings import PipelineSettings

from orl.cli import main
from tests.e2e.test_turns_to_samples import _wait_for_spool, run_stages
from tests.fixtures.model import test_cache_dir
from tests.integration.serve_process import serve_process
from tests.integration.test_replay import events_of

pytestmark = [pytest.mark.model, pytest.mark.slow]
CANARY = "zebra-canary-5f2c91"
KEY_A, KEY_B = "tenant-a-key", "tenant-b-key"


def _post(base_url: str, path: str, key: str, session: str, body: dict) -> dict:
    headers = {"Authorization": f"Bearer {key}", "X-Session-Id": session}
    reply = httpx.post(
        f"{base_url}{path}", json={"model": "orl-policy", **body}, headers=headers, timeout=120
    )
    reply.raise_for_status()
    return dict(reply.json())


def _talk(base_url: str, key: str, session: str, secret: str) -> None:
    question = [{"role": "user", "content": f"My locker code is {secret}. How do I simplify 18/24?"}]
    answer = _post(base_url, "/v1/chat/completions", key, session, {"messages": question, "max_tokens": 16})
    text = answer["choices"][0]["message"]["content"]
    redo = [*question, {"role": "assistant", "content": text},
            {"role": "user", "content": f"Please redo this, and remember {secret}."}]  # fmt: skip
    _post(base_url, "/v1/chat/completions", key, session, {"messages": redo, "max_tokens": 16})
    thanks = [
        *redo,
        {"role": "assistant", "content": "3/4."},
        {"role": "user", "content": "Thanks, that works."},
    ]
    headers_done = {"Authorization": f"Bearer {key}", "X-Session-Id": session, "X-Session-Done": "true"}
    body = {"model": "orl-policy", "messages": thanks, "max_tokens": 1}
    httpx.post(
        f"{base_url}/v1/chat/completions", json=body, headers=headers_done, timeout=120
    ).raise_for_status()


def _files_holding(needle: bytes, *roots: Path) -> list[str]:
    return sorted(
        str(path)
        for root in roots
        for path in root.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    )


async def _events(log_url: str, namespace: str, topic: str) -> list[dict]:
    async with open_event_log(log_url) as log:
        return await events_of(log, namespace, topic)


def test_forget_a_tenant_leaves_no_readable_byte_and_retrains_without_it(
    tmp_path: Path,
    base_model_dir: Path,
    deployment_key_store: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log_url = f"sqlite:///{tmp_path / 'log.db'}"
    with serve_process(
        tmp_path, log_url=log_url, extra_env={"ORL_API_KEYS": KEY_B, "ORL_TENANT_KEYS": f"alice={KEY_A}"}
    ) as server:
        _talk(server.base_url, KEY_A, "a1", CANARY)
        _talk(server.base_url, KEY_A, "a2", CANARY)
        _talk(server.base_url, KEY_B, "b1", "nothing secret")
        stored = _post(server.base_url, "/v1/responses", KEY_A, "a3", {"input": f"Keep {CANARY}", "store": True,
                       "max_output_tokens": 4})  # fmt: skip
        follow = {"input": "And then?", "previous_response_id": stored["id"], "max_output_tokens": 4}
        _post(server.base_url, "/v1/responses", KEY_A, "a3", follow)  # the stored conversation reads back
        asyncio.run(_wait_for_spool(log_url))
    pipeline = PipelineSettings(
        data_dir=tmp_path, log_url=log_url, method="binary", judge="user_reply", hint_judge="user_hint"
    )
    asyncio.run(run_stages(pipeline))
    samples = asyncio.run(_events(log_url, "live", "samples"))
    ready = [s for s in samples if s["envelope"]["event_type"] == "SampleReady"]
    assert {s["envelope"]["session_id"] for s in ready} >= {"a1", "b1"}, samples

    where = [
        "--data-dir",
        str(tmp_path),
        "--log-url",
        log_url,
        "--store-url",
        f"file://{tmp_path / 'objects'}",
    ]
    monkeypatch.setenv("ORL_MODEL_CACHE", str(test_cache_dir()))
    monkeypatch.setenv("ORL_TRAIN_BATCH_SIZE", str(len(ready)))  # one step on every sample, A's included
    assert main(["train", *where, "--namespace", "live", "--run-id", "live", "--max-steps", "1",
                 "--idle-exit-s", "10", "--max-staleness", "-1", "--model", str(base_model_dir)]) == 0  # fmt: skip
    # alice's own adapter (--tenant-adapters trains it so): her sessions' samples only, as the key store names them
    alices = [s["envelope"]["event_id"] for s in ready if s["envelope"]["session_id"].startswith("a")]
    monkeypatch.setenv("ORL_TRAIN_BATCH_SIZE", str(len(ready)))  # a partial batch once the stream is quiet
    assert main(["train", *where, "--namespace", "live", "--run-id", "live.alice", "--tenant", "alice",
                 "--max-steps", "1", "--idle-exit-s", "10", "--max-staleness", "-1",
                 "--partial-batch-after-s", "2", "--model", str(base_model_dir)]) == 0  # fmt: skip
    steps = {s["run_id"]: s for s in asyncio.run(_events(log_url, "live", "train_steps"))}
    assert sorted(steps["live.alice"]["sample_ids"]) == sorted(alices)
    assert set(steps["live"]["sample_ids"]) > set(alices)  # the shared run trained every session's
    assert main(["archive", *where, "--namespace", "live"]) == 0
    assert main(["replay", *where, "--namespace", "live", "--target-namespace", "copy", "--no-progress"]) == 0
    capsys.readouterr()

    # Before: readable through orl with the key store, yet in clear in no file.
    assert main(["export", *where, "--namespace", "live"]) == 0
    assert CANARY in capsys.readouterr().out
    roots = (tmp_path, deployment_key_store.parent)
    assert _files_holding(CANARY.encode(), *roots) == []

    # alice's own curve: `orl report --tenant alice` counts the main turns of her sessions only.
    requests = asyncio.run(_events(log_url, "live", "requests"))
    main_turns = [r["envelope"]["session_id"] for r in requests if r["turn_kind"] == "main"]
    for tenant in ("", "alice"):
        out_dir = tmp_path / f"report-{tenant or 'all'}"
        assert main(["report", *where, "--namespace", "live", "--out-dir", str(out_dir),
                     *(["--tenant", tenant] if tenant else [])]) == 0  # fmt: skip
        rows = json.loads((out_dir / "report.json").read_text())
        counted = sum(row["main_turns"] for row in rows)
        assert counted == len([s for s in main_turns if not tenant or s.startswith("a")]), (
            tenant,
            main_turns,
        )
    assert "b1" in main_turns  # the other key's session is in the log, and in the first report only
    capsys.readouterr()

    monkeypatch.setenv("ORL_TRAIN_BATCH_SIZE", "1")  # the retrained run: B's samples make its step
    code = main(["forget", *where, "--namespace", "live", "--tenant", "alice", "--json", "--retrain",
                 "--retrain-steps", "1", "--model", str(base_model_dir)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    report = json.loads(out[: out.index("\n}\n") + 2])
    assert report["tenant"] == "alice"
    assert {s["session_id"] for s in report["sessions"]} == {"a1", "a2", "a3"}
    assert all(s["keys_destroyed"] == 1 for s in report["sessions"])
    # the steps trained on A's samples: the shared run's and alice's own adapter's
    assert sorted((c["run_id"], c["version"]) for c in report["checkpoints"]) == [
        ("live", 1),
        ("live.alice", 1),
    ]
    checkpoint = next(c for c in report["checkpoints"] if c["run_id"] == "live")
    assert {s["envelope"]["event_id"] for s in ready if s["envelope"]["session_id"].startswith("a")} <= set(
        checkpoint["samples"]
    )
    retrain = next(line for line in out.splitlines() if line.startswith("retraining without them"))
    target = retrain.split("--target-namespace ")[1].split()[0]
    # the shared run is replaced; alice's own run has nothing left to retrain it on, and is not
    assert f"run live is replaced by run {target}" in out
    assert "run live.alice: every session it trained on is forgotten" in out
    [step] = asyncio.run(_events(log_url, target, "train_steps"))
    assert step["policy_version"] == 1 and (tmp_path / "objects" / "checkpoints" / target).is_dir()
    retrained = asyncio.run(_events(log_url, target, "samples"))
    assert retrained and {s["envelope"]["session_id"] for s in retrained} == {"b1"}
    assert set(step["sample_ids"]) <= {s["envelope"]["event_id"] for s in retrained}

    # After: every reader says forgotten instead of failing, and no byte of the canary is readable.
    export = tmp_path / "after.jsonl"
    assert main(["export", *where, "--namespace", "live", "--output", str(export)]) == 0
    rows = [json.loads(line) for line in export.read_text().splitlines()]
    forgotten = [r["event"] for r in rows if r["event"].get("payload_forgotten")]
    assert {e["envelope"]["session_id"] for e in forgotten} == {"a1", "a2", "a3"}
    readable = [r["event"] for r in rows if not r["event"].get("payload_forgotten")]
    assert {e["envelope"].get("session_id") for e in readable} - {None} == {"b1"}
    assert {s["envelope"]["session_id"] for s in asyncio.run(_events(log_url, "copy", "samples"))} == {"b1"}
    a_sample = next(s for s in ready if s["envelope"]["session_id"] == "a1")
    assert main(["audit", a_sample["envelope"]["event_id"], *where, "--namespace", "live"]) == 0
    assert "payload forgotten" in capsys.readouterr().out
    assert main(["audit", "--session", "a1", *where, "--namespace", "live", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoints"][0]["version"] == 1  # lineage stays
    assert main(["export", *where, "--namespace", "copy"]) == 0
    assert CANARY not in capsys.readouterr().out
    assert _files_holding(CANARY.encode(), *roots) == []
    assert KEY_A.encode() not in deployment_key_store.read_bytes()  # the store keeps key ids, not keys
