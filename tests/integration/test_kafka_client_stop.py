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
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer
from orl.connectors.event_log.base import OutgoingRecord, TopicSpec
from orl.connectors.event_log.kafka_log import KafkaEventLog, stop_client

from tests.fixtures.kafka_broker import KafkaCluster, start_kafka_cluster

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]
TRIES = 3  # plain aiokafka let the cancel out 5 times of 5 (2026-12-02)


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One broker of this module's own: its tests kill it."""
    started = start_kafka_cluster(tmp_path_factory.mktemp("client-stop"))
    yield started
    started.stop()


async def test_stop_client_never_cancels_its_caller_while_the_broker_is_away(cluster: KafkaCluster) -> None:
    assert await stray_cancels(cluster, stop_client) == 0


async def test_a_cancel_of_the_caller_still_cancels_the_stop(cluster: KafkaCluster) -> None:
    (node,) = cluster.nodes
    consumer = await fetching_consumer(cluster, "cancelled")
    node.kill()
    try:
        task = asyncio.create_task(stop_client(consumer))
        await asyncio.sleep(0)  # the stop has begun
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        node.start()
        await asyncio.to_thread(cluster.wait_ready)
