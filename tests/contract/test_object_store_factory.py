"""open_object_store: which URL opens which store, and the errors that name what to fix."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from orl.connectors.object_store.factory import open_object_store
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.connectors.object_store.s3_store import S3ObjectStore
from orl.schemas.errors import ConfigError

from tests.fixtures.s3_server import S3Server


def test_file_url_and_plain_path_open_a_local_store(tmp_path: Path) -> None:
    by_url = open_object_store((tmp_path / "a b").as_uri())
    by_path = open_object_store(str(tmp_path / "a b"))
    assert isinstance(by_url, LocalObjectStore) and isinstance(by_path, LocalObjectStore)
    by_url.put("k", b"v")
    assert by_path.get("k") == b"v"


@pytest.mark.s3
def test_s3_and_http_urls_open_the_same_bucket(s3_server: S3Server) -> None:
    bucket = f"orl-test-{uuid.uuid4().hex[:16]}"
    keys = {"access_key": s3_server.access_key, "secret_key": s3_server.secret_key}
    by_s3 = open_object_store(f"s3://{bucket}?endpoint={s3_server.endpoint}&secure=false", **keys)
    by_http = open_object_store(f"http://{s3_server.endpoint}/{bucket}", **keys)
    assert isinstance(by_s3, S3ObjectStore) and isinstance(by_http, S3ObjectStore)
    by_s3.put("k", b"v")
    assert by_http.get("k") == b"v"
    assert by_http.uri("k") == f"s3://{bucket}/k"


@pytest.mark.parametrize(
    ("access_key", "secret_key", "named"),
    [(None, "s", "--s3-access-key"), ("", "s", "ORL_S3_ACCESS_KEY"), ("a", None, "--s3-secret-key")],
)
def test_s3_without_credentials_names_the_setting(
    access_key: str | None, secret_key: str | None, named: str
) -> None:
    with pytest.raises(ConfigError, match=named):
        open_object_store("http://127.0.0.1:1/bucket", access_key=access_key, secret_key=secret_key)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "ftp://host/bucket",
        "s3://bucket",
        "s3://bucket/prefix?endpoint=h:1",
        "s3://bucket?endpoint=h:1&colour=red",
        "s3://bucket?endpoint=h:1&secure=maybe",
        "http://host:9000/",
        "http://host:9000/bucket/extra",
        "http://user:pw@host:9000/bucket",
        "file://otherhost/dir",
        "http://host:9000/Bad_Bucket!",
    ],
)
def test_bad_urls_raise_config_error(url: str) -> None:
    with pytest.raises(ConfigError):
        open_object_store(url, access_key="a", secret_key="s")


def test_a_minio_whose_private_put_changed_is_refused_at_start_with_the_pin() -> None:
    from minio import Minio
    from orl.connectors.object_store.s3_store import check_minio_internals

    check_minio_internals(Minio)  # the installed, pinned minio fits

    class RenamedParameters(Minio):
        def _put_object(self, bucket: str, name: str, body: bytes, headers: dict | None = None) -> None:  # type: ignore[override]
            raise AssertionError("never called")

    class NoPrivatePut:
        pass

    for changed in (RenamedParameters, NoPrivatePut):
        with pytest.raises(ConfigError, match=r"minio>=7.2,<7.3"):
            check_minio_internals(changed)
