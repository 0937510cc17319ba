"""`orl gate` on the real model, log and object store: a harmless checkpoint is promoted, a broken one held.

v1 is the base model's own weights published as a full checkpoint: the gate's answers (same prompts,
same seeds) match the base model's, so it must be promoted. v2 has every weight matrix drowned in
noise: it babbles, the demo scenario's simulated user asks for a redo of every answer, and the
rule judge `user_reply` rejects it, so it must be held. v3, the trainer's restore of v1's weights
after that hold, is promoted without an evaluation, and v4 is then compared with v3 (whose answers
are v1's) and with the base model. The gate runs as `orl gate` runs
(`run_gate_loop`) and its PolicyGated events are read back from the log.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.connectors.checkpoint_store import latest_checkpoint, publish_checkpoint
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.gate.runner import run_gate_loop
from orl.gate.settings import GateSettings
from orl.pipeline.history.audit import audit_id
from orl.pipeline.history.audit_index import AuditIndex, index_path
from orl.schemas.codec import decode
from orl.trainer.resume import append_step_events
from safetensors.torch import load_file, save_file

from orl.gate_scenarios import gate_source

pytestmark = [pytest.mark.model, pytest.mark.slow]
NAMESPACE, RUN = "gate", "live"


def full_checkpoint(base: Path, out: Path, noise: float) -> Path:
    """A copy of the base model folder whose weight matrices get Gaussian noise of this scale."""
    shutil.copytree(base, out)
    weights = load_file(str(out / "model.safetensors"))
    generator = torch.Generator().manual_seed(0)
    for name, tensor in weights.items():
        if noise and tensor.dim() == 2:
            weights[name] = tensor + noise * torch.randn(tensor.shape, generator=generator)
    save_file(weights, str(out / "model.safetensors"))
    return out


async def publish(
    settings: GateSettings, folder: Path, version: int, metrics: dict[str, Any] | None = None
) -> None:
    store = LocalObjectStore(settings.data_dir / "objects")
    publish_checkpoint(
        store, RUN, version, folder, parent_version=version - 1, kind="full", base_model="smollm2",
        consumed_offsets=[], sample_ids=[], metrics=metrics or {},
    )  # fmt: skip
    manifest = latest_checkpoint(store, RUN)
    assert manifest is not None
    async with SqliteEventLog(settings.data_dir / "log.db") as log:
        await create_catalog_topics(log, NAMESPACE, 1)
        await append_step_events(log, manifest, NAMESPACE, store.uri(manifest.manifest_key))


async def gated(settings: GateSettings, count: int, timeout_s: float = 600) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        async with SqliteEventLog(settings.data_dir / "log.db") as log:
            events = [decode(r.value) for r in await read_to_end(log, f"{NAMESPACE}.checkpoints")]
        decisions = [e for e in events if e["envelope"]["event_type"] == "PolicyGated"]
        if len(decisions) >= count:
            return decisions
        assert time.monotonic() < deadline, f"the gate decided {len(decisions)} of {count} versions"
        await asyncio.sleep(1.0)


def test_the_gate_promotes_a_harmless_checkpoint_and_holds_a_broken_one(
    tmp_path: Path, base_model_dir: Path
) -> None:
    settings = GateSettings(
        data_dir=tmp_path, namespace=NAMESPACE, model=str(base_model_dir), judge="user_reply",
        gate_scenario="student", gate_prompts=4, gate_samples=2, gate_max_tokens=48, threads=2,
    )  # fmt: skip
    same = full_checkpoint(base_model_dir, tmp_path / "same", noise=0.0)
    broken = full_checkpoint(base_model_dir, tmp_path / "broken", noise=0.5)

    async def scenario() -> list[dict[str, Any]]:
        stop = asyncio.Event()
        await publish(settings, same, 1)
        gate = asyncio.create_task(run_gate_loop(settings, stop, gate_source(settings)))
        try:
            await gated(settings, 1)
            await publish(settings, broken, 2)
            await gated(settings, 2)
            # the trainer's answer to the hold: v1's weights again, as v3 (trainer/gate_holds.py)
            await publish(settings, same, 3, metrics={"held_by_gate": 2, "restored": 1})
            await gated(settings, 3, timeout_s=60)
            await publish(settings, same, 4)  # trained on from the restore (here: unchanged)
            return await gated(settings, 4)
        finally:
            stop.set()
            await asyncio.wait_for(gate, 120)

    first, second, restore, after = asyncio.run(scenario())
    assert asyncio.run(gate_seen_in_the_audit(settings, version=2)) == [("held", 1, second["reason"])]
    assert (first["version"], first["baseline_version"], first["decision"]) == (1, 0, "promoted"), first[
        "reason"
    ]
    by_version = {v: [a["text"] for a in first["answers"] if a["version"] == v] for v in (0, 1)}
    assert by_version[0] == by_version[1] and len(by_version[0]) == 8  # the same weights, the same seeds
    assert (second["version"], second["baseline_version"], second["decision"]) == (2, 1, "held"), second[
        "reason"
    ]
    assert second["candidate_relevance"] < second["baseline_relevance"]
    assert second["candidate_approval"] < second["baseline_approval"] - 0.5, second["reason"]
    assert "below the baseline" in second["reason"]
    answer = next(a for a in second["answers"] if a["version"] == 2 and a["reward"] == -1)
    assert answer["next_state"] and '"score": -1' in answer["votes"][0]  # the user's redo, the judge's words
    assert first["prompt_source"] == "scenario:student" and first["judge_id"] == "prm:user_reply"
    # a restore of the promoted weights is promoted without an evaluation
    assert (restore["version"], restore["baseline_version"], restore["decision"]) == (3, 1, "promoted")
    assert restore["answers"] == [] and "republishes the promoted v1's weights" in restore["reason"]
    # v4 against the restore v3 and the base model: v3's answers are v1's (kept), under v3's number
    assert (after["version"], after["baseline_version"], after["decision"]) == (4, 3, "promoted"), after[
        "reason"
    ]
    texts = {v: [a["text"] for a in after["answers"] if a["version"] == v] for v in (0, 3, 4)}
    assert texts[3] == by_version[1] and texts[0] == by_version[0] and texts[4] == by_version[0]
    assert "Against the base model" in after["reason"]


async def gate_seen_in_the_audit(settings: GateSettings, version: int) -> list[tuple[str, int, str]]:
    """`orl audit <the version's checkpoint id>`: the gate's decisions on it, as the audit shows them."""
    async with SqliteEventLog(settings.data_dir / "log.db") as log:
        events = [decode(r.value) for r in await read_to_end(log, f"{NAMESPACE}.checkpoints")]
        (published,) = [
            e
            for e in events
            if e["envelope"]["event_type"] == "CheckpointPublished" and e["version"] == version
        ]
        index = AuditIndex(index_path(settings.data_dir, NAMESPACE), NAMESPACE)
        try:
            chain = await audit_id(log, index, published["envelope"]["event_id"])
        finally:
            index.close()
    (step,) = chain["train_steps"]
    return [(g["decision"], g["baseline_version"], g["reason"]) for g in step["served"]["gate"]]
