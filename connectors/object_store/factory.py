"""Pick and open an object store from a URL (the `--object-store` setting).

Accepted forms:
  /abs/dir, rel/dir, file:///abs/dir           -> LocalObjectStore (a directory)
  s3://BUCKET?endpoint=HOST:PORT[&secure=false][&region=R]
                                               -> S3ObjectStore (https unless secure=false)
  http://HOST:PORT/BUCKET, https://HOST:PORT/BUCKET
                                               -> S3ObjectStore (the scheme picks TLS)
S3 needs credentials, passed in (never in the URL, so URLs can be logged).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from orl.connectors.object_store.base import ObjectStore
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.connectors.object_store.s3_store import S3ObjectStore
from orl.schemas.errors import ConfigError

ACCEPTED_FORMS = (
    "/abs/dir, file:///abs/dir, s3://BUCKET?endpoint=HOST:PORT&secure=false, http://HOST:PORT/BUCKET"
)
_S3_QUERY_KEYS = frozenset({"endpoint", "secure", "region"})
_BOOLEANS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def open_object_store(
    url: str, *, access_key: str | None = None, secret_key: str | None = None
) -> ObjectStore:
    """The store a URL names; ConfigError (naming the accepted forms or the missing flag) if unusable."""
    if not url:
        raise ConfigError(f"empty object store URL; accepted forms: {ACCEPTED_FORMS}")
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return LocalObjectStore(_local_root(url))
    if parts.scheme == "s3":
        return _open_s3_bucket_url(url, access_key, secret_key)
    if parts.scheme in ("http", "https"):
        return _open_s3_http_url(url, access_key, secret_key)
    raise ConfigError(f"unsupported object store URL {url!r}; accepted forms: {ACCEPTED_FORMS}")


def _local_root(url: str) -> Path:
    parts = urlsplit(url)
    if parts.scheme == "":
        return Path(url)
    if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
        raise ConfigError(f"object store URL {url!r} must be file:///absolute/dir (no host)")
    return Path(unquote(parts.path))


def _open_s3_bucket_url(url: str, access_key: str | None, secret_key: str | None) -> S3ObjectStore:
    parts = urlsplit(url)
    query = _single_valued_query(url)
    bucket = parts.hostname or ""
    if not bucket or parts.path not in ("", "/") or "@" in parts.netloc or "endpoint" not in query:
        raise ConfigError(
            f"object store URL {url!r} must be s3://BUCKET?endpoint=HOST:PORT[&secure=false][&region=R]"
        )
    secure = _boolean(url, "secure", query.get("secure", "true"))
    return _s3_store(query["endpoint"], bucket, secure, query.get("region"), access_key, secret_key)


def _open_s3_http_url(url: str, access_key: str | None, secret_key: str | None) -> S3ObjectStore:
    parts = urlsplit(url)
    bucket = parts.path.strip("/")
    if not parts.hostname or "@" in parts.netloc or not bucket or "/" in bucket or parts.query:
        raise ConfigError(f"object store URL {url!r} must be http(s)://HOST:PORT/BUCKET")
    return _s3_store(parts.netloc, bucket, parts.scheme == "https", None, access_key, secret_key)


def _s3_store(
    endpoint: str,
    bucket: str,
    secure: bool,
    region: str | None,
    access_key: str | None,
    secret_key: str | None,
) -> S3ObjectStore:
    if not access_key:
        raise ConfigError(
            f"S3 bucket {bucket!r} needs an access key: set --s3-access-key or ORL_S3_ACCESS_KEY"
        )
    if not secret_key:
        raise ConfigError(
            f"S3 bucket {bucket!r} needs a secret key: set --s3-secret-key or ORL_S3_SECRET_KEY"
        )
    return S3ObjectStore(endpoint, access_key, secret_key, bucket, secure=secure, region=region)


def _single_valued_query(url: str) -> dict[str, str]:
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    unknown = sorted(set(query) - _S3_QUERY_KEYS)
    repeated = sorted(name for name, values in query.items() if len(values) > 1)
    if unknown or repeated:
        raise ConfigError(
            f"object store URL {url!r}: unknown or repeated parameters {unknown + repeated}; "
            f"accepted: {sorted(_S3_QUERY_KEYS)}"
        )
    return {name: values[0] for name, values in query.items()}


def _boolean(url: str, name: str, value: str) -> bool:
    if value.lower() not in _BOOLEANS:
        raise ConfigError(f"object store URL {url!r}: {name}={value!r} is not true or false")
    return _BOOLEANS[value.lower()]
