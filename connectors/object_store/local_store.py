"""The embedded object store: a local directory with the same key layout as S3.

Key `a/b/c` is the file `<root>/a/b/c`. Every write goes to a temp file in the target's directory
(named with `base.RESERVED_SEGMENT_PREFIX`, so no key can collide with it and `list` skips it), is
fsynced, then renamed over the target (`put`) or hard-linked to it (`put_if_absent`, which fails
atomically if the target exists), and the directory is fsynced. Readers therefore see the old
object or the whole new one, never a part, even if the writer is killed. A key cannot also be a
directory of other keys here (S3 allows `a` and `a/b` together; this store refuses the second).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from orl.connectors.object_store.base import (
    RESERVED_SEGMENT_PREFIX,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    check_key,
    check_prefix,
)

_COPY_BUFFER_BYTES = 1 << 20


class LocalObjectStore(ObjectStore):
    """Objects as files under `root` (created if missing)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ObjectStoreError(f"cannot create object store directory {self.root}: {exc}") from exc

    def put(self, key: str, data: bytes) -> None:
        target = self._path(key)
        tmp = self._write_temp(key, target, lambda out: out.write(data))
        self._publish(key, tmp, target, overwrite=True)

    def put_file(self, key: str, path: Path) -> None:
        target = self._path(key)
        try:
            with Path(path).open("rb") as source:
                tmp = self._write_temp(
                    key, target, lambda out: shutil.copyfileobj(source, out, _COPY_BUFFER_BYTES)
                )
        except OSError as exc:  # only opening the source can raise it: _write_temp translates its own
            raise ObjectStoreError(f"cannot read {path} to upload as {key!r}: {exc}") from exc
        self._publish(key, tmp, target, overwrite=True)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        target = self._path(key)
        if target.is_file():  # cheap early exit; the link below is what decides
            return False
        tmp = self._write_temp(key, target, lambda out: out.write(data))
        return self._publish(key, tmp, target, overwrite=False)

    def get(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key))

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        target = self._path(key)
        try:
            stream = target.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise ObjectNotFound(f"no object {key!r} in {self.root}") from exc
        except OSError as exc:
            raise ObjectStoreError(f"cannot read object {key!r} ({target}): {exc}") from exc
        with stream:
            while chunk := stream.read(chunk_size):
                yield chunk

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        start = self.root / prefix.rpartition("/")[0]
        keys = []
        for dirpath, _dirnames, filenames in os.walk(start):
            relative_dir = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if name.startswith(RESERVED_SEGMENT_PREFIX):
                    continue
                key = name if relative_dir == "." else f"{relative_dir}/{name}"
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        target = self._path(key)
        try:
            target.unlink(missing_ok=True)
        except IsADirectoryError:
            return  # a directory of other keys, not an object: nothing to delete
        except OSError as exc:
            raise ObjectStoreError(f"cannot delete object {key!r} ({target}): {exc}") from exc
        _fsync_dir(target.parent)

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _write_temp(self, key: str, target: Path, write: Callable[[BinaryIO], object]) -> Path:
        """Write a complete, fsynced temp file next to target; the caller publishes or it is removed."""
        tmp = target.parent / f"{RESERVED_SEGMENT_PREFIX}{secrets.token_hex(8)}-{target.name}"
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("xb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
        except OSError as exc:
            _remove_quietly(tmp)
            raise ObjectStoreError(f"cannot write object {key!r} ({target}): {exc}") from exc
        return tmp

    def _publish(self, key: str, tmp: Path, target: Path, *, overwrite: bool) -> bool:
        """Make tmp visible as target (rename, or link if not overwriting); False if target existed."""
        try:
            if overwrite:
                os.replace(tmp, target)
            else:
                os.link(tmp, target)
        except FileExistsError:
            if target.is_dir():
                raise ObjectStoreError(
                    f"cannot write object {key!r}: {target} is a directory of keys"
                ) from None
            return False
        except OSError as exc:
            raise ObjectStoreError(f"cannot write object {key!r} ({target}): {exc}") from exc
        finally:
            _remove_quietly(tmp)  # after a rename there is nothing left to remove
        _fsync_dir(target.parent)
        return True


def _remove_quietly(path: Path) -> None:
    """Best-effort removal of a temp file; one left behind is invisible to readers and to list."""
    with contextlib.suppress(OSError):
        path.unlink()


def _fsync_dir(directory: Path) -> None:
    """Persist a rename or unlink in directory (POSIX needs the directory itself fsynced)."""
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
