"""The scale-out object store: one bucket of any S3 server (MinIO, SeaweedFS, AWS) through the minio SDK.

Keys map one to one onto object names in `bucket`. A single PUT or a completed multipart upload is
atomic in S3, so readers never see part of an object. `put_if_absent` is a conditional PUT
(`If-None-Match: *`, answered 412 when the key exists; verified against SeaweedFS, including a race
of 8 writers); a server that ignores that header would silently overwrite. Network failures surface quickly as
ServiceUnavailable: short timeouts and a small, bounded number of retries (connect errors always,
read errors and 5xx only for GET/HEAD/DELETE, never for a PUT whose outcome would be unknown). An
S3 error that says the server is in trouble for now (InternalError, SlowDown, ...) is
ServiceUnavailable too, so callers that wait out an outage wait it out.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
import io
import os
from collections.abc import Iterator
from pathlib import Path

import certifi
import urllib3
from minio import Minio
from minio.error import InvalidResponseError, MinioException, S3Error, ServerError
from minio.helpers import check_bucket_name
from orl.connectors.object_store.base import (
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    check_key,
    check_prefix,
)
from orl.schemas.errors import ConfigError, ServiceUnavailable
from urllib3.exceptions import HTTPError, MaxRetryError

_CREDENTIAL_ERRORS = frozenset(
    {"SignatureDoesNotMatch", "InvalidAccessKeyId", "AccessDenied", "InvalidToken", "ExpiredToken"}
)
_NOT_FOUND_ERRORS = frozenset({"NoSuchKey", "ResourceNotFound"})
_BUCKET_EXISTS_ERRORS = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})
# The server's own trouble, gone on a retry (a server still starting answers InternalError): unreachable
_TRANSIENT_ERRORS = frozenset({"InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout"})


# put_if_absent calls minio's private single-PUT `Minio._put_object` (the public put_object would turn
# If-None-Match into an x-amz-meta header): pinned below 7.3 in pyproject.toml and checked at start.
_PRIVATE_PUT_PARAMETERS = ("bucket_name", "object_name", "data", "headers")


def check_minio_internals(client_class: type = Minio) -> None:
    """ConfigError unless minio's private `_put_object` takes the parameters put_if_absent passes."""
    method = getattr(client_class, "_put_object", None)
    found = list(inspect.signature(method).parameters)[1:] if callable(method) else None
    if found is None or list(_PRIVATE_PUT_PARAMETERS) != found[: len(_PRIVATE_PUT_PARAMETERS)]:
        raise ConfigError(
            f"minio {importlib.metadata.version('minio')} changed the private Minio._put_object that orl's "
            f"conditional put uses (parameters {found}, expected {list(_PRIVATE_PUT_PARAMETERS)} first): "
            "pip install 'minio>=7.2,<7.3'"
        )


class S3ObjectStore(ObjectStore):
    """Objects in one S3 bucket; `endpoint` is "host:port" (no scheme; `secure` picks https)."""

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        secure: bool = False,
        region: str | None = None,
        create_bucket: bool = True,
        *,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 20.0,
        retries: int = 2,
    ) -> None:
        check_minio_internals()
        try:
            check_bucket_name(bucket, strict=True)
        except ValueError as exc:
            raise ConfigError(f"invalid S3 bucket name {bucket!r}: {exc}") from exc
        self.endpoint = endpoint
        self.bucket = bucket
        self._address = f"{'https' if secure else 'http'}://{endpoint}"
        self._access_key = access_key
        http = _http_client(secure, connect_timeout_s, read_timeout_s, retries)
        try:
            self._client = Minio(
                endpoint,
                access_key=access_key,
                secret_key=secret_key,
                secure=secure,
                region=region,
                http_client=http,
            )
        except ValueError as exc:
            raise ConfigError(f"invalid S3 endpoint {endpoint!r} (expected host:port): {exc}") from exc
        if create_bucket:
            self._ensure_bucket()

    def put(self, key: str, data: bytes) -> None:
        with self._translating(key):
            self._client.put_object(self.bucket, check_key(key), io.BytesIO(data), len(data))

    def put_file(self, key: str, path: Path) -> None:
        check_key(key)
        try:
            # minio reads the stream part by part (multipart above its part size), never all at once.
            with Path(path).open("rb") as source, self._translating(key):
                size = os.fstat(source.fileno()).st_size
                self._client.put_object(self.bucket, key, source, size)
        except OSError as exc:  # reading the local file; network errors arrive translated
            raise ObjectStoreError(f"cannot read {path} to upload as {key!r}: {exc}") from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        check_key(key)
        with self._translating(key):
            try:
                # The public put_object turns extra headers into x-amz-meta-*; the single-PUT call
                # sends them as they are. One PUT, so data is limited to S3's 5 GiB.
                self._client._put_object(
                    self.bucket,
                    key,
                    data,
                    headers={"If-None-Match": "*", "Content-Type": "application/octet-stream"},
                )
            except S3Error as exc:
                if exc.code == "PreconditionFailed":
                    return False
                raise
        return True

    def get(self, key: str) -> bytes:
        return b"".join(self.iter_chunks(key))

    def iter_chunks(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        check_key(key)
        with self._translating(key):
            response = self._client.get_object(self.bucket, key)
            try:
                yield from response.stream(chunk_size)
            finally:
                response.close()
                response.release_conn()

    def exists(self, key: str) -> bool:
        check_key(key)
        try:
            with self._translating(key):
                self._client.stat_object(self.bucket, key)
        except ObjectNotFound:
            return False
        return True

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        with self._translating(prefix or "<all keys>"):
            names = [
                obj.object_name
                for obj in self._client.list_objects(self.bucket, prefix=prefix, recursive=True)
                if obj.object_name is not None
            ]
        return sorted(names)

    def delete(self, key: str) -> None:
        check_key(key)
        with self._translating(key):
            self._client.remove_object(self.bucket, key)  # S3 answers 204 for absent keys too

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{check_key(key)}"

    def _ensure_bucket(self) -> None:
        with self._translating(f"bucket {self.bucket}"):
            if self._client.bucket_exists(self.bucket):
                return
            try:
                self._client.make_bucket(self.bucket)
            except S3Error as exc:
                if exc.code not in _BUCKET_EXISTS_ERRORS:
                    raise  # anything but losing a creation race to another process

    @contextlib.contextmanager
    def _translating(self, what: str) -> Iterator[None]:
        """Turn minio / urllib3 failures into ObjectNotFound, ObjectStoreError or ServiceUnavailable."""
        try:
            yield
        except S3Error as exc:
            raise self._s3_error(what, exc) from exc
        except (MaxRetryError, HTTPError, ServerError) as exc:
            reason = exc.reason if isinstance(exc, MaxRetryError) else exc
            raise ServiceUnavailable(f"S3 endpoint {self._address} unreachable: {reason}") from exc
        except InvalidResponseError as exc:
            raise ObjectStoreError(
                f"{self._address} did not answer like an S3 server ({what!r}): {exc}"
            ) from exc
        except ValueError as exc:  # minio's own argument checks (bucket or object name)
            raise ObjectStoreError(f"S3 rejected {what!r} in bucket {self.bucket!r}: {exc}") from exc
        except MinioException as exc:
            raise ObjectStoreError(f"S3 operation on {what!r} failed: {exc}") from exc

    def _s3_error(self, what: str, exc: S3Error) -> ObjectStoreError | ServiceUnavailable:
        if exc.code in _TRANSIENT_ERRORS:
            return ServiceUnavailable(
                f"S3 at {self._address} could not serve {what!r} for now ({exc.code}: {exc.message})"
            )
        if exc.code in _NOT_FOUND_ERRORS:
            return ObjectNotFound(f"no object {what!r} in s3://{self.bucket} at {self._address}")
        if exc.code in _CREDENTIAL_ERRORS:
            return ObjectStoreError(
                f"S3 at {self._address} rejected the credentials of access key {self._access_key!r} "
                f"({exc.code}): check the access key and secret key"
            )
        if exc.code == "NoSuchBucket":
            return ObjectStoreError(f"bucket {self.bucket!r} does not exist at {self._address}")
        return ObjectStoreError(f"S3 at {self._address} refused {what!r}: {exc.code}: {exc.message}")


def _http_client(
    secure: bool, connect_timeout_s: float, read_timeout_s: float, retries: int
) -> urllib3.PoolManager:
    """A pool whose worst case on a dead endpoint is about (retries + 1) * connect_timeout_s."""
    retry = urllib3.Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        backoff_factor=0.2,
        status_forcelist=(500, 502, 503, 504),
        allowed_methods=frozenset({"GET", "HEAD", "DELETE"}),
    )
    return urllib3.PoolManager(
        timeout=urllib3.Timeout(connect=connect_timeout_s, read=read_timeout_s),
        retries=retry,
        maxsize=10,
        cert_reqs="CERT_REQUIRED" if secure else "CERT_NONE",
        ca_certs=certifi.where() if secure else None,
    )
