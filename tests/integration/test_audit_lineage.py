"""`orl audit` follows checkpoint lineage across runs: a run trained on a session's samples, and a
second run started from its checkpoint with `--init-from` (manifests in a real local store)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.pipeline.history.audit import audit_id, audit_session, render_chain
from orl.pipeline.history.audit_index import AuditIndex
from orl.pipeline.history.namespace_io import NamespaceWriter
from orl.schemas.events import make_event

from tests.integration.test_audit import train_step
from tests.integration.test_replay import SOURCE, events_of, record, recorded_settings
from tests.unit.test_checkpoint_lineage import key, publish


def test_a_checkpoint_shows_where_its_run_started_and_a_session_the_runs_started_from_its_checkpoints(
    tmp_path: Path,
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    publish(store, tmp_path, "run-a", 1, None)
    publish(store, tmp_path, "run-b", 1, ("run-a", 1))
    checkpoint = make_event(
        "CheckpointPublished", namespace=SOURCE, producer="trainer/test", occurred_at_ms=1_800_000_000_100,
        id_parts=["run-a", 1, "sha"], run_id="run-a", version=1, parent_version=None, kind="lora",
        uri=store.uri(key("run-a", 1)), manifest_key=key("run-a", 1), manifest_sha256="ab" * 32,
        base_model="smollm2", consumed_offsets=[], sample_id_digest="d",
    )  # fmt: skip

    async def scenario() -> None:
        async with open_event_log(f"sqlite:///{tmp_path / 'log.db'}") as log:
            await record(log, recorded_settings(tmp_path), sessions=1)
            samples = await events_of(log, SOURCE, "samples")
            ready = [
                s["envelope"]["event_id"] for s in samples if s["envelope"]["event_type"] == "SampleReady"
            ]
            writer = NamespaceWriter(log, SOURCE)
            await writer.prepare()
            await writer.write([train_step(ready, 1), checkpoint])
            index = AuditIndex(tmp_path / "audit.sqlite", SOURCE)
            try:
                chain = await audit_id(log, index, checkpoint["envelope"]["event_id"], store)
                assert chain["started_from"] == [{"base_model": "smollm2"}]
                session = await audit_session(log, index, "s0", store)
            finally:
                index.close()
        assert [(c["run_id"], c["version"]) for c in session["checkpoints"]] == [("run-a", 1)]
        derived = session["derived_checkpoints"]
        assert [(d["run_id"], d["version"], d["via"]) for d in derived] == [("run-b", 1, "run-a/1")]
        assert "run run-b v1 (started from run-a/1)" in render_chain(session)
        assert "started from smollm2" in render_chain(chain)

    asyncio.run(scenario())
