"""Kafka-only guarantees of the event log: a broker that is down is reported, never waited on forever."""

from __future__ import annotations

import time

import pytest

from connectors.event_log.kafka_log import KafkaEventLog
from schemas.errors import ServiceUnavailable
from tests.fixtures.kafka_broker import free_port


async def test_start_without_a_broker_raises_service_unavailable_within_the_bound() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    log = KafkaEventLog(address, connect_timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=address):
        await log.start()
    assert time.monotonic() - started < 4.0


def test_default_connect_bound_is_at_most_15_s() -> None:
    assert KafkaEventLog("127.0.0.1:9092").connect_timeout_s <= 15.0
