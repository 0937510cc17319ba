"""The checkpoint protocol (orl.connectors.checkpoint_store) over the real local object store."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from orl.connectors import checkpoint_store
from orl.connectors.checkpoint_store import (
    CheckpointError,
    CheckpointRejected,
    Manifest,
    clean_incomplete,
    download_and_verify,
    incomplete_checkpoints,
    latest_checkpoint,
    publish_checkpoint,
    sample_ids_digest,
    version_prefix,
)
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.schemas.errors import ServiceUnavailable

RUN = "run-a"
OFFSETS = [
    {"topic": "samples", "partition": 0, "offset": 17},
    {"topic": "samples", "partition": 1, "offset": 4},
]


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    return LocalObjectStore(tmp_path / "store")


def _checkpoint_dir(tmp_path: Path, name: str = "ckpt") -> Path:
    folder = tmp_path / name
    (folder / "sub").mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"\x00weights" * 1000)
    (folder / "adapter_config.json").write_text('{"r": 16}')
    (folder / "sub" / "extra.txt").write_text("nested")
    return folder


def _publish(
    store: LocalObjectStore,
    tmp_path: Path,
    version: int,
    parent: int | None = None,
    retry_for_s: float = 600.0,
) -> Manifest:
    return publish_checkpoint(
        store,
        RUN,
        version,
        _checkpoint_dir(tmp_path, f"ckpt{version}"),
        parent_version=parent,
        kind="lora",
        base_model="smollm2-135m",
        consumed_offsets=OFFSETS,
        sample_ids=["s2", "s1", "s3"],
        metrics={"loss": 0.5, "kl": float("nan")},
        created_at=datetime(2026, 1, 2, tzinfo=UTC),
        retry_for_s=retry_for_s,
    )


def test_publish_then_verify(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 1, parent=0)
    raw = store.get(manifest.manifest_key)
    assert manifest.sha256 == hashlib.sha256(raw).hexdigest()
    assert manifest.manifest_key == "checkpoints/run-a/00000001/manifest.json"
    body = json.loads(raw)
    assert body["sample_count"] == 3
    assert body["sample_id_digest"] == hashlib.sha256(b"s1\ns2\ns3").hexdigest()
    assert body["metrics"] == {"loss": 0.5, "kl": None}
    assert body["consumed_offsets"][0] == {"topic": "samples", "partition": 0, "offset": 17}
    assert sorted(f["path"] for f in body["files"]) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "sub/extra.txt",
    ]

    dest = tmp_path / "dest"
    verified = download_and_verify(
        store, manifest.manifest_key, dest, expected_manifest_sha256=manifest.sha256
    )
    assert verified == manifest
    assert verified.sha256 == manifest.sha256
    assert (dest / "sub" / "extra.txt").read_text() == "nested"
    assert (dest / "manifest.json").read_bytes() == raw


def test_manifest_json_round_trip(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 3)
    again = Manifest.from_json(manifest.to_json())
    assert again == manifest
    assert again.sha256 == manifest.sha256
    assert sample_ids_digest(["b", "a"]) == sample_ids_digest(["a", "b"])


def test_tampered_file_is_rejected_by_name(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 1)
    store.put(manifest.prefix + "sub/extra.txt", b"NESTED")  # same size, different bytes
    dest = tmp_path / "dest"
    with pytest.raises(CheckpointRejected, match="sha256 mismatch for 'sub/extra.txt'"):
        download_and_verify(store, manifest.manifest_key, dest)
    # the files verified before the bad one are removed too: nothing half-verified is left behind
    assert [p for p in dest.rglob("*") if p.is_file()] == []


def test_resized_file_is_rejected(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 1)
    store.put(manifest.prefix + "sub/extra.txt", b"nested!")
    with pytest.raises(CheckpointRejected, match="size mismatch for 'sub/extra.txt'"):
        download_and_verify(store, manifest.manifest_key, tmp_path / "dest")


def test_deleted_file_is_rejected(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 1)
    store.delete(manifest.prefix + "adapter_model.safetensors")
    with pytest.raises(CheckpointRejected, match="missing file 'adapter_model.safetensors'"):
        download_and_verify(store, manifest.manifest_key, tmp_path / "dest")


def test_manifest_hash_mismatch_is_rejected(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 1)
    with pytest.raises(CheckpointRejected, match="manifest hash mismatch") as info:
        download_and_verify(
            store, manifest.manifest_key, tmp_path / "dest", expected_manifest_sha256="0" * 64
        )
    assert info.value.manifest_key == manifest.manifest_key


def test_swapped_manifest_is_rejected(store: LocalObjectStore, tmp_path: Path) -> None:
    """A manifest whose hash was recorded at publication cannot be replaced by another valid one."""
    manifest = _publish(store, tmp_path, 1)
    body = json.loads(store.get(manifest.manifest_key))
    body["metrics"]["loss"] = 0.1
    store.put(manifest.manifest_key, json.dumps(body).encode())
    with pytest.raises(CheckpointRejected, match="manifest hash mismatch"):
        download_and_verify(store, manifest.manifest_key, tmp_path / "dest", manifest.sha256)


def test_unsafe_path_in_manifest_is_rejected(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 1)
    body = json.loads(store.get(manifest.manifest_key))
    body["files"][0]["path"] = "../../escape"
    store.put(manifest.manifest_key, json.dumps(body).encode())
    with pytest.raises(CheckpointRejected, match="unsafe file path"):
        download_and_verify(store, manifest.manifest_key, tmp_path / "dest")
    assert not (tmp_path / "escape").exists()


def test_malformed_or_missing_manifest_is_rejected(store: LocalObjectStore, tmp_path: Path) -> None:
    manifest = _publish(store, tmp_path, 1)
    with pytest.raises(CheckpointRejected, match="no manifest"):
        download_and_verify(store, version_prefix(RUN, 9) + "manifest.json", tmp_path / "dest")
    store.put(manifest.manifest_key, b"{not json")
    with pytest.raises(CheckpointRejected, match="malformed manifest"):
        download_and_verify(store, manifest.manifest_key, tmp_path / "dest")


def test_unlisted_objects_are_ignored_and_logged(
    store: LocalObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manifest = _publish(store, tmp_path, 1)
    store.put(manifest.prefix + "stray.bin", b"junk")
    dest = tmp_path / "dest"
    download_and_verify(store, manifest.manifest_key, dest)
    assert not (dest / "stray.bin").exists()
    assert "stray.bin" in caplog.text


def test_incomplete_checkpoint_is_not_latest_and_is_cleaned(store: LocalObjectStore, tmp_path: Path) -> None:
    assert latest_checkpoint(store, RUN) is None
    _publish(store, tmp_path, 1)
    store.put(version_prefix(RUN, 2) + "adapter_model.safetensors", b"half an upload")
    latest = latest_checkpoint(store, RUN)
    assert latest is not None and latest.version == 1
    assert incomplete_checkpoints(store, RUN) == [2]
    assert clean_incomplete(store, RUN) == [2]
    assert incomplete_checkpoints(store, RUN) == []
    assert store.list(version_prefix(RUN, 2)) == []
    assert store.exists(version_prefix(RUN, 1) + "manifest.json")


def test_latest_picks_highest_complete_version(store: LocalObjectStore, tmp_path: Path) -> None:
    for version, parent in [(1, None), (2, 1), (10, 2)]:
        _publish(store, tmp_path, version, parent)
    store.put(version_prefix(RUN, 11) + "adapter_config.json", b"{}")
    _publish_other_run = publish_checkpoint(
        store,
        "run-b",
        99,
        _checkpoint_dir(tmp_path, "other"),
        parent_version=None,
        kind="full",
        base_model="m",
        consumed_offsets=[],
        sample_ids=[],
        metrics={},
    )
    latest = latest_checkpoint(store, RUN)
    assert latest is not None
    assert (latest.version, latest.parent_version) == (10, 2)
    assert latest.consumed_offsets[1].offset == 4
    assert latest.sha256 == hashlib.sha256(store.get(latest.manifest_key)).hexdigest()
    assert _publish_other_run.version == 99


def test_published_version_is_immutable(store: LocalObjectStore, tmp_path: Path) -> None:
    _publish(store, tmp_path, 1)
    with pytest.raises(CheckpointError, match="already published"):
        publish_checkpoint(
            store,
            RUN,
            1,
            _checkpoint_dir(tmp_path, "again"),
            parent_version=None,
            kind="lora",
            base_model="m",
            consumed_offsets=[],
            sample_ids=[],
            metrics={},
        )


class FlakyStore(LocalObjectStore):
    """A local store that is unreachable for its first `down_for` uploads; with `lose_manifest_answer`
    it stores the first manifest, then answers as if the connection dropped."""

    def __init__(self, root: Path, down_for: int = 0, lose_manifest_answer: bool = False) -> None:
        super().__init__(root)
        self.down_for, self.lose_manifest_answer = down_for, lose_manifest_answer

    def put_file(self, key: str, path: Path) -> None:
        if self.down_for > 0:
            self.down_for -= 1
            raise ServiceUnavailable("S3 endpoint http://127.0.0.1:1 unreachable: connection refused")
        super().put_file(key, path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created = super().put_if_absent(key, data)
        if self.lose_manifest_answer:
            self.lose_manifest_answer = False
            raise ServiceUnavailable("S3 endpoint http://127.0.0.1:1 unreachable: connection reset")
        return created


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_store, "_FIRST_RETRY_PAUSE_S", 0.01)


def test_a_publish_waits_out_an_unreachable_store(tmp_path: Path, quick_retries: None) -> None:
    store = FlakyStore(tmp_path / "store", down_for=3)
    manifest = _publish(store, tmp_path, 1)
    assert store.down_for == 0
    download_and_verify(store, manifest.manifest_key, tmp_path / "out")
    assert latest_checkpoint(store, RUN) == manifest


def test_a_publish_whose_manifest_landed_but_whose_answer_was_lost_succeeds(
    tmp_path: Path, quick_retries: None
) -> None:
    store = FlakyStore(tmp_path / "store", lose_manifest_answer=True)
    manifest = _publish(store, tmp_path, 1)
    assert manifest.sha256 == hashlib.sha256(store.get(manifest.manifest_key)).hexdigest()
    assert latest_checkpoint(store, RUN) == manifest


def test_a_publish_gives_up_when_the_store_stays_unreachable(tmp_path: Path, quick_retries: None) -> None:
    store = FlakyStore(tmp_path / "store", down_for=1000)
    with pytest.raises(ServiceUnavailable, match="unreachable"):
        _publish(store, tmp_path, 1, retry_for_s=0.2)
    assert latest_checkpoint(store, RUN) is None


def test_republishing_after_a_crash_drops_stale_files(store: LocalObjectStore, tmp_path: Path) -> None:
    store.put(version_prefix(RUN, 1) + "stale.bin", b"from the crashed attempt")
    _publish(store, tmp_path, 1)
    assert not store.exists(version_prefix(RUN, 1) + "stale.bin")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "delta"}, "kind"),
        ({"parent_version": 5}, "parent version"),
        ({"run_id": "a/b"}, "invalid run id"),
    ],
)
def test_bad_publish_arguments(store: LocalObjectStore, tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"run_id": RUN, "kind": "lora", "parent_version": None} | kwargs
    with pytest.raises(CheckpointError, match=message):
        publish_checkpoint(
            store,
            args["run_id"],
            3,
            _checkpoint_dir(tmp_path),
            parent_version=args["parent_version"],
            kind=args["kind"],
            base_model="m",
            consumed_offsets=[],
            sample_ids=[],
            metrics={},
        )


def test_a_local_manifest_file_is_refused(store: LocalObjectStore, tmp_path: Path) -> None:
    folder = _checkpoint_dir(tmp_path)
    (folder / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match="reserved"):
        publish_checkpoint(
            store,
            RUN,
            1,
            folder,
            parent_version=None,
            kind="full",
            base_model="m",
            consumed_offsets=[],
            sample_ids=[],
            metrics={},
        )
