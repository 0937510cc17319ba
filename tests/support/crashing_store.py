"""TEST ONLY: an object store that SIGKILLs its own process at a named point of a checkpoint write.

The crash tests' scalpel (tests/e2e/test_trainer_resume.py, through tests/e2e/trainer_crash_main.py).
It wraps the real store the trainer opened and watches the writes under one version's folder,
`checkpoints/<run>/<version>/` (version 0: the first version this process writes). Points:
- after_step: before the version's first upload (the optimizer stepped, nothing uploaded yet);
- mid_upload: after the version's first file upload (the second file, or the manifest, never lands);
- after_manifest: once the manifest is written (TrainStepCompleted / CheckpointPublished not appended).
The trainer writes a version's files and then its manifest (orl.connectors.checkpoint_store.publish_checkpoint)
right after its step and appends the step's events right after the manifest, so the store sees all
three points. SIGKILL, not an exception: no `finally`, no flush, no goodbye, exactly like `kill -9`.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from orl.connectors.checkpoint_store import MANIFEST_NAME, run_prefix
from orl.connectors.object_store.base import ObjectStore

log = logging.getLogger(__name__)

CRASH_POINTS = ("after_step", "mid_upload", "after_manifest")


def kill_this_process(why: str) -> None:
    log.warning("fault injection: SIGKILL %s", why)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingStore(ObjectStore):
    """Delegates every call to `inner`; SIGKILLs the process at `point` of `version`'s checkpoint write."""

    def __init__(self, inner: ObjectStore, run_id: str, point: str, version: int) -> None:
        if point not in CRASH_POINTS:
            raise ValueError(f"crash point must be one of {CRASH_POINTS}, not {point!r}")
        self._inner = inner
        self._run_prefix = run_prefix(run_id)
        self._point = point
        self._version: int | None = version or None  # None: the first version written
        self._uploads = 0

    def _watched(self, key: str) -> bool:
        """Whether `key` is in the watched version's folder (arming on the first version, if asked)."""
        if not key.startswith(self._run_prefix):
            return False
        segment = key[len(self._run_prefix) :].split("/", 1)[0]
        if not segment.isdigit():
            return False
        if self._version is None:
            self._version = int(segment)
        return int(segment) == self._version

    def _before_upload(self, key: str) -> None:
        if not self._watched(key):
            return
        if self._point == "after_step":
            kill_this_process(f"after the step of v{self._version}, before its first upload")
        is_manifest = key.endswith("/" + MANIFEST_NAME)
        if self._point == "mid_upload" and (self._uploads >= 1 or is_manifest):
            kill_this_process(f"in the middle of v{self._version}'s upload, before {key}")
        self._uploads += 1

    def _after_upload(self, key: str) -> None:
        if self._point == "after_manifest" and key.endswith("/" + MANIFEST_NAME) and self._watched(key):
            kill_this_process(f"after v{self._version}'s manifest, before its events")

    def put(self, key: str, data: bytes) -> None:
        self._before_upload(key)
        self._inner.put(key, data)
        self._after_upload(key)

    def put_file(self, key: str, path: Path) -> None:
        self._before_upload(key)
        self._inner.put_file(key, path)
        self._after_upload(key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._before_upload(key)
        written = self._inner.put_if_absent(key, data)
        if written:
            self._after_upload(key)
        return written

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return self._inner.iter_chunks(key, chunk_size)

    def get_file(self, key: str, path: Path) -> None:
        self._inner.get_file(key, path)

    def exists(self, key: str) -> bool:
        return self._inner.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        return self._inner.list(prefix)

    def delete(self, key: str) -> None:
        self._inner.delete(key)

    def uri(self, key: str) -> str:
        return self._inner.uri(key)
