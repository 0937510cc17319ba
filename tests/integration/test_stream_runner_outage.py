"""A StreamRunner rides out log outages in place: a Kafka broker killed for 50 s, and failing commits.

On a broker of its own, turn_linker runs as `orl pipeline` runs it. Half the conversations are
appended and processed; the other half is appended and the broker is killed with SIGKILL at once,
so the runner's next transaction fails, and stays down 50 s (past the 40 s request timeout of its Kafka clients, the log's 15 s connect
bound and the consumer's 10 s session) before it starts again in place. The runner must still be running, and the outputs must be exactly those of an
uninterrupted StreamRunner on the embedded log: nothing lost, nothing written twice. (aiokafka's
clients wait such an outage out, so the runner never sees it fail.) Where the log does fail a
commit, the second test: the stage starts again in place (`stage_restarts`), as its process would.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from orl.connectors.event_log.base import EventLogError, OutgoingRecord, TopicPartition
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.metrics import Metrics
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.turn_linker import TURN_LINKER
from orl.pipeline.runtime.stream_runner import StreamRunner
from orl.schemas.codec import encode

from tests.fixtures.kafka_broker import start_kafka_cluster
from tests.integration.test_faust_runtime import (
    PARTITIONS,
    append_events,
    conversations,
    output_topics,
    read_records,
    reference_outputs,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]
NAMESPACE = "ro"
DOWN_S = 50


async def test_a_runner_rides_out_a_frozen_broker_in_place_and_writes_each_output_once(
    tmp_path: Path,
) -> None:
    sessions, closes = conversations(NAMESPACE, "outage", 12)
    first, second = sessions[: len(sessions) // 2], sessions[len(sessions) // 2 :] + closes
    expected = (await reference_outputs(tmp_path / "ref.db", NAMESPACE, [first, second], [TURN_LINKER]))[-1]

    cluster = start_kafka_cluster(tmp_path / "kafka")
    (node,) = cluster.nodes
    assert node.process is not None
    metrics = Metrics()
    stop = asyncio.Event()
    try:
        async with KafkaEventLog(cluster.bootstrap, session_timeout_s=10.0) as log:
            runner = StreamRunner(
                log, TURN_LINKER, PipelineConfig(), NAMESPACE, metrics, partitions=PARTITIONS
            )
            await runner.prepare()  # the topics exist before anything is appended
            task = asyncio.create_task(runner.run(stop))
            await append_events(log, NAMESPACE, first)
            await asyncio.sleep(5)

            await append_events(log, NAMESPACE, second)
            node.kill()  # SIGKILL while the runner has the second half to commit
            await asyncio.sleep(DOWN_S)
            assert not task.done(), task.exception() if task.done() else None
            node.start()
            await asyncio.to_thread(cluster.wait_ready)
            written = await read_records(
                log, output_topics(NAMESPACE, [TURN_LINKER]), lambda records: len(records) >= len(expected),
                240, quiet_s=5,
            )  # fmt: skip
            assert not task.done(), task.exception() if task.done() else None
            stop.set()
            await task
    finally:
        stop.set()
        cluster.stop()

    inputs = {encode(event) for event in first + second}  # closes are inputs on an output topic too
    counts = collections.Counter(record for record in written if record[1] not in inputs)
    assert set(counts) - {(topic, value) for topic, value in expected} == set()
    assert {(topic, value) for topic, value in expected} <= set(counts), "outputs lost across the outage"
    assert max(counts.values()) == 1, "an output was written twice"
    # aiokafka's clients waited the outage out: the runner never saw it fail
    assert metrics.registry.get_sample_value("orl_stage_restarts_total", {"processor": "turn_linker"}) is None


class FailingCommits(SqliteEventLog):
    """The embedded log, whose next `failures` commits fail as a log that went away fails."""

    failures = 0

    async def append_and_commit(
        self,
        outputs: Sequence[tuple[str, OutgoingRecord]],
        group_id: str,
        offsets: Mapping[TopicPartition, int],
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise EventLogError("the log went away (injected)")
        await super().append_and_commit(outputs, group_id, offsets)


async def test_a_failing_commit_starts_the_stage_again_in_place_from_its_changelog(tmp_path: Path) -> None:
    """When a commit fails (what a broker away past every client bound does), the runner drops the
    batch, rebuilds its state from the changelog and reads on from the committed offsets: the outputs
    are still exactly the uninterrupted run's, each once, and the process never exits."""
    sessions, closes = conversations(NAMESPACE, "failing", 8)
    first, second = sessions[: len(sessions) // 2], sessions[len(sessions) // 2 :] + closes
    expected = (await reference_outputs(tmp_path / "ref.db", NAMESPACE, [first, second], [TURN_LINKER]))[-1]
    metrics, stop = Metrics(), asyncio.Event()
    async with FailingCommits(tmp_path / "log.db") as log:
        runner = StreamRunner(log, TURN_LINKER, PipelineConfig(), NAMESPACE, metrics, partitions=PARTITIONS)
        await runner.prepare()
        task = asyncio.create_task(runner.run(stop))
        await append_events(log, NAMESPACE, first)
        await asyncio.sleep(2)
        log.failures = 2  # the next two commits fail: two starts in place, 1 s then 2 s apart
        await append_events(log, NAMESPACE, second)
        written = await read_records(
            log, output_topics(NAMESPACE, [TURN_LINKER]), lambda records: len(records) >= len(expected), 60,
            quiet_s=4,
        )  # fmt: skip
        assert not task.done(), task.exception() if task.done() else None
        stop.set()
        await task
    inputs = {encode(event) for event in first + second}
    counts = collections.Counter(record for record in written if record[1] not in inputs)
    assert set(counts) == {(topic, value) for topic, value in expected}
    assert max(counts.values()) == 1
    assert log.failures == 0
    assert metrics.registry.get_sample_value("orl_stage_restarts_total", {"processor": "turn_linker"}) == 2
