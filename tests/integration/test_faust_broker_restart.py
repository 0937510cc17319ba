"""Two faust workers across a kill -9 and restart in place of their Kafka broker, mid-stream.

On a broker of this module's own (it is killed): two workers of one group split the partitions,
the stream arrives in chunks, and after the second chunk the broker is killed with SIGKILL and
started again on the same ports and data (`KafkaCluster.restart`). A worker that exits meanwhile
is started again, as a supervisor would (`orl up`, a container runtime); the test counts them.
Afterwards the outputs must be the set an uninterrupted StreamRunner writes on the embedded log
(test_faust_runtime's reference), repeats only as exact duplicates (outputs written outside a
transaction, see pipeline/runtime/faust_runtime.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.pipeline.processors.event_building import Event
from orl.pipeline.processors.turn_linker import TURN_LINKER
from orl.pipeline.runtime.faust_runtime import create_pipeline_topics
from orl.schemas.codec import encode

from tests.fixtures.kafka_broker import KafkaCluster, start_kafka_cluster
from tests.integration.test_faust_multiworker import (
    Worker,
    chunked,
    describe,
    settle,
    split_between,
    start_worker,
    watching,
)
from tests.integration.test_faust_runtime import (
    PARTITIONS,
    append_events,
    conversations,
    exact_duplicates,
    output_topics,
    reference_outputs,
    wait_for,
)

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

SESSIONS = 64
CHUNKS = 6
SETTLE_S = 90.0


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[KafkaCluster]:
    cluster = start_kafka_cluster(tmp_path / "kafka")
    try:
        yield cluster
    finally:
        cluster.stop()


async def append_until_accepted(log: KafkaEventLog, namespace: str, chunk: Sequence[Event]) -> None:
    """Append `chunk`, again while the broker is still coming back (the log's producer is idempotent)."""
    for attempt in range(60):
        try:
            await append_events(log, namespace, chunk)
            return
        except Exception:
            if attempt == 59:
                raise
            await asyncio.sleep(1.0)


async def test_two_workers_across_a_broker_kill_9_and_restart_lose_nothing(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    namespace, app_id = "fb", "fb-pipeline"
    events, closes = conversations(namespace, "fb", SESSIONS)
    _, expected = await reference_outputs(tmp_path / "ref.db", namespace, [events, closes], [TURN_LINKER])
    inputs = {encode(event) for event in [*events, *closes]}
    await create_pipeline_topics([TURN_LINKER], namespace, app_id, broker.bootstrap, PARTITIONS)
    names = {"first": 0, "second": 0}  # worker -> times started again after it exited

    def start(name: str) -> Worker:
        suffix = f"-{names[name]}" if names[name] else ""
        return start_worker(broker.bootstrap, namespace, app_id, tmp_path, f"{name}{suffix}")

    workers = {name: start(name) for name in names}

    def supervise() -> None:
        for name, worker in workers.items():
            if worker.process.poll() is not None:
                names[name] += 1
                workers[name] = start(name)

    log = KafkaEventLog(broker.bootstrap, session_timeout_s=6.0)
    await log.start()
    try:
        async with watching(log, output_topics(namespace, [TURN_LINKER])) as watch:
            await wait_for(
                lambda: split_between(workers["first"], workers["second"]), 90, "the partitions to split", []
            )
            for index, chunk in enumerate(chunked(events, CHUNKS)):
                await append_until_accepted(log, namespace, chunk)
                await asyncio.sleep(1.0)
                supervise()
                if index == 1:
                    await asyncio.to_thread(broker.restart, 1)  # kill -9, start in place, until it answers
            await append_until_accepted(log, namespace, closes)
            deadline_s = asyncio.get_running_loop().time() + SETTLE_S
            while (
                not expected <= set(watch.outputs(inputs)) and asyncio.get_running_loop().time() < deadline_s
            ):
                supervise()
                await asyncio.sleep(1.0)
            await settle(watch, lambda: True, 5.0, [])
            outputs = watch.outputs(inputs)
    finally:
        await log.close()
        for worker in workers.values():
            worker.stop()

    unexpected, missing = set(outputs) - expected, expected - set(outputs)
    duplicates = exact_duplicates(outputs)  # fails if an event id has two different encodings
    print(
        f"broker restart under two faust workers: {len(expected)} outputs, {len(missing)} missing, "
        f"{duplicates} exact duplicates, workers started again: {names}"
    )
    assert not unexpected, f"outputs the reference does not have: {describe(unexpected)}"
    assert not missing, f"outputs missing: {describe(missing)}"
