"""The relay that cuts one Kafka client off its broker (tests/fixtures/kafka_relay.py), on a real broker.

Two event logs reach one broker through the relay under different client ids, as `orl serve` and
`orl pipeline` do ("orl-serve", "orl-pipeline"). While "orl-serve" is cut, its appends get no
answer and the other client's go through; once healed, the cut client's append lands, once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from orl.connectors.event_log.base import OutgoingRecord, TopicSpec
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.event_log.reading import read_to_end

from tests.fixtures.kafka_broker import KafkaCluster, start_kafka_cluster
from tests.fixtures.kafka_relay import KafkaRelay, client_id_of

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def test_client_id_is_read_from_a_request_header() -> None:
    # size, ApiVersions (key 18) v3, correlation id 7, client id "orl-serve", then the body
    header = (18).to_bytes(2, "big") + (3).to_bytes(2, "big") + (7).to_bytes(4, "big")
    header += len(b"orl-serve").to_bytes(2, "big") + b"orl-serve" + b"\x00"
    assert client_id_of(len(header).to_bytes(4, "big") + header) == "orl-serve"
    null_id = (18).to_bytes(2, "big") + (0).to_bytes(2, "big") + (1).to_bytes(4, "big") + b"\xff\xff"
    assert client_id_of(len(null_id).to_bytes(4, "big") + null_id) is None
    assert client_id_of(b"\x00\x00") is None


@pytest.fixture(scope="module")
def relayed_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaCluster, KafkaRelay]]:
    cluster = start_kafka_cluster(Path(tmp_path_factory.mktemp("relayed")), relayed=True)
    (node,) = cluster.nodes
    assert node.relayed is not None
    relay = KafkaRelay(port=node.relayed[1], target_port=node.relayed[0])
    try:
        yield cluster, relay
    finally:
        relay.close()
        cluster.stop()


async def test_a_cut_client_gets_no_answer_while_others_go_on_and_its_append_lands_once_healed(
    relayed_broker: tuple[KafkaCluster, KafkaRelay],
) -> None:
    cluster, relay = relayed_broker
    url = f"kafka://127.0.0.1:{relay.port}"
    topic = f"relay-{uuid.uuid4().hex[:12]}"
    async with (
        open_event_log(url, client_id="orl-serve") as serve_log,
        open_event_log(url, client_id="orl-pipeline") as pipeline_log,
    ):
        await serve_log.create_topics([TopicSpec(topic, 1)])
        await serve_log.append(topic, OutgoingRecord(b"before", key=b"s"))
        relay.cut("orl-serve")
        try:
            cut_append = asyncio.ensure_future(serve_log.append(topic, OutgoingRecord(b"during", key=b"s")))
            await pipeline_log.append(topic, OutgoingRecord(b"other client", key=b"p"))
            await asyncio.sleep(3)
            assert not cut_append.done(), "an append of the cut client was answered"
        finally:
            relay.heal()
        await asyncio.wait_for(cut_append, timeout=60)
        values = [record.value for record in await read_to_end(pipeline_log, topic)]
    assert sorted(values) == [b"before", b"during", b"other client"]
    assert relay.connections >= 2
    # the relay is the only way in for these clients: the broker advertised its address to them
    assert cluster.nodes[0].bootstrap != f"127.0.0.1:{relay.port}"
