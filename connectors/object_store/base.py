"""The object-store port: checkpoints, manifests and archives live here under stable keys.

Two implementations: `local_store.LocalObjectStore` (a directory; temp file + rename) and
`s3_store.S3ObjectStore` (any S3 / MinIO through the minio SDK). Keys are '/'-separated, relative,
and never contain '..'. Calls are synchronous; async callers wrap them in `asyncio.to_thread`.
`check_key` is the one key rule both implementations enforce, so a key valid on one is valid on both.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from pathlib import Path

from orl.schemas.errors import OrlError


class ObjectStoreError(OrlError):
    """The store refused an operation (bad key, permission, corrupt transfer)."""


class ObjectNotFound(ObjectStoreError):
    """No object under that key."""


# Segments starting with this are reserved for a store's in-flight temp files (LocalObjectStore).
RESERVED_SEGMENT_PREFIX = ".orl-tmp-"


def check_key(key: str) -> str:
    """Return key if it is a valid object key, else raise ObjectStoreError naming it.

    Valid: non-empty, relative, '/'-separated segments that are non-empty and not '.' or '..', no
    backslash or control character, no segment starting with RESERVED_SEGMENT_PREFIX.
    """
    if not key:
        raise ObjectStoreError("invalid object key '': keys must be non-empty")
    if key.startswith("/") or "\\" in key or any(ord(ch) < 0x20 for ch in key):
        raise ObjectStoreError(
            f"invalid object key {key!r}: keys are relative, with no backslash or control character"
        )
    for segment in key.split("/"):
        if segment in ("", ".", "..") or segment.startswith(RESERVED_SEGMENT_PREFIX):
            raise ObjectStoreError(
                f"invalid object key {key!r}: segment {segment!r} is empty, '.', '..' or reserved"
            )
    return key


def check_prefix(prefix: str) -> str:
    """Return prefix if every key it could match is valid up to its last '/', else ObjectStoreError."""
    if prefix:
        check_key(prefix + "x")  # the last segment may be partial, so complete it before checking
    return prefix


class ObjectStore(abc.ABC):
    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write an object atomically: readers see the old object or the whole new one, never a part."""

    @abc.abstractmethod
    def put_file(self, key: str, path: Path) -> None:
        """Upload a (possibly large) local file atomically, streaming it."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create the object only if no object has that key; True if this call created it."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object; ObjectNotFound if absent."""

    @abc.abstractmethod
    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Stream an object in chunks; ObjectNotFound (raised by the first next()) if absent.

        Nothing is opened before the first next(), and closing or dropping the iterator releases
        the file or connection.
        """

    def get_file(self, key: str, path: Path) -> None:
        """Download an object to a local file (written to a temp name, then renamed)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        try:
            with tmp.open("wb") as out:
                for chunk in self.iter_chunks(key):
                    out.write(chunk)
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)  # a no-op after the rename; removes the partial file on error

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys that start with prefix, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; absent objects are not an error."""

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """A URI naming the object, for events and logs (file:///... or s3://bucket/key)."""
