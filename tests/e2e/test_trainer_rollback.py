"""Automatic rollback in the real trainer: a version whose judged turns go bad is replaced by its parent's weights.

`orl train` (the real entry point, LoRA on the real SmolLM2) with `--rollback-window 4` reads a
samples topic in which the base model's turns were approved and v1's were all rejected. It steps on
the first batch (v1), then sees v1's four judged turns against v0's and republishes the base weights
as v2 (a zero LoRA update), appends PolicyRolledBack with the figures, and trains on from v2 (v3).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from orl.connectors.checkpoint_store import Manifest
from orl.connectors.event_log.base import OutgoingRecord
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.schemas.codec import decode, encode
from orl.schemas.topics import topic_name
from safetensors.torch import load_file

from tests.e2e.test_trainer_resume import (
    NAMESPACE,
    RUN,
    read_topic,
    sample_events,
    start_trainer,
    wait,
    write_samples,
)
from tests.unit.event_examples import example_event

pytestmark = [pytest.mark.model, pytest.mark.slow]


def judged_samples() -> list[dict[str, Any]]:
    """Four SampleReady answered by v0 and rewarded +1, then four answered by v1 and rewarded -1."""
    ready = [e for e in sample_events() if e["envelope"]["event_type"] == "SampleReady"][:8]
    for index, event in enumerate(ready):
        event["policy_version"] = 0 if index < 4 else 1
        event["reward"] = 1.0 if index < 4 else -1.0
    return ready


def test_a_version_judged_worse_than_its_parent_is_rolled_back_to_the_parents_weights(
    tmp_path: Path, base_model_dir: Path
) -> None:
    events = judged_samples()
    db = tmp_path / "log.db"
    asyncio.run(write_samples(db, events))
    store = LocalObjectStore(tmp_path / "objects")
    flags = ("--batch-size", "4", "--rollback-window", "4", "--rollback-margin", "0.25")
    assert wait(start_trainer(tmp_path, base_model_dir, *flags)) == 0

    manifests = {
        v: Manifest.from_json(store.get(f"checkpoints/{RUN}/{v:08d}/manifest.json")) for v in (1, 2, 3)
    }
    assert not store.exists(f"checkpoints/{RUN}/00000004/manifest.json")
    assert [manifests[v].parent_version for v in (1, 2, 3)] == [0, 0, 2]
    assert manifests[2].metrics["rollback_of"] == 1 and manifests[2].metrics["restored"] == 0
    assert manifests[2].sample_count == 0  # the restore trains nothing
    ids = [e["envelope"]["event_id"] for e in events]
    assert manifests[1].metrics["sample_ids"] == ids[:4] and manifests[3].metrics["sample_ids"] == ids[4:]
    restored = load_file(
        tmp_path / "objects" / "checkpoints" / RUN / "00000002" / "adapter_model.safetensors"
    )
    lora_b = [tensor for name, tensor in restored.items() if "lora_B" in name]
    assert lora_b and all(bool((t == 0).all()) for t in lora_b)  # LoRA's B at zero: the base model

    checkpoints = [decode(r.value) for r in asyncio.run(read_topic(db, topic_name(NAMESPACE, "checkpoints")))]
    (rolled,) = [e for e in checkpoints if e["envelope"]["event_type"] == "PolicyRolledBack"]
    assert (rolled["from_version"], rolled["to_version"], rolled["new_version"]) == (1, 0, 2)
    assert (rolled["from_approval"], rolled["to_approval"], rolled["window"]) == (0.0, 1.0, 4)
    published = [e["version"] for e in checkpoints if e["envelope"]["event_type"] == "CheckpointPublished"]
    assert published == [1, 2, 3]

    # `orl report` says so: v1 rolled back to v0 as v2, with the figures.
    from orl.cli import main

    report_dir = tmp_path / "report"
    where = ["--data-dir", str(tmp_path), "--log-url", f"sqlite:///{db}", "--namespace", NAMESPACE]
    assert main(["report", *where, "--out-dir", str(report_dir)]) == 0
    table = (report_dir / "report.md").read_text()
    assert "- v1 rolled back to v0 as v2 (approval 0.00 vs 1.00 over 4 turns)" in table


async def write_gate_decision(db: Path, version: int, decision: str) -> None:
    """A PolicyGated on the checkpoints topic, as `orl gate` appends it."""
    event = example_event("PolicyGated")
    event.update(
        run_id=RUN, version=version, baseline_version=0, decision=decision, reason="approval 0.00 vs 0.50"
    )
    event["envelope"].update(event_id=f"gated-{version}", namespace=NAMESPACE)
    async with SqliteEventLog(db) as log:
        await create_catalog_topics(log, NAMESPACE, 1)
        await log.append(
            topic_name(NAMESPACE, "checkpoints"), OutgoingRecord(value=encode(event), key=RUN.encode())
        )


def test_a_version_the_gate_held_is_not_trained_on_the_promoted_weights_are(
    tmp_path: Path, base_model_dir: Path
) -> None:
    """The gate held v1 (decided before the trainer reached it): the trainer republishes the promoted
    version's weights (the base model's) as v2 and trains the next batch from there as v3."""
    db = tmp_path / "log.db"
    asyncio.run(write_samples(db, judged_samples()))
    asyncio.run(write_gate_decision(db, 1, "held"))
    assert wait(start_trainer(tmp_path, base_model_dir, "--batch-size", "4")) == 0

    store = LocalObjectStore(tmp_path / "objects")
    manifests = {
        v: Manifest.from_json(store.get(f"checkpoints/{RUN}/{v:08d}/manifest.json")) for v in (1, 2, 3)
    }
    assert not store.exists(f"checkpoints/{RUN}/00000004/manifest.json")
    assert [manifests[v].parent_version for v in (1, 2, 3)] == [0, 0, 2]
    assert manifests[2].metrics["held_by_gate"] == 1 and manifests[2].metrics["restored"] == 0
    assert manifests[2].sample_count == 0 and manifests[3].sample_count == 4
    restored = load_file(
        tmp_path / "objects" / "checkpoints" / RUN / "00000002" / "adapter_model.safetensors"
    )
    assert all(bool((t == 0).all()) for name, t in restored.items() if "lora_B" in name)
    assert "the promotion gate held v1 (approval 0.00 vs 0.50)" in (tmp_path / "trainer.log").read_text()


def test_behind_the_gate_the_trainer_runs_no_further_ahead_of_the_promoted_version_than_the_staleness_bound(
    tmp_path: Path, base_model_dir: Path
) -> None:
    """Servers behind the gate serve v0 until it promotes something: with --max-staleness 1 the trainer
    publishes v1 and waits (samples of v0 trained later than v1 would be stale); once v1 is promoted it
    trains v2 from the samples that waited."""
    db = tmp_path / "log.db"
    asyncio.run(write_samples(db, judged_samples()))
    store = LocalObjectStore(tmp_path / "objects")
    flags = ("--batch-size", "4", "--follow-promoted", "--max-staleness", "1")

    def published() -> list[int]:
        return [v for v in (1, 2, 3) if store.exists(f"checkpoints/{RUN}/{v:08d}/manifest.json")]

    assert wait(start_trainer(tmp_path, base_model_dir, *flags)) == 0
    assert published() == [1]  # eight samples waiting, but the gate has not decided v1
    assert (
        "at v1, waiting for the promotion gate: the servers serve the promoted v0"
        in (tmp_path / "trainer.log").read_text()
    )
    asyncio.run(write_gate_decision(db, 1, "promoted"))
    assert wait(start_trainer(tmp_path, base_model_dir, *flags)) == 0
    assert published() == [1, 2]
    manifest = Manifest.from_json(store.get(f"checkpoints/{RUN}/00000002/manifest.json"))
    ids = [e["envelope"]["event_id"] for e in judged_samples()]
    assert manifest.parent_version == 1 and manifest.metrics["sample_ids"] == ids[4:]


def test_with_rollback_action_stop_the_run_stops_at_the_rollback_until_started_with_restore(
    tmp_path: Path, base_model_dir: Path
) -> None:
    asyncio.run(write_samples(tmp_path / "log.db", judged_samples()))
    store = LocalObjectStore(tmp_path / "objects")
    flags = ("--batch-size", "4", "--rollback-window", "4", "--rollback-margin", "0.25")

    def published() -> list[int]:
        return [v for v in (1, 2, 3, 4) if store.exists(f"checkpoints/{RUN}/{v:08d}/manifest.json")]

    assert wait(start_trainer(tmp_path, base_model_dir, *flags, "--rollback-action", "stop")) == 0
    assert published() == [1, 2]  # v2 restores v0's weights; nothing is trained after it
    assert wait(start_trainer(tmp_path, base_model_dir, *flags, "--rollback-action", "stop")) == 0
    assert published() == [1, 2]  # a restart keeps the run stopped
    log = (tmp_path / "trainer.log").read_text()
    assert log.count("the run is stopped: v2 restored an earlier version's weights") == 2
    assert wait(start_trainer(tmp_path, base_model_dir, *flags)) == 0  # --rollback-action restore
    assert published() == [1, 2, 3]
    assert Manifest.from_json(store.get(f"checkpoints/{RUN}/00000003/manifest.json")).parent_version == 2
