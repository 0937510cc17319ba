"""A record the log refuses for good never blocks the server's spool (issue 42), on both logs.

A real spool file drains into a real log (the SQLite file, or the Kafka test broker) under a 4 KiB
record limit: the event over it is set aside with its reason, counted in the metrics and listed by
`orl spool`; the events before and after it reach the log in order, in the same drain.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from orl.connectors.event_log.base import EventLog, TopicSpec
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.event_log.topic_policy import TopicPolicy
from orl.connectors.metrics import Metrics
from orl.serving.spool import EventSpool, SpoolDrainer

from orl.cli import main as orl_main

pytestmark = pytest.mark.timeout(120)
LIMIT = TopicPolicy(max_record_bytes=4096)


@pytest.fixture(params=["sqlite", pytest.param("kafka", marks=pytest.mark.kafka)])
async def event_log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EventLog]:
    if request.param == "sqlite":
        log: EventLog = SqliteEventLog(tmp_path / "log.db", policy=LIMIT)
    else:
        log = KafkaEventLog(request.getfixturevalue("kafka_bootstrap"), policy=LIMIT)
    async with log:
        yield log


async def test_a_refused_event_is_set_aside_counted_and_listed_and_the_rest_drain_at_once(
    event_log: EventLog, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"limit-{uuid.uuid4().hex[:12]}.requests"
    await event_log.create_topics([TopicSpec(topic)])
    spool = EventSpool(tmp_path / "spool-s1.db")
    metrics = Metrics()
    drainer = SpoolDrainer(spool, event_log, metrics=metrics)
    for value in (b"before", b"x" * 5000, b"after"):
        spool.put(topic, b"session", value)
    task = asyncio.create_task(drainer.run())
    try:
        await drainer.flush(30.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert drainer.failures == 0  # no retry, no backoff: the drain that met the event moved the rest
    assert [r.value for r in await read_to_end(event_log, topic)] == [b"before", b"after"]
    (aside,) = spool.set_aside_events()
    assert (aside.seq, aside.topic, len(aside.value)) == (2, topic, 5000)
    assert "record of 5000 bytes exceeds --max-record-bytes 4096" in aside.reason
    assert f'orl_spool_set_aside_total{{topic="{topic}"}} 1.0' in metrics.exposition().decode()
    spool.close()

    assert orl_main(["spool", "--data-dir", str(tmp_path)]) == 0
    listed = capsys.readouterr().out
    assert "0 event(s) waiting for the log, 1 set aside" in listed
    assert f"#2 {topic} 5000 bytes" in listed and "exceeds --max-record-bytes 4096" in listed
