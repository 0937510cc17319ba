"""The Kafka log on three brokers (three controllers): durable topics, and a broker killed mid-write.

Runs on this module's own three-node cluster (`kafka_cluster`): orl's topics get 3 replicas and
min.insync.replicas 2, so an acknowledged append is on two brokers at least. While appends go on,
one broker after another is killed with SIGKILL and started again in place: every append the log
acknowledged is there afterwards, exactly once (the idempotent producer's retries are not copies).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from orl.connectors.event_log.base import OutgoingRecord, TopicSpec
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.reading import read_to_end
from orl.schemas.errors import OrlError

from tests.contract.test_event_log_kafka import topic_configs
from tests.fixtures.kafka_broker import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(400)]

# A kill -9 is seen once the controller fences the broker (broker.session.timeout.ms, 9 s by
# default), then the producer refreshes its metadata: well within this on a loaded 2-core machine.
PROGRESS_TIMEOUT_S = 60.0


async def test_topics_have_three_replicas_and_min_isr_two_and_no_power_cut_warning(
    kafka_cluster: KafkaCluster,
) -> None:
    topic = f"durable-{uuid.uuid4().hex[:12]}"
    async with KafkaEventLog(kafka_cluster.bootstrap) as log:
        assert await log.brokers() == 3
        await log.create_topics([TopicSpec(topic, 2)])
        assert await log.power_cut_warning(topic) is None
    configs = await topic_configs(kafka_cluster.bootstrap, topic)
    assert configs["min.insync.replicas"] == "2"
    assert configs["unclean.leader.election.enable"] == "false"


async def test_every_acknowledged_append_survives_kill_9_of_each_broker_in_turn_exactly_once(
    kafka_cluster: KafkaCluster,
) -> None:
    topic = f"failover-{uuid.uuid4().hex[:12]}"
    acknowledged: list[bytes] = []
    failed = 0
    stop = asyncio.Event()
    async with KafkaEventLog(kafka_cluster.bootstrap) as log:
        await log.create_topics([TopicSpec(topic, 3)])

        async def write() -> None:
            nonlocal failed
            n = 0
            while not stop.is_set():
                batch = [OutgoingRecord(f"r{n + i}".encode(), f"s{(n + i) % 7}".encode()) for i in range(20)]
                try:
                    await log.append_batch(topic, batch)
                    acknowledged.extend(r.value for r in batch)
                except OrlError:  # not acknowledged: the writer moves on (these may or may not be there)
                    failed += 1
                n += 20
                await asyncio.sleep(0.01)

        async def more_acknowledged(what: str) -> None:
            """Until the writer has an append acknowledged past this point; fail after PROGRESS_TIMEOUT_S."""
            before = len(acknowledged)
            deadline = asyncio.get_running_loop().time() + PROGRESS_TIMEOUT_S
            while len(acknowledged) == before:
                assert asyncio.get_running_loop().time() < deadline, (
                    f"no append was acknowledged {what} within {PROGRESS_TIMEOUT_S} s ({failed} batches failed)"
                )
                await asyncio.sleep(0.1)

        writer = asyncio.create_task(write())
        await more_acknowledged("before the first kill")
        for node in (1, 2, 3):
            await asyncio.to_thread(kafka_cluster.node(node).kill)
            # two replicas of three are enough for min.insync.replicas 2: appends go on once the
            # controller has moved the dead broker's leaderships
            await more_acknowledged(f"while broker {node} was down")
            await asyncio.to_thread(kafka_cluster.start_again, node)
            await more_acknowledged(f"after broker {node} came back")
        await asyncio.sleep(1.0)
        stop.set()
        await writer
        values = [r.value for r in await read_to_end(log, topic)]
    assert len(acknowledged) > 100
    missing = set(acknowledged) - set(values)
    assert not missing, f"{len(missing)} acknowledged records lost ({failed} batches failed)"
    copies = len(values) - len(set(values))
    assert copies == 0, f"{copies} records appended twice"
