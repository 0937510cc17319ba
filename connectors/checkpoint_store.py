"""The checkpoint protocol on the object store: the trainer publishes, serving verifies and loads.

Both sides import this module (and never each other). Object keys:

    checkpoints/<run_id>/<version:08d>/<file>           every file of the checkpoint folder
    checkpoints/<run_id>/<version:08d>/trainer_state/   the trainer's own state (optimizer moments):
                                                        listed and verified like the rest, not
                                                        downloaded by servers
    checkpoints/<run_id>/<version:08d>/manifest.json    written LAST, with put_if_absent

A version is complete exactly when its manifest exists, so a crash mid-upload leaves an incomplete
folder that `latest_checkpoint` never returns (`incomplete_checkpoints` / `clean_incomplete` find
and remove it). The manifest records the sha256 and size of every file, the base model, the parent
version, the checkpoint kind (full | lora), the consumed topic offsets (what a restarted trainer
resumes from), a digest of the trained sample ids and the step's metrics. Its own sha256 travels in
the CheckpointPublished event, so a reader can refuse a manifest that was swapped after publication.
One writer per run: the trainer. Readers never write.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from orl.connectors.object_store.base import ObjectNotFound, ObjectStore, ObjectStoreError, check_key
from orl.schemas.errors import CheckpointError, ServiceUnavailable

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
TRAINER_STATE_DIR = "trainer_state"  # files under it resume the trainer; a server has no use for them
MANIFEST_FORMAT = 1
CHECKPOINT_KINDS = ("full", "lora")
_ROOT = "checkpoints"
_VERSION_RE = re.compile(r"^\d+$")
_HASH_CHUNK_BYTES = 1 << 20
PUBLISH_RETRY_S = 600.0  # how long a publish waits out an unreachable store before it fails
_FIRST_RETRY_PAUSE_S, _MAX_RETRY_PAUSE_S = 1.0, 30.0


class CheckpointRejected(CheckpointError):
    """A checkpoint failed verification; `reason` says precisely why (file, expected vs actual)."""

    def __init__(self, manifest_key: str, reason: str) -> None:
        super().__init__(f"checkpoint {manifest_key} rejected: {reason}")
        self.manifest_key = manifest_key
        self.reason = reason


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the version folder, '/'-separated
    size: int
    sha256: str


@dataclass(frozen=True)
class TopicOffset:
    """The next offset to read in a topic partition (as the TopicOffset Avro record)."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Manifest:
    """What a published checkpoint holds. `sha256` is the hash of the stored JSON bytes (not in them)."""

    run_id: str
    version: int
    parent_version: int | None
    kind: str
    base_model: str
    files: tuple[FileEntry, ...]
    consumed_offsets: tuple[TopicOffset, ...]
    sample_id_digest: str
    sample_count: int
    metrics: Mapping[str, Any]
    created_at: str
    format: int = MANIFEST_FORMAT
    sha256: str = field(default="", compare=False)

    @property
    def prefix(self) -> str:
        return version_prefix(self.run_id, self.version)

    @property
    def manifest_key(self) -> str:
        return self.prefix + MANIFEST_NAME

    def to_json(self) -> bytes:
        """Canonical JSON (sorted keys, no NaN), without the `sha256` field."""
        body = asdict(self)
        del body["sha256"]
        return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """Parse stored manifest bytes; `sha256` is set to the hash of exactly these bytes."""
        body = json.loads(raw)
        return cls(
            run_id=str(body["run_id"]),
            version=int(body["version"]),
            parent_version=None if body["parent_version"] is None else int(body["parent_version"]),
            kind=str(body["kind"]),
            base_model=str(body["base_model"]),
            files=tuple(FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in body["files"]),
            consumed_offsets=tuple(
                TopicOffset(str(o["topic"]), int(o["partition"]), int(o["offset"]))
                for o in body["consumed_offsets"]
            ),
            sample_id_digest=str(body["sample_id_digest"]),
            sample_count=int(body["sample_count"]),
            metrics=dict(body["metrics"]),
            created_at=str(body["created_at"]),
            format=int(body.get("format", MANIFEST_FORMAT)),
            sha256=hashlib.sha256(raw).hexdigest(),
        )


def run_prefix(run_id: str) -> str:
    """`checkpoints/<run_id>/`; a run id is one key segment (no '/')."""
    if not run_id or "/" in run_id:
        raise CheckpointError(f"invalid run id {run_id!r}: one non-empty key segment, no '/'")
    try:
        return check_key(f"{_ROOT}/{run_id}/x")[:-1]
    except ObjectStoreError as exc:
        raise CheckpointError(f"invalid run id {run_id!r}: {exc}") from exc


def version_prefix(run_id: str, version: int) -> str:
    return f"{run_prefix(run_id)}{version:08d}/"


def sample_ids_digest(sample_ids: Iterable[str]) -> str:
    """sha256 hex of the sorted sample ids joined by newlines (duplicates kept, order-independent)."""
    return hashlib.sha256("\n".join(sorted(sample_ids)).encode()).hexdigest()


def _file_digest(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as source:
        while chunk := source.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _local_files(local_dir: Path) -> list[tuple[str, Path]]:
    if not local_dir.is_dir():
        raise CheckpointError(f"checkpoint folder {local_dir} does not exist")
    files = sorted((p.relative_to(local_dir).as_posix(), p) for p in local_dir.rglob("*") if p.is_file())
    if not files:
        raise CheckpointError(f"checkpoint folder {local_dir} holds no files")
    if any(rel == MANIFEST_NAME for rel, _ in files):
        raise CheckpointError(f"{local_dir} holds a {MANIFEST_NAME}: that name is reserved for the manifest")
    return files


def _finite_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """JSON has no NaN / inf: such metric values are stored as null."""
    return {
        str(k): (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()
    }


def _check_publish_args(version: int, parent_version: int | None, kind: str) -> None:
    if version < 0:
        raise CheckpointError(f"checkpoint version must be >= 0, got {version}")
    if parent_version is not None and parent_version >= version:
        raise CheckpointError(f"parent version {parent_version} must be below version {version}")
    if kind not in CHECKPOINT_KINDS:
        raise CheckpointError(f"checkpoint kind {kind!r} is not one of {CHECKPOINT_KINDS}")


def publish_checkpoint(
    store: ObjectStore,
    run_id: str,
    version: int,
    local_dir: Path,
    *,
    parent_version: int | None,
    kind: str,
    base_model: str,
    consumed_offsets: Sequence[Mapping[str, Any]],
    sample_ids: Sequence[str],
    metrics: Mapping[str, Any],
    created_at: datetime | None = None,
    retry_for_s: float = PUBLISH_RETRY_S,
) -> Manifest:
    """Upload every file under `local_dir`, then the manifest last; return it (with its sha256).

    A version is immutable: publishing one that already has a different manifest raises
    CheckpointError. Leftovers of an earlier crashed attempt at the same version are deleted first.
    While the store is unreachable (ServiceUnavailable: down, restarting) the whole publish is
    retried with backoff for up to `retry_for_s`; a retry that finds this very manifest stored (the
    store took the last PUT but its answer was lost) returns it.
    """
    _check_publish_args(version, parent_version, kind)
    manifest = Manifest(
        run_id=run_id,
        version=version,
        parent_version=parent_version,
        kind=kind,
        base_model=base_model,
        files=tuple(FileEntry(rel, *_file_digest(path)) for rel, path in _local_files(Path(local_dir))),
        consumed_offsets=tuple(
            TopicOffset(str(o["topic"]), int(o["partition"]), int(o["offset"])) for o in consumed_offsets
        ),
        sample_id_digest=sample_ids_digest(sample_ids),
        sample_count=len(sample_ids),
        metrics=_finite_metrics(metrics),
        created_at=(created_at or datetime.now(UTC)).isoformat(),
    )
    deadline = time.monotonic() + retry_for_s
    pause_s = _FIRST_RETRY_PAUSE_S
    while True:
        try:
            _upload_checkpoint(store, manifest, Path(local_dir))
            break
        except ServiceUnavailable as error:
            if time.monotonic() + pause_s > deadline:
                raise
            log.warning(
                "store unreachable while publishing checkpoint %s v%d (%s); retrying in %.0f s",
                run_id,
                version,
                error,
                pause_s,
            )
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, _MAX_RETRY_PAUSE_S)
    log.info(
        "published checkpoint %s v%d (%d files) at %s", run_id, version, len(manifest.files), manifest.prefix
    )
    return replace(manifest, sha256=hashlib.sha256(manifest.to_json()).hexdigest())


def _upload_checkpoint(store: ObjectStore, manifest: Manifest, local_dir: Path) -> None:
    """One attempt: the files (after deleting an incomplete earlier attempt's), then the manifest."""
    raw = manifest.to_json()
    if _stored_manifest_is(store, manifest.manifest_key, raw):
        return
    _delete_prefix(store, manifest.prefix)
    for entry in manifest.files:
        store.put_file(check_key(manifest.prefix + entry.path), local_dir / entry.path)
    if not store.put_if_absent(manifest.manifest_key, raw) and not _stored_manifest_is(
        store, manifest.manifest_key, raw
    ):
        raise CheckpointError(
            f"checkpoint {manifest.run_id} v{manifest.version} was published concurrently by another writer"
        )


def _stored_manifest_is(store: ObjectStore, key: str, raw: bytes) -> bool:
    """True if `key` holds exactly `raw`, False if it is absent; CheckpointError if it holds another one."""
    try:
        stored = store.get(key)
    except ObjectNotFound:
        return False
    if stored != raw:
        raise CheckpointError(f"checkpoint {key} is already published, with another manifest")
    return True


def _delete_prefix(store: ObjectStore, prefix: str) -> list[str]:
    keys = store.list(prefix)
    for key in keys:
        store.delete(key)
    return keys


def _versions(store: ObjectStore, run_id: str) -> dict[int, bool]:
    """Every version folder of the run -> whether it has a manifest."""
    root = run_prefix(run_id)
    found: dict[int, bool] = {}
    for key in store.list(root):
        folder, _, rest = key[len(root) :].partition("/")
        if not _VERSION_RE.match(folder) or not rest:
            continue
        version = int(folder)
        found[version] = found.get(version, False) or rest == MANIFEST_NAME
    return found


def complete_versions(store: ObjectStore, run_id: str) -> list[int]:
    """The run's complete versions (those with a manifest), ascending; verified or not."""
    return sorted(v for v, has_manifest in _versions(store, run_id).items() if has_manifest)


def latest_checkpoint(store: ObjectStore, run_id: str) -> Manifest | None:
    """The complete checkpoint (one with a manifest) of the highest version, or None."""
    complete = complete_versions(store, run_id)
    if not complete:
        return None
    key = version_prefix(run_id, complete[-1]) + MANIFEST_NAME
    return _parse_manifest(key, store.get(key))


def incomplete_checkpoints(store: ObjectStore, run_id: str) -> list[int]:
    """Versions that have files but no manifest (an upload that never finished), ascending."""
    return sorted(v for v, has_manifest in _versions(store, run_id).items() if not has_manifest)


def clean_incomplete(store: ObjectStore, run_id: str) -> list[int]:
    """Delete the files of every incomplete version; returns the versions removed.

    Only the run's single writer may call this (at start-up, before publishing): it cannot tell a
    crashed upload from one in progress.
    """
    removed = incomplete_checkpoints(store, run_id)
    for version in removed:
        keys = _delete_prefix(store, version_prefix(run_id, version))
        log.warning("removed incomplete checkpoint %s v%d (%d objects)", run_id, version, len(keys))
    return removed


def _parse_manifest(manifest_key: str, raw: bytes) -> Manifest:
    try:
        manifest = Manifest.from_json(raw)
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointRejected(manifest_key, f"malformed manifest: {exc!r}") from exc
    if manifest.manifest_key != manifest_key:
        raise CheckpointRejected(
            manifest_key, f"manifest describes {manifest.manifest_key}, not the key it was read from"
        )
    return manifest


def _safe_relative(manifest_key: str, rel: str) -> str:
    pure = PurePosixPath(rel)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in rel.split("/")) or rel == MANIFEST_NAME:
        raise CheckpointRejected(manifest_key, f"unsafe file path {rel!r} in manifest")
    return rel


def _download_entry(store: ObjectStore, manifest_key: str, key: str, entry: FileEntry, dest: Path) -> None:
    """Stream one object to `dest` while hashing it; CheckpointRejected on any mismatch."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    try:
        with dest.open("wb") as out:
            for chunk in store.iter_chunks(key):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
    except ObjectNotFound as exc:
        raise CheckpointRejected(manifest_key, f"missing file {entry.path!r}") from exc
    if size != entry.size:
        raise CheckpointRejected(
            manifest_key, f"size mismatch for {entry.path!r}: manifest {entry.size} bytes, stored {size}"
        )
    if digest.hexdigest() != entry.sha256:
        raise CheckpointRejected(
            manifest_key,
            f"sha256 mismatch for {entry.path!r}: manifest {entry.sha256}, stored {digest.hexdigest()}",
        )


def _read_manifest(
    store: ObjectStore, manifest_key: str, expected_sha256: str | None
) -> tuple[Manifest, bytes]:
    try:
        raw = store.get(manifest_key)
    except ObjectNotFound as exc:
        raise CheckpointRejected(manifest_key, "no manifest at this key (checkpoint incomplete?)") from exc
    # Any other ObjectStoreError (the store unreachable) is not a verdict on the checkpoint: it
    # propagates, and the caller retries instead of refusing the checkpoint for good.
    actual = hashlib.sha256(raw).hexdigest()
    if expected_sha256 is not None and actual != expected_sha256:
        raise CheckpointRejected(
            manifest_key, f"manifest hash mismatch: expected {expected_sha256}, got {actual}"
        )
    return _parse_manifest(manifest_key, raw), raw


def download_and_verify(
    store: ObjectStore,
    manifest_key: str,
    dest_dir: Path,
    expected_manifest_sha256: str | None = None,
    *,
    trainer_state: bool = True,
) -> Manifest:
    """Check the manifest (hash if given), download every listed file into `dest_dir`, verify each.

    `trainer_state=False` (servers, and a run started from another run's checkpoint) leaves out the
    files under TRAINER_STATE_DIR.

    Raises CheckpointRejected naming the reason; the files this call wrote are then removed. A store
    that cannot be read raises its ObjectStoreError instead (a reason to retry, not to refuse). Objects
    in the version folder that the manifest does not list are ignored (and logged). On success
    `dest_dir` holds the checkpoint's files plus `manifest.json`.
    """
    manifest, raw = _read_manifest(store, manifest_key, expected_manifest_sha256)
    dest_dir = Path(dest_dir)
    listed = {manifest.prefix + _safe_relative(manifest_key, e.path) for e in manifest.files}
    extra = sorted(set(store.list(manifest.prefix)) - listed - {manifest_key})
    if extra:
        log.warning("checkpoint %s: ignoring %d unlisted objects: %s", manifest_key, len(extra), extra[:10])
    written: list[Path] = []
    try:
        for entry in manifest.files:
            if not trainer_state and entry.path.startswith(f"{TRAINER_STATE_DIR}/"):
                continue
            dest = dest_dir / entry.path
            written.append(dest)
            _download_entry(store, manifest_key, manifest.prefix + entry.path, entry, dest)
        (dest_dir / MANIFEST_NAME).write_bytes(raw)
    except CheckpointRejected:
        for path in written:
            path.unlink(missing_ok=True)
        raise
    log.info(
        "verified checkpoint %s v%d (%d files) into %s",
        manifest.run_id,
        manifest.version,
        len(written),
        dest_dir,
    )
    return manifest


def read_manifest(store: ObjectStore, manifest_key: str) -> Manifest:
    """The manifest stored at `manifest_key` (CheckpointRejected if it is missing or malformed)."""
    return _read_manifest(store, manifest_key, None)[0]


def checkpoint_ancestors(store: ObjectStore, manifest_key: str) -> list[dict[str, Any]]:
    """Where the run of this checkpoint started, and where that run started, back to the base model.

    Each step is the `init_from` that `orl train --init-from` records in every manifest of a run
    (run_id, version, manifest_key, manifest_sha256); the last item is {"base_model": ...}.
    """
    chain: list[dict[str, Any]] = []
    seen: set[str] = set()
    key = manifest_key
    while key not in seen:
        seen.add(key)
        manifest = read_manifest(store, key)
        start = manifest.metrics.get("init_from")
        if not start:
            chain.append({"base_model": manifest.base_model})
            break
        chain.append(dict(start))
        key = str(start["manifest_key"])
    return chain


def checkpoint_descendants(store: ObjectStore, manifest_keys: Iterable[str]) -> list[dict[str, Any]]:
    """The checkpoints of every run that started from one of `manifest_keys`, directly or through
    other runs started that way: [{run_id, version, manifest_key, via}], `via` naming the checkpoint
    the run started from. Reads one manifest per run in the store (they all record the same start)."""
    runs = sorted({key[len(_ROOT) + 1 :].partition("/")[0] for key in store.list(f"{_ROOT}/")} - {""})
    versions_by_run: dict[str, list[int]] = {}
    started_from: dict[str, dict[str, Any]] = {}
    for run_id in runs:
        versions = sorted(v for v, has_manifest in _versions(store, run_id).items() if has_manifest)
        if not versions:
            continue
        versions_by_run[run_id] = versions
        start = read_manifest(store, version_prefix(run_id, versions[0]) + MANIFEST_NAME).metrics.get(
            "init_from"
        )
        if start:
            started_from[run_id] = dict(start)
    found: list[dict[str, Any]] = []
    frontier, visited = set(manifest_keys), set()
    while frontier:
        reached = set()
        for run_id, start in sorted(started_from.items()):
            if run_id in visited or start["manifest_key"] not in frontier:
                continue
            visited.add(run_id)
            via = f"{start['run_id']}/{start['version']}"
            for version in versions_by_run[run_id]:
                key = version_prefix(run_id, version) + MANIFEST_NAME
                found.append({"run_id": run_id, "version": version, "manifest_key": key, "via": via})
                reached.add(key)
        frontier = reached
    return found
