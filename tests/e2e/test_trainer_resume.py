"""kill -9 of the trainer before, during and after a checkpoint write, then restart: exact resume.

A child trainer process (tests/e2e/trainer_crash_main.py, the real `orl train` entry point) reads a
samples topic worth 5 steps (N = 2, rejected samples interleaved) and is killed again and again:
at named crash points (mid_upload, after_manifest, after_step: the child wraps its object store in
tests/support/crashing_store.py, nothing in the trainer knows) and once from outside at an arbitrary
moment. After the final clean run, the manifests' sample ids are exactly the topic's
samples in order (no duplicate, no gap), each version's parent is the previous one, no incomplete
checkpoint remains and every version has exactly one TrainStepCompleted and CheckpointPublished.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from orl.connectors.checkpoint_store import Manifest, incomplete_checkpoints, latest_checkpoint
from orl.connectors.event_log.base import ConsumedRecord, OutgoingRecord, TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.schemas.codec import decode, encode
from orl.schemas.events import make_event
from orl.schemas.topics import topic_name

from tests.integration.serve_process import ADMIN_KEY, serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "crash"
RUN = "crashrun"
STEPS = 5
BATCH = 2
ROUND_TIMEOUT_S = 240


def sample_events() -> list[dict[str, Any]]:
    """2 * STEPS SampleReady with valid token ids, and a SampleRejected after every third."""
    rng = random.Random(7)
    events = []
    for i in range(BATCH * STEPS):
        response = [rng.randrange(100, 20000) for _ in range(6)] + [2]
        events.append(make_event(
            "SampleReady", namespace=NAMESPACE, producer="test", occurred_at_ms=1000 + i, id_parts=[i],
            session_id=f"s{i}", turn_id=f"t{i}", method="binary",
            prompt_token_ids=[1, 9690, 198] + [rng.randrange(100, 20000) for _ in range(8)],
            response_token_ids=response, old_logprobs=[-1.0] * len(response), temperature=0.7,
            reward=rng.choice([1.0, -1.0]), teacher_logprobs=None, teacher_kind=None, policy_version=0,
            promoted=False, off_policy=False,
            lineage={"request_event_id": f"req{i}", "response_event_id": f"resp{i}"},
        ))  # fmt: skip
        if i % 3 == 2:
            events.append(make_event(
                "SampleRejected", namespace=NAMESPACE, producer="test", occurred_at_ms=1000 + i,
                id_parts=[i, "rejected"], session_id=f"s{i}", turn_id=f"t{i}", method="binary",
                reason="no_next_state", lineage={"request_event_id": f"q{i}", "response_event_id": f"r{i}"},
            ))  # fmt: skip
    return events


async def write_samples(db: Path, events: list[dict[str, Any]]) -> None:
    async with SqliteEventLog(db) as log:
        topic = topic_name(NAMESPACE, "samples")
        await log.create_topics([TopicSpec(topic)])
        await log.append_batch(topic, [OutgoingRecord(value=encode(e), key=b"k") for e in events])


async def read_topic(db: Path, topic: str) -> list[ConsumedRecord]:
    async with SqliteEventLog(db) as log:
        total = sum((await log.end_offsets(topic)).values())
        out: list[ConsumedRecord] = []
        async with log.consumer(f"check-{topic}", [topic]) as consumer:
            await consumer.seek_to_beginning()
            while len(out) < total:
                out += await consumer.poll(timeout_s=1.0)
        return out


def start_trainer(tmp_path: Path, model_dir: Path, *flags: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "tests.e2e.trainer_crash_main", "--data-dir", str(tmp_path),
        "--model", str(model_dir), "--namespace", NAMESPACE, "--run-id", RUN, "--batch-size", str(BATCH),
        "--lora-r", "4", "--lora-alpha", "8", "--threads", "1", "--poll-timeout-s", "0.2",
        "--idle-exit-s", "4", "--max-staleness", "-1", *flags,
    ]  # fmt: skip
    log_file = (tmp_path / "trainer.log").open("ab")
    return subprocess.Popen(command, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT)


def wait(process: subprocess.Popen[bytes]) -> int:
    try:
        return process.wait(timeout=ROUND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        raise


def newest_version(store: LocalObjectStore) -> int:
    manifest = latest_checkpoint(store, RUN)
    return 0 if manifest is None else manifest.version


def kill_when_version_appears(
    process: subprocess.Popen[bytes], store: LocalObjectStore, version: int, delay_s: float
) -> int:
    """SIGKILL from outside, `delay_s` after the manifest of `version` exists (an arbitrary moment)."""
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while newest_version(store) < version and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)
    process.send_signal(signal.SIGKILL)
    return wait(process)


def test_kill_minus_nine_anywhere_then_exact_resume(tmp_path: Path, base_model_dir: Path) -> None:
    events = sample_events()
    db = tmp_path / "log.db"
    asyncio.run(write_samples(db, events))
    store = LocalObjectStore(tmp_path / "objects")

    rounds = [
        ("mid_upload", 2),  # v1 published; v2 half uploaded
        ("after_manifest", 3),  # v2, v3 manifests; v3's events never appended
        ("after_step", 4),  # v3's events re-emitted; v4 stepped, nothing uploaded
    ]
    for point, version in rounds:
        code = wait(
            start_trainer(tmp_path, base_model_dir, "--fault-after", point, "--fault-version", str(version))
        )
        assert code == -signal.SIGKILL, (
            f"round {point}@{version} exited {code}: see {tmp_path / 'trainer.log'}"
        )
        if point == "mid_upload":
            assert incomplete_checkpoints(store, RUN) == [version]
        assert newest_version(store) == version - (0 if point == "after_manifest" else 1)
    # From outside, at an arbitrary moment soon after v4 is published (v4's events or v5's step).
    code = kill_when_version_appears(
        start_trainer(tmp_path, base_model_dir), store, 4, random.uniform(0.0, 0.5)
    )
    assert code in (-signal.SIGKILL, 0)
    assert wait(start_trainer(tmp_path, base_model_dir)) == 0

    manifests = {
        v: Manifest.from_json(store.get(f"checkpoints/{RUN}/{v:08d}/manifest.json")) for v in range(1, 6)
    }
    assert newest_version(store) == STEPS
    assert incomplete_checkpoints(store, RUN) == []
    assert [manifests[v].parent_version for v in range(1, 6)] == [0, 1, 2, 3, 4]
    trained = [i for v in range(1, 6) for i in manifests[v].metrics["sample_ids"]]
    ready_ids = [e["envelope"]["event_id"] for e in events if e["envelope"]["event_type"] == "SampleReady"]
    assert trained == ready_ids  # every sample once, in topic order: no duplicate, no gap
    assert [o.offset for o in manifests[5].consumed_offsets] == [len(events)]

    steps = [decode(r.value) for r in asyncio.run(read_topic(db, topic_name(NAMESPACE, "train_steps")))]
    published = [decode(r.value) for r in asyncio.run(read_topic(db, topic_name(NAMESPACE, "checkpoints")))]
    assert sorted(e["policy_version"] for e in steps) == [1, 2, 3, 4, 5]
    assert sorted(e["version"] for e in published) == [1, 2, 3, 4, 5]
    for event in published:
        assert event["manifest_sha256"] == manifests[event["version"]].sha256
    for event in steps:
        assert event["sample_ids"] == manifests[event["policy_version"]].metrics["sample_ids"]


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_run_goes_on_from_the_one_before(
    tmp_path: Path, base_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = sample_events()
    db = tmp_path / "log.db"
    asyncio.run(write_samples(db, events))
    store = LocalObjectStore(tmp_path / "objects")
    assert wait(start_trainer(tmp_path, base_model_dir, "--max-steps", "3")) == 0
    assert newest_version(store) == 3
    flip_one_byte(tmp_path / "objects" / "checkpoints" / RUN / "00000003" / "adapter_model.safetensors")

    assert wait(start_trainer(tmp_path, base_model_dir)) == 0
    versions = [1, 2, 4, 5, 6]  # v3 is refused; no version number is used twice
    manifests = {
        v: Manifest.from_json(store.get(f"checkpoints/{RUN}/{v:08d}/manifest.json")) for v in [*versions, 3]
    }
    assert newest_version(store) == 6
    assert [manifests[v].parent_version for v in versions] == [0, 1, 2, 4, 5]
    assert manifests[4].metrics["sample_ids"] == manifests[3].metrics["sample_ids"]  # v3's batch, again
    trained = [i for v in versions for i in manifests[v].metrics["sample_ids"]]
    ready_ids = [e["envelope"]["event_id"] for e in events if e["envelope"]["event_type"] == "SampleReady"]
    assert trained == ready_ids  # along the good chain: every sample once, in topic order

    activations_topic = topic_name(NAMESPACE, "policy_activations")
    activations = asyncio.run(read_topic(db, activations_topic))
    refusals = [decode(r.value) for r in activations]
    assert [(e["server_id"], e["version"]) for e in refusals] == [("trainer", 3)], refusals
    assert "sha256" in refusals[0]["reason"] and refusals[0]["uri"].endswith(f"{RUN}/00000003/")

    # `orl audit` on the refused version's checkpoint shows who refused it and why.
    from orl.cli import main

    published = [decode(r.value) for r in asyncio.run(read_topic(db, topic_name(NAMESPACE, "checkpoints")))]
    v3_id = next(e["envelope"]["event_id"] for e in published if e["version"] == 3)
    where = ["--data-dir", str(tmp_path), "--log-url", f"sqlite:///{db}", "--namespace", NAMESPACE]
    capsys.readouterr()
    assert main(["audit", v3_id, "--json", *where]) == 0
    (step,) = json.loads(capsys.readouterr().out)["train_steps"]
    assert [(r["by"], r["event_id"]) for r in step["served"]["refusals"]] == [
        ("trainer", refusals[0]["envelope"]["event_id"])
    ]

    # A server started on the run when its newest checkpoint is corrupt serves the one before it.
    flip_one_byte(tmp_path / "objects" / "checkpoints" / RUN / "00000006" / "adapter_model.safetensors")
    env = {"ORL_RUN_ID": RUN, "ORL_NAMESPACE": NAMESPACE}
    with serve_process(tmp_path, log_url=f"sqlite:///{db}", extra_env=env) as server:
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        assert httpx.get(f"{server.base_url}/admin/policy", headers=admin).json()["policy_version"] == 5
        deadline = time.monotonic() + 30
        while not (served := [decode(r.value) for r in asyncio.run(read_topic(db, activations_topic))][1:]):
            assert time.monotonic() < deadline, "the server's policy events never reached the log"
            time.sleep(0.5)
    assert [(e["envelope"]["event_type"], e["version"]) for e in served] == [
        ("PolicyRejected", 6),
        ("PolicyActivated", 5),
    ]


def test_a_run_restarted_after_every_step_takes_the_same_steps_as_an_uninterrupted_one(
    tmp_path: Path, base_model_dir: Path
) -> None:
    """Weights and AdamW state equal at every version: the optimizer's moments are resumed too."""
    import torch
    from safetensors.torch import load_file

    events = sample_events()
    runs = {name: tmp_path / name for name in ("straight", "restarted")}
    for folder in runs.values():
        folder.mkdir()
        asyncio.run(write_samples(folder / "log.db", events))
    assert wait(start_trainer(runs["straight"], base_model_dir, "--max-steps", str(STEPS))) == 0
    for _ in range(STEPS):
        assert wait(start_trainer(runs["restarted"], base_model_dir, "--max-steps", "1")) == 0

    for version in range(1, STEPS + 1):
        folders = {
            name: run / "objects" / "checkpoints" / RUN / f"{version:08d}" for name, run in runs.items()
        }
        weights = {name: load_file(folder / "adapter_model.safetensors") for name, folder in folders.items()}
        assert weights["straight"].keys() == weights["restarted"].keys()
        for key, tensor in weights["straight"].items():
            assert torch.equal(tensor, weights["restarted"][key]), (version, key)
        states = {
            name: torch.load(folder / "trainer_state" / "optimizer.pt", weights_only=True)
            for name, folder in folders.items()
        }
        straight, restarted = states["straight"]["state"], states["restarted"]["state"]
        assert straight.keys() == restarted.keys() and len(straight) > 0
        for index, moments in straight.items():
            for name, value in moments.items():
                assert torch.equal(value, restarted[index][name]), (version, index, name)
