"""Checkpoint lineage across runs (`orl train --init-from`), read from the manifests in a real local store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orl.connectors.checkpoint_store import (
    checkpoint_ancestors,
    checkpoint_descendants,
    publish_checkpoint,
    version_prefix,
)
from orl.connectors.object_store.local_store import LocalObjectStore


def key(run_id: str, version: int) -> str:
    return version_prefix(run_id, version) + "manifest.json"


def publish(
    store: LocalObjectStore, tmp: Path, run_id: str, version: int, start: tuple[str, int] | None
) -> None:
    folder = tmp / f"{run_id}-{version}"
    folder.mkdir()
    (folder / "adapter.bin").write_bytes(f"{run_id} v{version}".encode())
    metrics: dict[str, Any] = {}
    if start is not None:
        metrics["init_from"] = {"run_id": start[0], "version": start[1], "manifest_key": key(*start)}
    publish_checkpoint(
        store, run_id, version, folder, parent_version=version - 1 or None, kind="lora", base_model="smollm2",
        consumed_offsets=[], sample_ids=[], metrics=metrics,
    )  # fmt: skip


def lineage_store(tmp_path: Path) -> LocalObjectStore:
    """live v1-v2 from the base; replay v1-v2 from live v1; again v1 from replay v2; other v1 from the base."""
    store = LocalObjectStore(tmp_path / "objects")
    publish(store, tmp_path, "live", 1, None)
    publish(store, tmp_path, "live", 2, None)
    publish(store, tmp_path, "replay", 1, ("live", 1))
    publish(store, tmp_path, "replay", 2, ("live", 1))
    publish(store, tmp_path, "again", 1, ("replay", 2))
    publish(store, tmp_path, "other", 1, None)
    return store


def test_ancestors_go_back_to_the_base_model(tmp_path: Path) -> None:
    store = lineage_store(tmp_path)
    chain = checkpoint_ancestors(store, key("again", 1))
    assert [(c.get("run_id"), c.get("version")) for c in chain[:-1]] == [("replay", 2), ("live", 1)]
    assert chain[-1] == {"base_model": "smollm2"}
    assert checkpoint_ancestors(store, key("live", 2)) == [{"base_model": "smollm2"}]


def test_descendants_are_the_runs_started_from_a_checkpoint_directly_or_through_others(
    tmp_path: Path,
) -> None:
    store = lineage_store(tmp_path)
    found = checkpoint_descendants(store, [key("live", 1)])
    assert [(d["run_id"], d["version"], d["via"]) for d in found] == [
        ("replay", 1, "live/1"),
        ("replay", 2, "live/1"),
        ("again", 1, "replay/2"),
    ]
    assert checkpoint_descendants(store, [key("live", 2)]) == []
    assert [d["run_id"] for d in checkpoint_descendants(store, [key("replay", 1)])] == []
