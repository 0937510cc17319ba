"""TEST ONLY: make the trainer SIGKILL itself at a named point of a step (the crash tests' scalpel).

Points (the `fault_after` setting; `fault_version` picks the step by the version it produces, 0 the
first step this process runs):
- after_step: the optimizer stepped, nothing uploaded yet;
- mid_upload: some checkpoint files uploaded, the manifest not written;
- after_manifest: the manifest written, TrainStepCompleted / CheckpointPublished not appended.
SIGKILL, not an exception: no `finally`, no flush, no goodbye, exactly like `kill -9`. Reads and
writes nothing else. With `fault_after` empty (the default) nothing here ever fires.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from connectors.checkpoint_store import MANIFEST_NAME
from connectors.object_store.base import ObjectStore

log = logging.getLogger(__name__)


class FaultPlan:
    def __init__(self, point: str, version: int) -> None:
        self.point = point
        self.version = version  # 0: the first step of this process
        self._armed_version: int | None = None

    def arm(self, version: int) -> None:
        """Called at the start of the step that will produce `version`."""
        if self.point and self._armed_version is None and self.version in (0, version):
            self._armed_version = version

    def hit(self, point: str, version: int) -> None:
        if self.point == point and self._armed_version == version:
            log.warning("fault injection: SIGKILL %s of version %d", point, version)
            logging.shutdown()
            os.kill(os.getpid(), signal.SIGKILL)

    def wrap(self, store: ObjectStore, version: int) -> ObjectStore:
        """The store to publish through: kills after the first file upload when mid_upload is armed."""
        if self.point != "mid_upload" or self._armed_version != version:
            return store
        return _KillAfterFirstUpload(store, lambda: self.hit("mid_upload", version))


class _KillAfterFirstUpload(ObjectStore):
    """Delegates to a store; the second upload (or the manifest, with one file) never happens."""

    def __init__(self, inner: ObjectStore, kill: Callable[[], None]) -> None:
        self._inner = inner
        self._kill = kill
        self._uploads = 0

    def _before_upload(self, key: str) -> None:
        if self._uploads >= 1 or key.endswith("/" + MANIFEST_NAME):
            self._kill()
        self._uploads += 1

    def put(self, key: str, data: bytes) -> None:
        self._before_upload(key)
        self._inner.put(key, data)

    def put_file(self, key: str, path: Path) -> None:
        self._before_upload(key)
        self._inner.put_file(key, path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._before_upload(key)
        return self._inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        return self._inner.iter_chunks(key, chunk_size)

    def exists(self, key: str) -> bool:
        return self._inner.exists(key)

    def list(self, prefix: str = "") -> list[str]:
        return self._inner.list(prefix)

    def delete(self, key: str) -> None:
        self._inner.delete(key)

    def uri(self, key: str) -> str:
        return self._inner.uri(key)
