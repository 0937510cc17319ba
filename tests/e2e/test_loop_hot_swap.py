"""The loop closed on the real model: chat -> samples -> one training step -> checkpoint -> hot swap.

A client keeps calling the server during the swap and must see no failed request; responses after
the swap carry the new policy version, a fixed prompt's logprobs change, and a tampered checkpoint
is refused while the old policy keeps serving.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest
from orl.connectors.event_log.base import OutgoingRecord
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.pipeline.runtime.settings import PipelineSettings
from orl.schemas.codec import encode
from orl.schemas.events import make_event
from orl.trainer.main import train
from orl.trainer.settings import TrainSettings

from tests.e2e.test_turns_to_samples import chat, run_stages
from tests.fixtures.model import test_cache_dir
from tests.integration.log_reading import read_events
from tests.integration.serve_process import ADMIN_KEY, API_KEY, INTERNAL_KEY, serve_process

pytestmark = [pytest.mark.model, pytest.mark.slow]
RUN = "swap-run"
PROBE = [{"role": "user", "content": "Name a colour."}]
PROBE_IDS = [504, 2]  # any fixed response tokens: only their logprobs matter


class ClientLoop(threading.Thread):
    """Calls the server back to back; records every status code and the version that answered."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.base_url, self.stop, self.results = base_url, threading.Event(), []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                response = httpx.post(
                    f"{self.base_url}/v1/chat/completions", timeout=60,
                    headers={"Authorization": f"Bearer {API_KEY}", "X-Turn-Type": "side"},
                    json={"model": "orl-policy", "messages": PROBE, "max_tokens": 3},
                )  # fmt: skip
                version = response.json().get("system_fingerprint") if response.status_code == 200 else None
                self.results.append((response.status_code, version))
            except httpx.HTTPError as error:
                self.results.append((str(error), None))


def score(base_url: str) -> list[float]:
    response = httpx.post(f"{base_url}/v1/orl/score", headers={"Authorization": f"Bearer {INTERNAL_KEY}"},
                          json={"messages": PROBE, "response_token_ids": PROBE_IDS}, timeout=60)  # fmt: skip
    response.raise_for_status()
    return list(response.json()["logprobs"])


def policy(base_url: str) -> dict:
    return httpx.get(f"{base_url}/admin/policy", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).json()


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_train_publish_swap_without_a_failed_request(tmp_path: Path, base_model_dir: Path) -> None:
    with serve_process(tmp_path, extra_env={"ORL_RUN_ID": RUN}) as server:
        for i in range(2):  # two corrected answers: two binary samples with reward -1
            question = [{"role": "user", "content": f"Explain photosynthesis, part {i}."}]
            answer = chat(server.base_url, question, f"s{i}")
            chat(server.base_url, [*question, {"role": "assistant", "content": answer},
                                   {"role": "user", "content": "Too long. Please redo it in under 40 words."}],
                 f"s{i}", max_tokens=1, headers={"X-Session-Done": "true"})  # fmt: skip
        time.sleep(1.0)  # let the spool drain
        asyncio.run(run_stages(PipelineSettings(data_dir=tmp_path, log_url=server.log_url, method="binary",
                                                judge="user_reply", api_key=INTERNAL_KEY,
                                                server_url=f"{server.base_url}/v1")))  # fmt: skip
        before = score(server.base_url)
        clients = ClientLoop(server.base_url)
        clients.start()
        train(TrainSettings(data_dir=tmp_path, log_url=server.log_url, store_url=f"file://{tmp_path / 'objects'}",
                            model_cache_dir=test_cache_dir(), run_id=RUN, batch_size=2, max_steps=1, threads=1))  # fmt: skip
        wait_for(lambda: policy(server.base_url)["policy_version"] == 1, 60, "the server to swap to v1")
        time.sleep(2.0)  # a few more requests on the new policy
        clients.stop.set()
        clients.join(timeout=60)
        after = score(server.base_url)

        statuses = {status for status, _ in clients.results}
        assert statuses == {200}, clients.results
        versions = [v for _, v in clients.results]
        assert versions[0] == "v0" and versions[-1] == "v1"
        assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 1e-4

        # a copied-and-tampered checkpoint (wrong version in its manifest, a changed weights file) is refused
        # and v1 keeps serving
        store = LocalObjectStore(tmp_path / "objects")
        prefix = f"checkpoints/{RUN}/"
        shutil.copytree(
            tmp_path / "objects" / prefix / "00000001", tmp_path / "objects" / prefix / "00000002"
        )
        weights = next(k for k in store.list(f"{prefix}00000002/") if k.endswith(".safetensors"))
        store.put(weights, store.get(weights)[:-8] + b"tampered")
        asyncio.run(_publish_checkpoint_event(server.log_url, store.uri(f"{prefix}00000002/manifest.json")))
        wait_for(lambda: _rejections(server.log_url), 30, "PolicyRejected")
        assert policy(server.base_url)["policy_version"] == 1
        assert _rejections(server.log_url)[0]["version"] == 2
        check_admin_endpoints(server.base_url)

    responses = asyncio.run(read_events(server.log_url, "live.responses"))
    assert {r["policy_version"] for r in responses} == {0, 1}
    activated = asyncio.run(read_events(server.log_url, "live.policy_activations"))
    assert [a["version"] for a in activated if a["envelope"]["event_type"] == "PolicyActivated"] == [1]


def check_admin_endpoints(base_url: str) -> None:
    """Pin, unpin and roll back through the admin surface, which only the admin key opens."""

    def admin(path: str, body: dict | None = None, key: str = ADMIN_KEY) -> httpx.Response:
        return httpx.post(f"{base_url}/admin/{path}", json=body or {}, headers={"Authorization": f"Bearer {key}"},
                          timeout=60)  # fmt: skip

    assert admin("pin", {"version": 1}, key=API_KEY).status_code == 401
    assert admin("rollback").status_code == 400  # only v1 was ever served: nothing earlier to go back to
    pinned = admin("pin", {"version": 1})
    assert pinned.status_code == 200 and pinned.json()["pinned"] == 1
    assert admin("pin", {"version": 7}).json()["error"]["code"] == "checkpoint_unavailable"
    assert admin("pin", {"version": "one"}).status_code == 400
    assert admin("unpin").json()["pinned"] is None
    assert policy(base_url)["policy_version"] == 1


async def _publish_checkpoint_event(log_url: str, uri: str) -> None:
    event = make_event(
        "CheckpointPublished", namespace="live", producer="test", occurred_at_ms=int(time.time() * 1000),
        id_parts=[RUN, 2], run_id=RUN, version=2, parent_version=1, kind="lora", uri=uri,
        manifest_key=f"checkpoints/{RUN}/00000002/manifest.json", manifest_sha256="0" * 64,
        base_model="smollm2-135m", consumed_offsets=[], sample_id_digest="",
    )  # fmt: skip
    async with open_event_log(log_url) as log:
        await log.append("live.checkpoints", OutgoingRecord(value=encode(event), key=RUN.encode()))


def _rejections(log_url: str) -> list[dict]:
    events = asyncio.run(read_events(log_url, "live.policy_activations"))
    return [e for e in events if e["envelope"]["event_type"] == "PolicyRejected"]
