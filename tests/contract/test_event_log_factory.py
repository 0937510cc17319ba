"""`open_event_log` maps URLs onto implementations and names the URL when it cannot."""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.schemas.errors import ConfigError


def test_sqlite_absolute_and_relative_paths() -> None:
    absolute = open_event_log("sqlite:///var/lib/orl/log.db")
    relative = open_event_log("sqlite:data/log.db", session_timeout_s=6.0)
    assert isinstance(absolute, SqliteEventLog) and absolute.path == Path("/var/lib/orl/log.db")
    assert isinstance(relative, SqliteEventLog) and relative.path == Path("data/log.db")
    assert relative.session_timeout_s == 6.0


def test_kafka_bootstrap_servers() -> None:
    log = open_event_log("kafka://k1:9092,k2:9093", client_id="trainer")
    assert isinstance(log, KafkaEventLog)
    assert (log.bootstrap_servers, log.client_id) == ("k1:9092,k2:9093", "trainer")


@pytest.mark.parametrize(
    "url",
    [
        "postgres://db/orl",
        "sqlite://host/log.db",
        "sqlite:",
        "sqlite:///",
        "kafka://",
        "kafka://k1",
        "kafka://k1:x",
        "log.db",
    ],
)
def test_bad_urls_name_the_url_and_the_accepted_forms(url: str) -> None:
    with pytest.raises(ConfigError) as raised:
        open_event_log(url)
    assert repr(url) in str(raised.value)
    assert "sqlite:///abs/path.db" in str(raised.value) and "kafka://host:port" in str(raised.value)
