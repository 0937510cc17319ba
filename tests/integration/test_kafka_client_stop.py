"""Stopping a Kafka client while its broker is away ends the stop, never the caller's task.

aiokafka's consumer cancels the fetch tasks it has in flight when it stops and awaits them, so their
CancelledError comes out of `stop()` when those tasks were retrying against a dead broker
(aio-libs/aiokafka#647). In `orl up` that ended a pipeline stage's task as if it had been cancelled:
the stage stopped reading while its process lived on (the broker restart fault test, on a slow
machine). `stop_client` turns that stray cancel into a warning; these tests kill a real broker under
a consumer that is fetching, and stop it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from orl.connectors.event_log.base import OutgoingRecord, TopicSpec
from orl.connectors.event_log.kafka_log import KafkaEventLog, stop_client

from tests.fixtures.kafka_broker import KafkaCluster, start_kafka_cluster

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]
TRIES = 5


async def fetching_consumer(cluster: KafkaCluster, topic: str) -> AIOKafkaConsumer:
    """A started consumer that has read `topic` and goes on fetching it."""
    async with KafkaEventLog(cluster.bootstrap) as log:
        await log.create_topics([TopicSpec(topic, 1)])
        await log.append(topic, OutgoingRecord(value=b"one"))
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=cluster.bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    assert await consumer.getmany(timeout_ms=10_000)
    return consumer


async def stray_cancels(cluster: KafkaCluster, stop: object) -> int:
    """How many of TRIES stops of a fetching consumer, the broker killed under it, let a
    CancelledError out into the task that called them."""
    (node,) = cluster.nodes
    leaked = 0
    for attempt in range(TRIES):
        consumer = await fetching_consumer(cluster, f"stop-{id(stop)}-{attempt}")
        node.kill()
        await asyncio.sleep(2)  # its fetches fail and retry, with backoff sleeps in flight
        task = asyncio.create_task(stop(consumer))  # type: ignore[operator]
        try:
            await task
        except asyncio.CancelledError:
            leaked += 1
        node.start()
        await asyncio.to_thread(cluster.wait_ready)
    return leaked


async def test_stop_client_never_cancels_its_caller_while_the_broker_is_away(tmp_path: Path) -> None:
    cluster = start_kafka_cluster(tmp_path / "kafka")
    try:
        assert await stray_cancels(cluster, stop_client) == 0
    finally:
        cluster.stop()


async def test_a_cancel_of_the_caller_still_cancels_the_stop(tmp_path: Path) -> None:
    cluster = start_kafka_cluster(tmp_path / "kafka")
    (node,) = cluster.nodes
    try:
        consumer = await fetching_consumer(cluster, "cancelled")
        node.kill()
        task = asyncio.create_task(stop_client(consumer))
        await asyncio.sleep(0)  # the stop has begun
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        node.start()
        cluster.stop()
