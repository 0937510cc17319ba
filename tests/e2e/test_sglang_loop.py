"""The GPU deployment's chain with only SGLang faked: chat -> pipeline -> `orl train` -> SGLang update.

A real `orl serve --backend sglang` talks to a loopback server that follows SGLang's HTTP API
(tests/fixtures/fake_sglang.py). Two corrected turns go through it (the recorded ids and logprobs
are SGLang's), the real pipeline stages turn them into samples on the SQLite log, a real `orl train`
process (torch, LoRA, the real SmolLM2) steps once and publishes checkpoint v1. The server's
follower verifies it and must drive exactly SGLang's documented update call: `/load_lora_adapter`
with a name unique to the version and the path of the verified folder, which SGLang reads from its
own disk. Requests keep arriving during the swap and are all answered; later ones carry the adapter
name and version 1; PolicyActivated v1 is on the log. A published checkpoint whose weights file was
changed after its manifest is refused (PolicyRejected) and never reaches SGLang.

Full weights take the other documented call, `/update_weights_from_disk` with `weight_version` and
`abort_all_requests` false. That test publishes a small stand-in full checkpoint through the real
checkpoint protocol rather than train all 135M weights in fp32 (a 540 MB save, upload and verify):
the fake checks the folder's files, not the tensors.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from orl.connectors.checkpoint_store import TRAINER_STATE_DIR, Manifest, publish_checkpoint
from orl.connectors.event_log.base import OutgoingRecord
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.pipeline.runtime.settings import PipelineSettings
from orl.schemas.codec import encode
from orl.schemas.events import make_event

from tests.e2e.test_loop_hot_swap import ClientLoop, policy, wait_for
from tests.e2e.test_turns_to_samples import chat, run_stages
from tests.fixtures.fake_sglang import Call, FakeSGLang, folder_digest, write_checkpoint_folder
from tests.fixtures.model import test_cache_dir
from tests.integration.log_reading import read_events
from tests.integration.serve_process import API_KEY, INTERNAL_KEY, serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]
RUN = "sglang-run"
SGLANG_KEY = "sglang-only-key"  # not a client key: orl must send SGLang its own


def sglang_serve_env(fake: FakeSGLang) -> dict[str, str]:
    """`orl serve --backend sglang --sglang-url <fake>` (flags as environment variables)."""
    fake.api_key = SGLANG_KEY
    fake.stream_delay_s = 0.1  # per token: a client request (3 tokens) runs ~0.3 s
    fake.update_delay_s = 1.0  # the load overlaps running requests
    return {
        "ORL_BACKEND": "sglang",
        "ORL_SGLANG_URL": fake.url,
        "ORL_SGLANG_API_KEY": SGLANG_KEY,
        "ORL_RUN_ID": RUN,
    }


def test_a_trained_lora_checkpoint_reaches_sglang_through_load_lora_adapter(
    tmp_path: Path, base_model_dir: Path, fake_sglang: FakeSGLang
) -> None:
    with serve_process(tmp_path, extra_env=sglang_serve_env(fake_sglang)) as server:
        make_samples(server.base_url, server.log_url, tmp_path)
        assert all("lora_path" not in body for body in fake_sglang.generate_requests)
        clients = ClientLoop(server.base_url)
        clients.start()
        run_orl_train(tmp_path, server.log_url)
        wait_for(lambda: policy(server.base_url)["policy_version"] == 1, 30, "the server to swap to v1")
        time.sleep(1.0)  # a few requests on the new adapter
        clients.stop.set()
        clients.join(timeout=30)

        load = check_the_update_call(fake_sglang, tmp_path)
        check_requests_around_the_swap(fake_sglang, load, clients.results, adapter=load.body["lora_name"])
        check_a_tampered_checkpoint_never_reaches_sglang(
            server.base_url, server.log_url, tmp_path, fake_sglang
        )
        assert fake_sglang.unexpected == []  # orl called no other SGLang endpoint

    activations = asyncio.run(read_events(server.log_url, "live.policy_activations"))
    activated = [a for a in activations if a["envelope"]["event_type"] == "PolicyActivated"]
    assert [(a["version"], a["run_id"], a["server_id"]) for a in activated] == [(1, RUN, "serve-0")]
    responses = asyncio.run(read_events(server.log_url, "live.responses"))
    assert {r["policy_version"] for r in responses} == {0, 1}


def make_samples(base_url: str, log_url: str, data_dir: Path) -> None:
    """Two corrected turns served through SGLang, judged by the users' replies: two samples (reward -1)."""
    for i in range(2):
        question = [{"role": "user", "content": f"Explain photosynthesis, part {i}."}]
        answer = chat(base_url, question, f"s{i}", max_tokens=8)
        chat(base_url, [*question, {"role": "assistant", "content": answer},
                        {"role": "user", "content": "Too long. Please redo it in under 40 words."}],
             f"s{i}", max_tokens=1, headers={"X-Session-Done": "true"})  # fmt: skip
    wait_for(lambda: len(asyncio.run(read_events(log_url, "live.sessions"))) >= 2, 15, "the spool to drain")
    settings = PipelineSettings(data_dir=data_dir, log_url=log_url, method="binary", judge="user_reply",
                                api_key=INTERNAL_KEY, server_url=f"{base_url}/v1")  # fmt: skip
    asyncio.run(run_stages(settings))
    samples = asyncio.run(read_events(log_url, "live.samples"))
    assert [s["envelope"]["event_type"] for s in samples].count("SampleReady") == 2, samples


def run_orl_train(data_dir: Path, log_url: str) -> None:
    """`orl train` as its own process: one LoRA step over the two samples, then it publishes v1 and exits."""
    env = {
        **os.environ,
        "ORL_DATA_DIR": str(data_dir),
        "ORL_LOG_URL": log_url,
        "ORL_STORE_URL": f"file://{data_dir / 'objects'}",
        "ORL_MODEL_CACHE": str(test_cache_dir()),
        "ORL_RUN_ID": RUN,
        "ORL_TRAIN_KIND": "lora",
        "ORL_TRAIN_BATCH_SIZE": "2",
        "ORL_TRAIN_MAX_STEPS": "1",
        "ORL_TRAIN_LORA_R": "4",
        "ORL_TRAIN_LORA_ALPHA": "8",
        "ORL_TRAIN_IDLE_EXIT_S": "60",
        "ORL_THREADS": "1",  # on the shared 2-core VM, 2 threads made the step take 30 s instead of 2 s
    }
    done = subprocess.run(
        [sys.executable, "-m", "orl.cli", "train"], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def published_manifest(data_dir: Path, version: int) -> Manifest:
    store = LocalObjectStore(data_dir / "objects")
    return Manifest.from_json(store.get(f"checkpoints/{RUN}/{version:08d}/manifest.json"))


def served_files(manifest: Manifest) -> dict[str, str]:
    """The files a server downloads and verifies (path -> sha256): the manifest's, but the trainer's state."""
    files = {e.path: e.sha256 for e in manifest.files if not e.path.startswith(f"{TRAINER_STATE_DIR}/")}
    return files | {"manifest.json": manifest.sha256}


def check_the_update_call(fake: FakeSGLang, data_dir: Path) -> Call:
    """Exactly one update call: /load_lora_adapter, a fresh name for v1, the verified folder's path."""
    assert [name for name, _ in fake.calls] == ["load_lora_adapter"], fake.calls
    load = next(call for call in fake.history if call.endpoint == "load_lora_adapter")
    folder = data_dir / "served-checkpoints" / RUN / "00000001"
    assert load.status == 200
    assert set(load.body) == {"lora_name", "lora_path"}
    assert re.fullmatch(r"v1-[0-9a-f]+", load.body["lora_name"]), load.body
    assert load.body["lora_path"] == str(folder)
    manifest = published_manifest(data_dir, 1)
    assert manifest.kind == "lora"
    expected = served_files(manifest)
    assert {"adapter_model.safetensors", "adapter_config.json"} <= set(expected)
    assert load.folder == expected  # what SGLang read at call time: the manifest's files, verified
    assert folder_digest(folder) == expected  # and still there for SGLang to reload from
    return load


def check_requests_around_the_swap(
    fake: FakeSGLang, update: Call, results: list[Any], adapter: str | None
) -> None:
    """Requests during the update are answered; before it they use the base, after it the new policy."""
    assert {status for status, _ in results} == {200}, results  # no 5xx, nothing refused
    versions = [version for _, version in results]
    assert versions[0] == "v0" and versions[-1] == "v1" and versions == sorted(versions), versions
    generates = sorted((c for c in fake.history if c.endpoint == "generate"), key=lambda c: c.started_s)
    adapters = [call.body.get("lora_path") for call in generates]
    if adapter is None:
        assert set(adapters) == {None}
    else:
        assert set(adapters) == {None, adapter}
        switch = adapters.index(adapter)
        assert adapters[switch:] == [adapter] * (len(adapters) - switch)  # once switched, never back
        assert all(c.body.get("lora_path") is None for c in generates if c.started_s < update.started_s)
    during = [c for c in generates if c.started_s < update.ended_s and c.ended_s > update.started_s]
    assert during and all(c.status == 200 for c in during), "no request was in flight during the update"


def check_a_tampered_checkpoint_never_reaches_sglang(
    base_url: str, log_url: str, data_dir: Path, fake: FakeSGLang
) -> None:
    """v2 is published properly, then its weights file changes: the follower refuses it before SGLang."""
    store = LocalObjectStore(data_dir / "objects")
    v1_folder = data_dir / "served-checkpoints" / RUN / "00000001"
    staging = data_dir / "v2-staging"
    staging.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (staging / name).write_bytes((v1_folder / name).read_bytes())
    manifest = publish_checkpoint(
        store, RUN, 2, staging, parent_version=1, kind="lora", base_model="smollm2-135m",
        consumed_offsets=[], sample_ids=[], metrics={},
    )  # fmt: skip
    weights = f"checkpoints/{RUN}/00000002/adapter_model.safetensors"
    store.put(weights, store.get(weights)[:-8] + b"tampered")
    calls_before = list(fake.calls)
    asyncio.run(publish_event(log_url, manifest, store.uri(manifest.manifest_key)))

    def rejections() -> list[dict[str, Any]]:
        events = asyncio.run(read_events(log_url, "live.policy_activations"))
        return [e for e in events if e["envelope"]["event_type"] == "PolicyRejected"]

    wait_for(lambda: bool(rejections()), 30, "PolicyRejected for v2")
    rejected = rejections()
    assert [r["version"] for r in rejected] == [2]
    assert "sha256 mismatch" in rejected[0]["reason"] and "adapter_model.safetensors" in rejected[0]["reason"]
    assert fake.calls == calls_before  # SGLang never heard of v2
    assert policy(base_url)["policy_version"] == 1
    response = httpx.post(
        f"{base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}", "X-Turn-Type": "side"},
        json={"model": "orl-policy", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, timeout=60,
    )  # fmt: skip
    assert response.status_code == 200 and response.json()["system_fingerprint"] == "v1"
    assert fake.generate_requests[-1]["lora_path"] == calls_before[0][1]["lora_name"]


def test_a_full_checkpoint_reaches_sglang_through_update_weights_from_disk(
    tmp_path: Path, base_model_dir: Path, fake_sglang: FakeSGLang
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    with serve_process(tmp_path, extra_env=sglang_serve_env(fake_sglang)) as server:
        clients = ClientLoop(server.base_url)
        clients.start()
        wait_for(lambda: len(clients.results) >= 2, 30, "requests on the base model")
        staging = write_checkpoint_folder(tmp_path / "v1-staging", "full")
        manifest = publish_checkpoint(
            store, RUN, 1, staging, parent_version=0, kind="full", base_model="smollm2-135m",
            consumed_offsets=[], sample_ids=[], metrics={},
        )  # fmt: skip
        asyncio.run(publish_event(server.log_url, manifest, store.uri(manifest.manifest_key)))
        wait_for(lambda: policy(server.base_url)["policy_version"] == 1, 30, "the server to swap to v1")
        time.sleep(1.0)
        clients.stop.set()
        clients.join(timeout=30)

        folder = tmp_path / "served-checkpoints" / RUN / "00000001"
        body = {"model_path": str(folder), "weight_version": "1", "abort_all_requests": False}
        assert fake_sglang.calls == [("update_weights_from_disk", body)]
        update = next(call for call in fake_sglang.history if call.endpoint == "update_weights_from_disk")
        expected = served_files(manifest)
        assert update.status == 200 and update.folder == expected == folder_digest(folder)
        # SGLang held the requests that arrived during the load (its writer lock) and answered them after
        check_requests_around_the_swap(fake_sglang, update, clients.results, adapter=None)
        assert fake_sglang.unexpected == []

    activations = asyncio.run(read_events(server.log_url, "live.policy_activations"))
    assert [a["version"] for a in activations if a["envelope"]["event_type"] == "PolicyActivated"] == [1]
    responses = asyncio.run(read_events(server.log_url, "live.responses"))
    assert {r["policy_version"] for r in responses} == {0, 1}


async def publish_event(log_url: str, manifest: Manifest, uri: str) -> None:
    """The CheckpointPublished the trainer would append for `manifest` (the real manifest hash)."""
    event = make_event(
        "CheckpointPublished", namespace="live", producer="test", occurred_at_ms=int(time.time() * 1000),
        id_parts=[RUN, manifest.version], run_id=RUN, version=manifest.version,
        parent_version=manifest.parent_version, kind=manifest.kind, uri=uri, manifest_key=manifest.manifest_key,
        manifest_sha256=manifest.sha256, base_model=manifest.base_model, consumed_offsets=[],
        sample_id_digest=manifest.sample_id_digest,
    )  # fmt: skip
    async with open_event_log(log_url) as log:
        await log.append("live.checkpoints", OutgoingRecord(value=encode(event), key=RUN.encode()))
