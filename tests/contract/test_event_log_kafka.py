"""Kafka-only guarantees of the event log: a broker that is down is reported, never waited on forever;
topics are created as a durable deployment needs them; a record the broker refuses is reported as such.

Runs on the session's test broker (one node, or your own with ORL_TEST_KAFKA): topics get
min(3, brokers) replicas. The three-broker case is tests/integration/test_kafka_cluster.py.
"""

from __future__ import annotations

import time
import uuid

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from orl.connectors.event_log.base import OutgoingRecord, RecordRefused, TopicSpec
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.event_log.topic_policy import TopicPolicy
from orl.schemas.errors import ServiceUnavailable

from tests.fixtures.kafka_broker import free_port


async def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    """The broker's own view of a topic's configs."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    (resource,) = response.resources
    return {name: value for name, value, *_ in resource[4]}


async def test_start_without_a_broker_raises_service_unavailable_within_the_bound() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    log = KafkaEventLog(address, connect_timeout_s=2.0)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=address):
        await log.start()
    assert time.monotonic() - started < 4.0


def test_default_connect_bound_is_at_most_15_s() -> None:
    assert KafkaEventLog("127.0.0.1:9092").connect_timeout_s <= 15.0


@pytest.mark.kafka
async def test_topics_get_the_policys_replicas_min_isr_and_record_limit(kafka_bootstrap: str) -> None:
    topic = f"policy-{uuid.uuid4().hex[:12]}"
    policy = TopicPolicy(max_record_bytes=200_000)
    async with KafkaEventLog(kafka_bootstrap, policy=policy) as log:
        brokers = await log.brokers()
        await log.create_topics([TopicSpec(topic, 2, (("retention.ms", "3600000"),))])
        configs = await topic_configs(kafka_bootstrap, topic)
        warning = await log.power_cut_warning(topic)
    replicas = min(3, brokers)
    assert configs["min.insync.replicas"] == ("2" if replicas == 3 else "1")
    assert configs["unclean.leader.election.enable"] == "false"
    assert configs["max.message.bytes"] == str(policy.max_message_bytes)
    assert configs["retention.ms"] == "3600000"  # the topic's own config on top of the policy's
    assert (warning is None) == (replicas >= 2)


@pytest.mark.kafka
async def test_a_topic_made_with_a_smaller_limit_refuses_larger_records_before_they_are_sent(
    kafka_bootstrap: str,
) -> None:
    topic = f"small-{uuid.uuid4().hex[:12]}"
    async with KafkaEventLog(kafka_bootstrap, policy=TopicPolicy(max_record_bytes=1024)) as small:
        await small.create_topics([TopicSpec(topic)])  # max.message.bytes = 1024 + 16 KiB
    async with KafkaEventLog(kafka_bootstrap) as log:  # this log's own limit is 1 MiB
        assert await log.record_limit(topic) == 1024
        batch = [OutgoingRecord(b"a", b"k"), OutgoingRecord(b"x" * 2000, b"k"), OutgoingRecord(b"b", b"k")]
        with pytest.raises(RecordRefused, match=r"2000 bytes exceeds the 1024-byte limit") as refused:
            await log.append_batch(topic, batch)
        assert [position is None for position in refused.value.positions] == [False, True, False]
        assert [r.value for r in await read_to_end(log, topic)] == [b"a", b"b"]


@pytest.mark.kafka
async def test_a_record_the_broker_refuses_for_good_is_reported_and_the_producer_goes_on(
    kafka_bootstrap: str,
) -> None:
    """The topic's limit shrinks after this log read it: the broker refuses the record itself. The
    refused batch took sequence numbers the broker never saw, so the log replaces its producer: the
    next append must succeed (it failed with OutOfOrderSequenceNumber before)."""
    topic = f"shrunk-{uuid.uuid4().hex[:12]}"
    async with KafkaEventLog(kafka_bootstrap) as log:
        await log.create_topics([TopicSpec(topic)])
        assert await log.record_limit(topic) == log.policy.max_record_bytes
        await set_topic_config(kafka_bootstrap, topic, "max.message.bytes", "20000")
        with pytest.raises(RecordRefused, match="the broker refused it") as refused:
            await log.append_batch(topic, [OutgoingRecord(b"x" * 100_000, b"k")])
        assert refused.value.positions == [None]
        await log.append_batch(topic, [OutgoingRecord(b"after", b"k")])
        assert [r.value for r in await read_to_end(log, topic)] == [b"after"]


async def set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {name: value})])
    finally:
        await admin.close()
