"""`orl audit` over a recorded namespace with a (hand-written) training step, checkpoint and later responses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.history.audit import TEXT_SHOWN
from orl.pipeline.history.namespace_io import NamespaceWriter
from orl.schemas.events import make_event

from orl.history import AuditSettings, run_audit
from tests.integration.test_replay import SOURCE, events_of, record, recorded_settings
from tests.unit.pipeline_streams import Conversation

Event = dict[str, Any]


def train_step(sample_ids: list[str], version: int, run_id: str = "run-a") -> Event:
    return make_event(
        "TrainStepCompleted", namespace=SOURCE, producer="trainer/test", occurred_at_ms=1_800_000_000_000,
        id_parts=[run_id, version], run_id=run_id, step=version, policy_version=version, sample_ids=sample_ids,
        loss=0.5, pg_loss=0.4, kl=0.01, clip_fraction=0.0, grad_norm=1.0, tokens=100, duration_s=1.0,
        tokens_per_s=100.0, dropped_stale=0, mean_staleness=0.0,
    )  # fmt: skip


def checkpoint(version: int, run_id: str = "run-a") -> Event:
    return make_event(
        "CheckpointPublished", namespace=SOURCE, producer="trainer/test", occurred_at_ms=1_800_000_000_100,
        id_parts=[run_id, version, "sha"], run_id=run_id, version=version, parent_version=version - 1,
        kind="lora", uri=f"file:///ckpt/{run_id}/{version}", manifest_key=f"checkpoints/{run_id}/{version}/manifest.json",
        manifest_sha256="ab" * 32, base_model="smollm2-135m", consumed_offsets=[], sample_id_digest="d",
    )  # fmt: skip


def activation(version: int) -> Event:
    """A server swapped to run-a's checkpoint: what it serves next is run-a's."""
    return make_event(
        "PolicyActivated", namespace=SOURCE, producer="serving/test", occurred_at_ms=1_800_000_000_500,
        id_parts=["server-1", "run-a", version], server_id="server-1", run_id="run-a", version=version,
        uri=f"file:///ckpt/run-a/{version}", swap_latency_ms=5.0,
    )  # fmt: skip


async def history(tmp_path: Path) -> tuple[str, list[Event]]:
    settings = recorded_settings(tmp_path)
    log_url = settings.effective_log_url()
    neutral = Conversation("neutral", namespace=SOURCE)  # a reply that neither thanks nor corrects: rejected
    neutral.say("What is 2 + 2?")
    neutral.turn("4.")
    neutral.say("Ok.")
    neutral.turn("Anything else?")
    neutral.close()
    async with open_event_log(log_url) as log:
        writer = NamespaceWriter(log, SOURCE)
        await writer.prepare()
        await writer.write(neutral.events)
        await record(log, settings, sessions=2)
        samples = await events_of(log, SOURCE, "samples")
        ready = [s for s in samples if s["envelope"]["event_type"] == "SampleReady"]
        later = Conversation("after", namespace=SOURCE, now_ms=1_800_000_001_000)
        later.say("Hello again")
        later.turn("Hi! Served by the new version.", policy_version=1)
        await writer.write(
            [
                train_step([s["envelope"]["event_id"] for s in ready], 1),
                checkpoint(1),
                activation(1),
                *later.events,
            ]
        )
    return log_url, samples


def audit(
    tmp_path: Path, log_url: str, capsys: pytest.CaptureFixture[str], **args: Any
) -> tuple[int, str, str]:
    code = run_audit(AuditSettings(data_dir=tmp_path, log_url=log_url, namespace=SOURCE, **args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_sample_id_shows_its_whole_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_url, samples = asyncio.run(history(tmp_path))
    sample = next(s for s in samples if s["envelope"]["event_type"] == "SampleReady" and s["reward"] == -1.0)
    code, out, _ = audit(tmp_path, log_url, capsys, id=sample["envelope"]["event_id"], json=True)
    assert code == 0
    chain = json.loads(out)
    assert chain["turn_id"] == sample["envelope"]["turn_id"]
    assert chain["request"]["messages"] and chain["response"]["response_text"]
    assert "Please redo" in chain["next_states"][0]["content"]
    assert chain["votes"] and chain["votes"][0]["raw_output"] and chain["votes"][0]["judge_config_version"]
    assert "Please redo" in chain["votes"][0]["prompt_text"]  # the text the judge saw
    assert chain["rewards"][0]["rule"] and chain["rewards"][0]["reason"]
    assert chain["hint_decisions"][0]["type"] == "HintSelected"
    training = chain["samples"][0]["training"][0]
    assert training["train_step"]["run_id"] == "run-a" and training["train_step"]["policy_version"] == 1
    assert training["checkpoints"][0]["uri"] == "file:///ckpt/run-a/1"
    assert training["served"]["responses"] == 1
    assert training["served"]["first"][0]["text"] == "Hi! Served by the new version."
    code, text, _ = audit(tmp_path, log_url, capsys, id=sample["envelope"]["event_id"])
    assert code == 0 and "train step" in text and "checkpoint" in text and "raw:" in text


def test_every_kind_of_id_finds_the_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_url, samples = asyncio.run(history(tmp_path))
    sample = next(s for s in samples if s["envelope"]["event_type"] == "SampleReady")
    turn_id = sample["envelope"]["turn_id"]
    for any_id in (turn_id, sample["lineage"]["response_event_id"], sample["lineage"]["reward_event_id"]):
        code, out, _ = audit(tmp_path, log_url, capsys, id=any_id, json=True)
        assert code == 0 and json.loads(out)["turn_id"] == turn_id
    rejected = [s for s in samples if s["envelope"]["event_type"] == "SampleRejected"]
    code, out, _ = audit(tmp_path, log_url, capsys, id=rejected[0]["envelope"]["event_id"])
    assert code == 0 and "sample rejected" in out
    code, out, _ = audit(tmp_path, log_url, capsys, id=checkpoint(1)["envelope"]["event_id"], json=True)
    assert code == 0 and json.loads(out)["samples"]
    code, out, _ = audit(tmp_path, log_url, capsys, session="s0", json=True)
    assert code == 0 and json.loads(out)["checkpoints"][0]["version"] == 1


def test_a_request_longer_than_the_shown_text_is_parsed_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A late turn's request holds the whole conversation: its messages are read whole, then each
    message's text is shortened (the audit once shortened the JSON first, and failed to parse it)."""
    log_url, samples = asyncio.run(history(tmp_path))
    requests = asyncio.run(namespace_requests(log_url))
    long_turns = {e["envelope"]["turn_id"]: e for e in requests if len(e["messages_json"]) > TEXT_SHOWN}
    assert long_turns, "the recorded conversations must have a request longer than TEXT_SHOWN"
    for turn_id, request in long_turns.items():
        code, out, err = audit(tmp_path, log_url, capsys, id=turn_id, json=True)
        assert code == 0, err
        shown = json.loads(out)["request"]["messages"]
        recorded = json.loads(request["messages_json"])
        assert [m["role"] for m in shown] == [m["role"] for m in recorded]
        assert all(len(m["content"]) <= TEXT_SHOWN + 40 for m in shown if isinstance(m["content"], str))


async def namespace_requests(log_url: str) -> list[Event]:
    async with open_event_log(log_url) as log:
        return await events_of(log, SOURCE, "requests")


def test_an_unknown_id_is_not_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log_url, _ = asyncio.run(history(tmp_path))
    code, out, err = audit(tmp_path, log_url, capsys, id="SampleReady-000000000000000000000000")
    assert code == 1 and out == "" and "not found" in err and "Traceback" not in err
    code, _, err = audit(tmp_path, log_url, capsys, session="nobody")
    assert code == 1 and "not found" in err


def test_the_command_line_takes_the_id_as_its_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`orl audit ID --json` as the README writes it; `--id ID` is the same; two different ids are refused."""
    from orl.cli import main

    log_url, samples = asyncio.run(history(tmp_path))
    sample_id = next(s for s in samples if s["envelope"]["event_type"] == "SampleReady")["envelope"][
        "event_id"
    ]
    where = ["--data-dir", str(tmp_path), "--log-url", log_url, "--namespace", SOURCE]
    assert main(["audit", sample_id, "--json", *where]) == 0
    by_argument = json.loads(capsys.readouterr().out)
    assert by_argument["id"] == sample_id and by_argument["votes"]
    assert main(["audit", "--id", sample_id, "--json", *where]) == 0
    assert json.loads(capsys.readouterr().out) == by_argument
    assert main(["audit", sample_id, "--id", "other", *where]) == 1
    assert "--id 'other' and the argument" in capsys.readouterr().err


def test_a_run_no_server_activated_served_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Version numbers repeat across runs: run-b's v1 (trained, say, in a replay) did not serve
    the v1 responses that run-a's activated v1 served."""
    log_url, samples = asyncio.run(history(tmp_path))
    ready = [s["envelope"]["event_id"] for s in samples if s["envelope"]["event_type"] == "SampleReady"]

    async def train_run_b() -> None:
        async with open_event_log(log_url) as log:
            await NamespaceWriter(log, SOURCE).write([train_step(ready, 1, "run-b"), checkpoint(1, "run-b")])

    asyncio.run(train_run_b())
    served = {}
    for run_id in ("run-a", "run-b"):
        code, out, _ = audit(
            tmp_path, log_url, capsys, id=checkpoint(1, run_id)["envelope"]["event_id"], json=True
        )
        (step,) = json.loads(out)["train_steps"]
        assert code == 0 and step["train_step"]["run_id"] == run_id and len(step["checkpoints"]) == 1
        served[run_id] = (step["served"]["responses"], step["served"]["activations"])
    assert served == {"run-a": (1, 1), "run-b": (0, 0)}
