"""--tenant-adapters on the real app: a named tenant's turns are answered by its own run once that run
has a version, the others' by the main policy, and each ResponseGenerated names the run that answered.

Runs `orl.serving.app.build_app` over the echo backend (benchmarks/echo_backend.py, which holds tenant
runs' versions as a real backend does) with the real SmolLM2 tokenizer, a real recorder and spool file.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from orl.connectors.metrics import Metrics
from orl.schemas.codec import decode
from orl.schemas.errors import ConfigError
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.main import check_settings, own_tenant_runs
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool

from benchmarks.echo_backend import EchoBackend

PLAIN_KEY, ALICE_KEY, BOB_KEY = "plain-key", "alice-key", "bob-key"
SETTINGS = ServeSettings(
    api_keys=(PLAIN_KEY,),
    tenant_keys=(f"alice={ALICE_KEY}", f"bob={BOB_KEY}"),
    tenant_adapters=True,
    admin_key="admin",
    run_id="home",
)


def test_each_named_tenant_key_is_answered_by_its_own_run_and_the_setting_needs_named_tenants() -> None:
    runs = own_tenant_runs(SETTINGS)
    assert sorted(runs.values()) == ["home.alice", "home.bob"]
    assert ALICE_KEY not in str(runs) and BOB_KEY not in str(runs)  # keyed by key id, never the key
    assert own_tenant_runs(ServeSettings(api_keys=(PLAIN_KEY,), tenant_keys=SETTINGS.tenant_keys)) == {}
    with pytest.raises(ConfigError, match="--tenant-keys"):
        check_settings(ServeSettings(api_keys=(PLAIN_KEY,), admin_key="admin", tenant_adapters=True))


async def test_a_tenant_is_answered_by_its_run_once_it_has_a_version(base_model_dir: Path, tmp_path: Path):
    spool = EventSpool(tmp_path / "spool.db")
    backend = EchoBackend()
    state = ServerState(
        settings=SETTINGS,
        backend=backend,
        template=ChatTemplate.from_dir(base_model_dir),
        recorder=EventRecorder(spool, "live", clock_ms=lambda: 1_700_000_000_000),
        metrics=Metrics(),
        tenant_runs=own_tenant_runs(SETTINGS),
    )
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(state)), base_url="http://orl")

    async def chat(key: str) -> str:
        body = {"model": "orl-policy", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        reply = await client.post(
            "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
        )
        assert reply.status_code == 200, reply.text
        return str(reply.json()["system_fingerprint"])

    def answered_by() -> list[tuple[str | None, int]]:
        responses = [decode(e.value) for e in spool.oldest(1000) if e.topic.endswith(".responses")]
        return [(r["policy_run"], r["policy_version"]) for r in responses]

    await backend.load_checkpoint(tmp_path, 2, "lora")  # the shared run at v2
    await chat(ALICE_KEY)  # alice's run has no version yet: the shared policy answers
    await backend.load_checkpoint(tmp_path, 1, "lora", "home.alice")
    assert await chat(ALICE_KEY) == "v1"
    await chat(BOB_KEY)
    await chat(PLAIN_KEY)
    assert answered_by() == [("home", 2), ("home.alice", 1), ("home", 2), ("home", 2)]
    await client.aclose()
    spool.close()
