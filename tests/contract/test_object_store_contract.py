"""The ObjectStore contract, run against every implementation: a temp directory and a real S3 server.

The S3 side talks to SeaweedFS (the `s3_server` fixture) through the minio SDK, one fresh bucket per
test, so nothing here is mocked.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from orl.connectors.object_store.base import ObjectNotFound, ObjectStore, ObjectStoreError
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.connectors.object_store.s3_store import S3ObjectStore

LARGE_FILE_BYTES = 20 * 1024 * 1024 + 12345  # several multipart parts, and a ragged last one
BAD_KEYS = ["", "/abs", "a/../b", "..", "a//b", "a/", "./a", "a\\b", "a/\x00b", "a/.orl-tmp-x"]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "store")
        return
    server = request.getfixturevalue("s3_server")
    bucket = f"orl-test-{uuid.uuid4().hex[:16]}"
    yield S3ObjectStore(server.endpoint, server.access_key, server.secret_key, bucket)


@pytest.fixture(scope="session")
def large_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("large") / "blob.bin"
    data = os.urandom(LARGE_FILE_BYTES)
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("data", [b"", b"hello", bytes(range(256)) * 64, b"\x00\xff" * 3_000_000])
def test_put_then_get_returns_the_same_bytes(store: ObjectStore, data: bytes) -> None:
    store.put("runs/r1/blob.bin", data)
    assert store.get("runs/r1/blob.bin") == data
    assert b"".join(store.iter_chunks("runs/r1/blob.bin", chunk_size=4096)) == data


def test_put_overwrites(store: ObjectStore) -> None:
    store.put("k", b"old content, longer than the new one")
    store.put("k", b"new")
    assert store.get("k") == b"new"
    assert store.list() == ["k"]


def test_put_file_streams_a_large_file_intact(store: ObjectStore, large_file: tuple[Path, str]) -> None:
    path, sha256 = large_file
    store.put_file("checkpoints/run/v1/model.safetensors", path)
    digest = hashlib.sha256()
    sizes = []
    for chunk in store.iter_chunks("checkpoints/run/v1/model.safetensors", chunk_size=1 << 20):
        digest.update(chunk)
        sizes.append(len(chunk))
    assert digest.hexdigest() == sha256
    assert sum(sizes) == LARGE_FILE_BYTES
    assert max(sizes) <= 1 << 20


def test_get_file_downloads_whole_object(store: ObjectStore, tmp_path: Path) -> None:
    store.put("a/b.bin", b"payload" * 1000)
    target = tmp_path / "down" / "b.bin"
    store.get_file("a/b.bin", target)
    assert target.read_bytes() == b"payload" * 1000
    assert list(target.parent.iterdir()) == [target]


def test_list_returns_keys_with_the_prefix_sorted(store: ObjectStore) -> None:
    keys = ["runs/b/1", "runs/a/2", "runs/ab/1", "runs/a/1", "runs/a/sub/x", "other/x", "top"]
    for key in keys:
        store.put(key, key.encode())
    assert store.list() == sorted(keys)
    assert store.list("runs/a/") == ["runs/a/1", "runs/a/2", "runs/a/sub/x"]
    assert store.list("runs/a") == ["runs/a/1", "runs/a/2", "runs/a/sub/x", "runs/ab/1"]
    assert store.list("runs/") == sorted(k for k in keys if k.startswith("runs/"))
    assert store.list("nothing/") == []
    assert store.list("to") == ["top"]


def test_exists(store: ObjectStore) -> None:
    assert not store.exists("x/y")
    store.put("x/y", b"1")
    assert store.exists("x/y")
    assert not store.exists("x/y2")


def test_delete_removes_and_tolerates_absent(store: ObjectStore) -> None:
    store.put("d/1", b"1")
    store.put("d/2", b"2")
    store.delete("d/1")
    store.delete("d/1")
    store.delete("never/there")
    assert not store.exists("d/1")
    assert store.list("d/") == ["d/2"]


def test_put_if_absent_creates_once_and_never_overwrites(store: ObjectStore) -> None:
    assert store.put_if_absent("manifests/v1.json", b"first") is True
    assert store.put_if_absent("manifests/v1.json", b"second") is False
    assert store.get("manifests/v1.json") == b"first"
    assert store.list("manifests/") == ["manifests/v1.json"]


def test_put_if_absent_has_exactly_one_winner_under_a_race(store: ObjectStore) -> None:
    results: dict[int, bool] = {}

    def attempt(writer: int) -> None:
        results[writer] = store.put_if_absent("race/key", f"writer-{writer}".encode() * 1000)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [writer for writer, created in results.items() if created]
    assert len(results) == 8 and len(winners) == 1
    assert store.get("race/key") == f"writer-{winners[0]}".encode() * 1000


def test_missing_key_raises_object_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound):
        store.get("no/such/key")
    with pytest.raises(ObjectNotFound):
        list(store.iter_chunks("no/such/key"))
    with pytest.raises(ObjectNotFound):
        store.get_file("no/such/key", tmp_path / "out" / "f")
    assert list((tmp_path / "out").iterdir()) == []  # no partial download left behind


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_rejected_with_the_key_named(store: ObjectStore, key: str) -> None:
    operations = [
        lambda: store.put(key, b"x"),
        lambda: store.put_if_absent(key, b"x"),
        lambda: store.get(key),
        lambda: list(store.iter_chunks(key)),
        lambda: store.exists(key),
        lambda: store.delete(key),
        lambda: store.uri(key),
    ]
    for operation in operations:
        with pytest.raises(ObjectStoreError) as excinfo:
            operation()
        assert not isinstance(excinfo.value, ObjectNotFound)
        assert repr(key) in str(excinfo.value)


def test_uri_names_the_object(store: ObjectStore) -> None:
    uri = store.uri("checkpoints/run/v1/manifest.json")
    assert uri.startswith(("file:///", "s3://"))
    assert uri.endswith("/checkpoints/run/v1/manifest.json")
