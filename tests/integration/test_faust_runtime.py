"""The faust runtime on the Apache Kafka test broker: same outputs as the StreamRunner, crash-safe.

Workers run as subprocesses (tests/integration/faust_worker_main.py), as in production. The
reference for every comparison is `StreamRunner` over the embedded SQLite log fed the same input.
Ticks use a fixed clock before every event, so no idle timeout fires and outputs do not depend on
timing. Reads and writes topics of the namespaces `fa`, `fk` on the session's test broker.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from orl.connectors.event_log.base import EventLog, OutgoingRecord
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Processor
from orl.pipeline.processors.event_building import Event, event_type_of
from orl.pipeline.processors.turn_linker import TURN_LINKER
from orl.pipeline.runtime.faust_runtime import create_pipeline_topics
from orl.pipeline.runtime.stream_runner import StreamRunner
from orl.schemas.codec import decode, encode
from orl.schemas.topics import dlq_topic, topic_for_event, topic_name

from tests.unit.pipeline_streams import T0_MS, Conversation, tool_call

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
PARTITIONS = 4
GUARANTEE = "exactly_once"
OWNS = re.compile(r"turn_linker: this worker now owns partitions \[([\d, ]*)\]")
Record = tuple[str, bytes]


def conversations(namespace: str, prefix: str, count: int) -> tuple[list[Event], list[Event]]:
    """`count` sessions of 3-4 turns (tool calls, side turns, a response recorded before its request),
    and the explicit SessionClosed of every other session, kept apart.

    The log orders records within a topic partition only; a SessionClosed read before the session's
    last requests would close it early. Tests append the closes once the rest is processed, so both
    runtimes see them in the same place.
    """
    sessions: list[list[Event]] = []
    closes: list[Event] = []
    for i in range(count):
        chat = Conversation(f"{prefix}-{i}", namespace=namespace, now_ms=T0_MS + 1000 * i)
        chat.say(f"Run the tests of project {i}.")
        chat.turn("Running pytest.", tool_calls=[tool_call(f"c{i}", "shell", {"cmd": "pytest -q"})])
        chat.tool_result(f"c{i}", f"{i % 5} failed, 10 passed")
        chat.turn(f"{i % 5} tests fail; patching parse().")
        if i % 3 == 0:
            chat.turn("memory summary", kind="side")
        chat.say("Thanks, and now the docs?")
        if i % 4 == 1:  # the response is recorded before its request: the linker must still join them
            late = chat.turn("Docs updated.", emit=False)
            assert late.response is not None
            chat.events.extend([late.response, late.request])
        else:
            chat.turn("Docs updated.")
        sessions.append(list(chat.events))  # before close(), which appends to chat.events
        if i % 2 == 0:
            closes.append(chat.close())
    # sessions interleaved as live traffic is (each keeps its own order), so any slice spans many sessions
    events = [event for turn in itertools.zip_longest(*sessions) for event in turn if event is not None]
    return events, closes


async def append_events(log: EventLog, namespace: str, events: Sequence[Event]) -> None:
    by_topic: dict[str, list[OutgoingRecord]] = collections.defaultdict(list)
    for event in events:
        key = event["envelope"]["session_id"].encode()
        by_topic[topic_name(namespace, topic_for_event(event_type_of(event)))].append(
            OutgoingRecord(encode(event), key)
        )
    for topic, records in by_topic.items():
        await log.append_batch(topic, records)


async def read_records(
    log: EventLog,
    topics: Sequence[str],
    done: Callable[[list[Record]], bool],
    timeout_s: float,
    quiet_s: float = 1.0,
    workers: Sequence[Worker] = (),
) -> list[Record]:
    """Every record of `topics` (a fresh group, from the start) once `done` holds and `quiet_s` passed without news."""
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    quiet_since = time.monotonic()
    async with log.consumer(f"reader-{time.monotonic_ns()}", list(topics)) as consumer:
        while time.monotonic() < deadline:
            batch = await consumer.poll(max_records=1000, timeout_s=0.2)
            for worker in workers:
                worker.check_alive()
            records.extend((r.topic, r.value) for r in batch)
            if batch:
                quiet_since = time.monotonic()
            elif done(records) and time.monotonic() - quiet_since >= quiet_s:
                break
    return records


def output_topics(namespace: str, processors: Sequence[Processor]) -> list[str]:
    return sorted({topic_name(namespace, topic) for p in processors for topic in p.outputs})


async def reference_outputs(
    db: Path, namespace: str, phases: Sequence[Sequence[Event]], processors: Sequence[Processor]
) -> list[set[Record]]:
    """What the StreamRunner writes (inputs excluded) after each phase of input, each run until no work is left."""
    log = SqliteEventLog(db)
    await log.start()
    inputs = {encode(event) for phase in phases for event in phase}
    results: list[set[Record]] = []
    try:
        runners = [
            StreamRunner(log, p, PipelineConfig(), namespace, partitions=PARTITIONS) for p in processors
        ]
        for runner in runners:
            await runner.prepare()
        for phase in phases:
            await append_events(log, namespace, phase)
            while sum([await runner.run_until_idle() for runner in runners]):
                pass
            records = await read_records(
                log, output_topics(namespace, processors), lambda _: True, 30, quiet_s=0.3
            )
            results.append({(topic, value) for topic, value in records if value not in inputs})
    finally:
        await log.close()
    return results


@dataclass
class Worker:
    """A faust worker subprocess; its log (faust's and ours) goes to `log_path`."""

    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(
        cls, bootstrap: str, namespace: str, app_id: str, workdir: Path, name: str, guarantee: str = GUARANTEE
    ) -> Worker:
        workdir.mkdir(parents=True, exist_ok=True)
        log_path = workdir / f"{name}.log"
        command = [sys.executable, "-m", "tests.integration.faust_worker_main", "--broker", bootstrap]
        command += ["--namespace", namespace, "--app-id", app_id, "--data-dir", str(workdir / name)]
        command += ["--partitions", str(PARTITIONS), "--clock-ms", str(T0_MS), "--loglevel", "info"]
        command += ["--guarantee", guarantee]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(command, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        return cls(process, log_path)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def owned(self) -> list[int] | None:
        """The partitions this worker said it owns last (None before its first assignment)."""
        found = OWNS.findall(self.log())
        return None if not found else [int(p) for p in found[-1].split(",") if p.strip()]

    def check_alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"worker exited with {code}:\n{self.log()[-3000:]}"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


async def wait_for(
    condition: Callable[[], bool], timeout_s: float, what: str, workers: Sequence[Worker]
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(w.log()[-3000:] for w in workers)
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}; worker logs:\n{tails}")
        for worker in workers:
            worker.check_alive()
        await asyncio.sleep(0.2)


def exact_duplicates(records: Sequence[Record]) -> int:
    """How many records repeat an earlier one; fails if two records share an event id but differ in bytes."""
    by_id: dict[str, set[Record]] = collections.defaultdict(set)
    for topic, value in records:
        by_id[decode(value)["envelope"]["event_id"]].add((topic, value))
    differing = {event_id: len(versions) for event_id, versions in by_id.items() if len(versions) > 1}
    assert not differing, f"same event id, different bytes: {differing}"
    return len(records) - len(set(records))


@pytest.fixture
async def kafka_log(kafka_bootstrap: str):
    log = KafkaEventLog(kafka_bootstrap, session_timeout_s=6.0)
    await log.start()
    yield log
    await log.close()


async def test_one_worker_matches_stream_runner_and_dead_letters(
    kafka_bootstrap: str, kafka_log: KafkaEventLog, tmp_path: Path
) -> None:
    namespace, app_id = "fa", "fa-pipeline"
    events, closes = conversations(namespace, "sess", 24)
    before_closes, expected = await reference_outputs(
        tmp_path / "ref.db", namespace, [events, closes], [TURN_LINKER]
    )
    assert {decode(v)["envelope"]["event_type"] for _, v in expected} == {"NextStateObserved"}
    assert len(expected) > len(before_closes), "the closes should add session_end next states"

    await create_pipeline_topics([TURN_LINKER], namespace, app_id, kafka_bootstrap, PARTITIONS)
    await append_events(kafka_log, namespace, events)
    corrupt = b"\xc3\x01 not an avro event"
    requests = topic_name(namespace, "requests")
    position = await kafka_log.append(requests, OutgoingRecord(corrupt, b"sess-broken"))
    inputs = {encode(event) for event in [*events, *closes]}
    topics = output_topics(namespace, [TURN_LINKER])
    worker = Worker.start(kafka_bootstrap, namespace, app_id, tmp_path, "solo")
    try:
        started = time.monotonic()
        await read_records(kafka_log, topics, lambda r: before_closes <= set(r), 90, workers=[worker])
        await append_events(kafka_log, namespace, closes)
        records = await read_records(kafka_log, topics, lambda r: expected <= set(r), 60, workers=[worker])
        elapsed_s = time.monotonic() - started
        dead = await read_records(
            kafka_log, [dlq_topic(requests)], lambda r: len(r) >= 1, 30, workers=[worker]
        )
    finally:
        worker.stop()
    outputs = [(topic, value) for topic, value in records if value not in inputs]
    assert set(outputs) == expected, (
        f"faust wrote {len(set(outputs))} distinct outputs, the StreamRunner {len(expected)}"
    )
    print(
        f"one worker: {len(expected)} outputs in {elapsed_s:.1f} s, {exact_duplicates(outputs)} exact duplicates"
    )

    # (d) the corrupt record is dead-lettered with its bytes and position; the rest went on
    assert len(dead) == 1
    letter = decode(dead[0][1])
    assert letter["envelope"]["event_type"] == "DeadLettered"
    assert letter["original_bytes"] == corrupt
    assert (letter["source_topic"], letter["source_partition"], letter["source_offset"]) == (
        requests,
        position.partition,
        position.offset,
    )
    assert letter["error"]
