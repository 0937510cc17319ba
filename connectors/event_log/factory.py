"""Pick the event-log implementation from a URL; reads and writes nothing itself.

sqlite:///abs/path.db        SqliteEventLog on an absolute path
sqlite:relative/path.db      SqliteEventLog on a path relative to the working directory
kafka://host:port[,host:port] KafkaEventLog with those bootstrap servers
"""

from __future__ import annotations

from typing import Any

from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.event_log.topic_policy import DEFAULT_POLICY, TopicPolicy
from orl.schemas.errors import ConfigError

ACCEPTED_FORMS = "sqlite:///abs/path.db, sqlite:relative/path.db or kafka://host:port[,host:port...]"


def _bad_url(url: str, why: str) -> ConfigError:
    return ConfigError(f"event log URL {url!r} {why}; accepted forms: {ACCEPTED_FORMS}")


def _sqlite_path(url: str) -> str:
    rest = url.removeprefix("sqlite:")
    if rest.startswith("//"):
        if not rest.startswith("///"):
            raise _bad_url(url, "names a host (SQLite takes a local file)")
        rest = rest[2:]  # keep the leading '/' of the absolute path
    if not rest or rest.endswith("/") or rest == ":memory:":
        raise _bad_url(url, "names no database file")
    return rest


def _kafka_bootstrap(url: str) -> str:
    servers = url.removeprefix("kafka://").split(",")
    for server in servers:
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise _bad_url(url, f"has {server!r}, not host:port")
    return ",".join(servers)


def open_event_log(
    url: str, policy: TopicPolicy = DEFAULT_POLICY, *, client_id: str = "orl", **options: Any
) -> EventLog:
    """A new, not yet started event log for `url` under `policy` (topics it creates, largest record it
    appends: `ConnectionSettings.topic_policy()`); `options` go to the implementation's constructor.
    `client_id` names the component to a Kafka broker (its request logs and quotas go by it, e.g.
    "orl-serve"); the embedded log has no use for it."""
    if url.startswith("sqlite:"):
        return SqliteEventLog(_sqlite_path(url), policy=policy, **options)
    if url.startswith("kafka://"):
        return KafkaEventLog(_kafka_bootstrap(url), policy=policy, client_id=client_id, **options)
    raise _bad_url(url, "has an unknown scheme")
