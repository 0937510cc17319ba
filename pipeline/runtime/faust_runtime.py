"""The scale-out runtime: the pure processors as faust-streaming agents with changelog-backed Tables.

Same semantics and the same output bytes as `pipeline.runtime.stream_runner.StreamRunner`, on Kafka:

- One agent per processor reads its input topics (`<namespace>.<topic>`) as raw bytes, decodes
  each value with `schemas.codec` (undecodable bytes become a DeadLettered event on `<topic>.dlq`
  with the original bytes, the error and the source offset), calls `processor.process` with the
  session's state and sends every Emit, encoded and keyed by session_id, to its topic.
- State is a faust Table keyed by session_id (`<app_id>-<processor>-state-changelog`), holding the
  JSON state as compact, key-sorted bytes (the StreamRunner's changelog format); None deletes it.
- Time: a timer on every worker sends the wall clock to `<app_id>-<processor>-ticks`, one record
  per partition this worker owns; the agent reads it like an input and calls `on_tick` for the
  sessions of that partition. Ticks thus run inside the partition's stream, so their Table writes
  and outputs land in the right changelog partition and, under exactly_once, in its transaction.
- exactly_once (default): faust keeps one transaction per source partition that holds the
  changelog writes, the outputs and the input offsets. Output topics the app does not read
  are written outside that transaction (faust routes by the app's own subscription), so a crash
  can repeat them: byte-identical, same event ids. at_least_once: each output is acknowledged by
  the broker before the state is written, so the processors' seen-id check cannot swallow a
  redelivered input whose outputs were lost; repeats are exact duplicates too.

Workers: `run_worker(...)` creates the topics, builds the app and runs `faust.Worker` until SIGTERM
or SIGINT (`faust -A` needs a module-level app; this keeps settings out of the environment).
Every source topic must exist with the app's partition count before a worker starts
(`create_pipeline_topics`): a mismatch with a Table's changelog crashes the agent. The app's
consumer (`PipelineTransport`) works around faust-streaming 0.15.3 defects that rebalances between
workers hit (tests/integration/test_faust_multiworker.py). One of them loses records: faust can
drop records it fetched while a rebalance seeks the partitions and then commit past them. The
consumer tells the agents every offset it fetches; an agent that sees a gap holding fetched
offsets it never handled reads those records from the broker and handles them first
(`InputProgress`, `SkippedRecordReader`).

Reads: the processors' input topics (also directly, for skipped records), their tick topics and
changelogs. Writes: their output topics, `<input>.dlq`, their changelogs and tick topics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import faust
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import IllegalOperation, TopicAlreadyExistsError
from faust.transport.consumer import RecordMap
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import TP, EventT, StreamT, TopicT
from mode import CrashingSupervisor

from connectors.event_log.partitioner import partition_for_key
from connectors.metrics import Metrics
from pipeline.processors.config import PipelineConfig
from pipeline.processors.contract import Emit, Processor
from pipeline.runtime.dead_letters import dead_letter_event
from schemas.codec import decode, encode
from schemas.errors import ConfigError, EventDecodeError
from schemas.topics import dlq_topic, topic_name

logger = logging.getLogger(__name__)

GUARANTEES = ("exactly_once", "at_least_once")
TICK_RETENTION_MS = 3_600_000
RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


def state_bytes(state: Any) -> bytes:
    return json.dumps(state, sort_keys=True, separators=(",", ":")).encode()


def table_name(processor: Processor) -> str:
    return f"{processor.name}-state"


def changelog_topic(app_id: str, processor: Processor) -> str:
    """faust's name for the Table's changelog: `<app_id>-<table>-changelog`."""
    return f"{app_id}-{table_name(processor)}-changelog"


def tick_topic(app_id: str, processor: Processor) -> str:
    return f"{app_id}-{processor.name}-ticks"


@dataclasses.dataclass(frozen=True)
class SourceRecord:
    """One input record, as the stream delivered it or as SkippedRecordReader read it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


class InputProgress:
    """Which records of one partition an agent handled, and which its consumer fetched (pure bookkeeping).

    faust-streaming 0.15.3 can drop records it fetched while a rebalance seeks partitions, and its
    commit then passes them (it tolerates one missing record at the committed offset, and checks
    nothing in a partition without a committed offset). A dropped record was fetched and never
    handled; a transaction marker takes an offset but is never fetched. The consumer numbers its
    fetches (rounds) and hands records to an agent's stream in fetch order, so a fetched record
    that is not handled was skipped once the agent handles a later record of its partition, or
    any record from a later fetch round. `last` is the offset last handled in `generation`.
    """

    def __init__(self) -> None:
        self.generation: int | None = None
        self.last = -1
        self.fetched: dict[int, tuple[int, int]] = {}  # offset -> (generation, round), until handled

    def note_fetched(self, offsets: Sequence[int], generation: int, fetch_round: int) -> None:
        for offset in offsets:
            self.fetched[offset] = (generation, fetch_round)

    def begin(self, generation: int) -> None:
        """A new consumer generation starts over: faust delivers nothing fetched before it and seeks anew."""
        if generation != self.generation:
            self.generation, self.last = generation, -1
            self.fetched = {o: seen for o, seen in self.fetched.items() if seen[0] == generation}

    def is_redelivery(self, offset: int) -> bool:
        if offset <= self.last:
            self.fetched.pop(offset, None)
            return True
        return False

    def fetch_round(self, offset: int) -> int | None:
        seen = self.fetched.get(offset)
        return None if seen is None else seen[1]

    def skipped_before(self, offset: int) -> list[int]:
        """Offsets before `offset` fetched and never handled: skipped (forgotten here, the caller handles them)."""
        if offset == self.last + 1:
            return []
        return self._take(lambda o, _: o < offset)

    def skipped_in_rounds_before(self, fetch_round: int) -> list[int]:
        """Offsets fetched in a round before `fetch_round` and never handled: skipped (forgotten here)."""
        return self._take(lambda _, seen: seen[1] < fetch_round)

    def handled(self, offset: int) -> None:
        self.last = max(self.last, offset)
        self.fetched.pop(offset, None)

    def _take(self, chosen: Callable[[int, tuple[int, int]], bool]) -> list[int]:
        taken = sorted(o for o, seen in self.fetched.items() if chosen(o, seen))
        for offset in taken:
            del self.fetched[offset]
        return [o for o in taken if o > self.last]


class SkippedRecordReader:
    """Reads a range of one partition straight from the broker (read_committed), for records a stream skipped.

    One consumer without a group, started on first use and shared by a worker's agents.
    """

    def __init__(self, broker_url: str, timeout_s: float = 60.0) -> None:
        self.bootstrap = broker_url.replace(";", ",")
        self.timeout_s = timeout_s
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def read(self, topic: str, partition: int, start: int, end: int) -> list[SourceRecord]:
        """The records of `topic`[`partition`] with offsets in [start, end), in offset order."""
        async with self._lock:
            consumer = await self._started()
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, start)
            records: list[SourceRecord] = []
            deadline = time.monotonic() + self.timeout_s
            while await consumer.position(tp) < end:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"reading {topic}[{partition}] offsets {start}..{end - 1} took over {self.timeout_s} s"
                    )
                batch = await consumer.getmany(tp, timeout_ms=500)
                records += [
                    SourceRecord(r.topic, r.partition, r.offset, r.key, r.value or b"", r.timestamp)
                    for r in batch.get(tp, [])
                    if start <= r.offset < end
                ]
            return records

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
                auto_offset_reset="earliest",
            )
            await consumer.start()
            self._consumer = consumer
        return self._consumer

    async def close(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None


class ProcessorAgent:
    """Binds one pure processor to a faust agent, its Table, its tick topic and its tick timer."""

    def __init__(
        self,
        app: PipelineApp,
        processor: Processor,
        config: PipelineConfig,
        namespace: str,
        *,
        partitions: int,
        tick_interval_s: float,
        clock_ms: Callable[[], int],
        metrics: Metrics,
        skipped_records: SkippedRecordReader,
    ) -> None:
        self.app, self.processor, self.config, self.namespace = app, processor, config, namespace
        self.skipped_records = skipped_records
        self.partitions, self.clock_ms, self.metrics = partitions, clock_ms, metrics
        self.acknowledge_outputs = app.conf.processing_guarantee.value == "at_least_once"
        # str keys and bytes values travel raw: the changelog holds session ids and the JSON state bytes
        self.table = app.Table(table_name(processor), key_type=str, value_type=bytes, partitions=partitions)
        self.tick_topic = tick_topic(app.conf.id, processor)
        self.inputs = tuple(topic_name(namespace, topic) for topic in processor.inputs)
        self._topics: dict[str, TopicT] = {}
        self._owned: list[int] = []
        self.progress: dict[tuple[str, int], InputProgress] = {}  # per (topic, partition) of inputs and ticks
        app.fetch_listeners.append(self.note_fetched)
        source = app.topic(*self.inputs, self.tick_topic, partitions=partitions, **RAW)
        # CrashingSupervisor: an unexpected error stops the worker loudly instead of restarting the
        # agent past the failing record; a restart is safe because state and offsets agree.
        app.agent(source, name=f"orl.{processor.name}", supervisor_strategy=CrashingSupervisor)(self.consume)
        app.timer(tick_interval_s, name=f"orl.{processor.name}.ticks")(self.send_ticks)

    async def consume(self, stream: StreamT) -> None:
        event: EventT
        async for event in stream.events():
            message = event.message
            if message.topic == self.tick_topic:
                await self.handle_skipped_before_tick(message.partition, message.offset)
                await self.tick(message.partition, int(event.value))
            else:
                record = SourceRecord(
                    message.topic,
                    message.partition,
                    message.offset,
                    message.key,
                    message.value or b"",
                    round(message.timestamp * 1000),  # faust gives seconds
                )
                await self.handle_in_order(record)

    def note_fetched(self, topic: str, partition: int, offsets: Sequence[int], fetch_round: int) -> None:
        """The consumer fetched `offsets` of `topic`[`partition`] (PipelineConsumer calls it on every fetch)."""
        if topic in self.inputs or topic == self.tick_topic:
            progress = self.progress.setdefault((topic, partition), InputProgress())
            progress.note_fetched(offsets, self.app.consumer_generation_id, fetch_round)

    def progress_of(self, topic: str, partition: int) -> InputProgress:
        progress = self.progress.setdefault((topic, partition), InputProgress())
        progress.begin(self.app.consumer_generation_id)
        return progress

    async def handle_in_order(self, record: SourceRecord) -> None:
        """Handle `record` after the records before it that the stream skipped; a redelivery not again."""
        progress = self.progress_of(record.topic, record.partition)
        if progress.is_redelivery(record.offset):
            self.metrics.count("records_redelivered", processor=self.processor.name)
            return
        await self.handle_skipped(record.topic, record.partition, progress.skipped_before(record.offset))
        await self.handle(record)
        progress.handled(record.offset)

    async def handle_skipped_before_tick(self, partition: int, offset: int) -> None:
        """Records of `partition` fetched before this tick and never handled were skipped: handle them."""
        ticks = self.progress_of(self.tick_topic, partition)
        fetch_round = ticks.fetch_round(offset)
        ticks.handled(offset)
        if fetch_round is None:
            return
        for topic in self.inputs:
            skipped = self.progress_of(topic, partition).skipped_in_rounds_before(fetch_round)
            await self.handle_skipped(topic, partition, skipped)

    async def handle_skipped(self, topic: str, partition: int, offsets: Sequence[int]) -> None:
        """Read the skipped `offsets` from the broker, handle them in order and acknowledge them to faust."""
        if not offsets:
            return
        wanted = set(offsets)
        records = await self.skipped_records.read(topic, partition, offsets[0], offsets[-1] + 1)
        records = [record for record in records if record.offset in wanted]
        logger.warning(
            "%s: the stream skipped %d record(s) of %s[%d] (offsets %d..%d); handling them now",
            self.processor.name, len(records), topic, partition, offsets[0], offsets[-1],
        )  # fmt: skip
        self.metrics.count("records_recovered", len(records), processor=self.processor.name)
        progress = self.progress_of(topic, partition)
        for record in records:
            await self.handle(record)
            progress.handled(record.offset)
        cast(PipelineConsumer, self.app.consumer).acknowledge(topic, partition, offsets)

    async def handle(self, record: SourceRecord) -> None:
        try:
            decoded = decode(record.value)
        except EventDecodeError as error:
            await self.dead_letter(record, str(error))
        else:
            key = (record.key or b"").decode() or str(decoded["envelope"].get("session_id") or "")
            stored = self.table.get(key)
            state = None if stored is None else json.loads(stored)
            new_state, emits = self.processor.process(state, decoded, self.config)
            await self.send_emits(emits)
            self.store(key, new_state)
            self.metrics.count("records_processed", processor=self.processor.name)

    async def tick(self, partition: int, now_ms: int) -> None:
        """on_tick for every session of `partition` (the tick record's partition, owned by this worker)."""
        owned = [key for key in self.table if self.partition_of(key) == partition]
        for key in sorted(owned):
            stored = self.table[key]
            new_state, emits = self.processor.on_tick(json.loads(stored), now_ms, self.config)
            await self.send_emits(emits)
            if new_state is None or state_bytes(new_state) != stored:
                self.store(key, new_state)

    def partition_of(self, key: str) -> int:
        # Kafka's default partitioner, as the producers of our topics use it (keys are session ids).
        return partition_for_key(key.encode(), self.partitions)

    def store(self, key: str, state: Any) -> None:
        if state is None:
            if key in self.table:
                del self.table[key]
        else:
            self.table[key] = state_bytes(state)

    async def send_emits(self, emits: Sequence[Emit]) -> None:
        for emit in emits:
            session = emit.event["envelope"].get("session_id")
            await self.send(
                topic_name(self.namespace, emit.topic),
                session.encode() if session else None,
                encode(emit.event),
            )
            self.metrics.count("events_emitted", topic=emit.topic, processor=self.processor.name)

    async def dead_letter(self, record: SourceRecord, error: str) -> None:
        self.metrics.count("dead_lettered", topic=record.topic, processor=self.processor.name)
        logger.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, error)
        event = dead_letter_event(
            self.namespace,
            record.topic,
            record.partition,
            record.offset,
            record.value,
            error,
            record.timestamp_ms,
        )
        await self.send(dlq_topic(record.topic), record.key, encode(event))

    async def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        channel = self._topics.get(topic)
        if channel is None:
            channel = self._topics[topic] = self.app.topic(topic, partitions=self.partitions, **RAW)
        delivery = await channel.send(key=key, value=value)
        if self.acknowledge_outputs:
            await delivery

    async def send_ticks(self) -> None:
        """One tick per owned partition, outside any transaction: a tick is a command, not a fact."""
        now_ms = str(self.clock_ms()).encode()
        owned = sorted(
            tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == self.tick_topic
        )
        if owned != self._owned:
            logger.info("%s: this worker now owns partitions %s", self.processor.name, owned)
            self._owned = owned
        for partition in owned:
            await self.app.producer.send(self.tick_topic, None, now_ms, partition, None, None)


class PipelineConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):
    async def _highwaters(self, partitions: list[Any]) -> Any:
        """Changelog highwaters from the broker's last stable offset, not from the last fetch.

        Under exactly_once, faust-streaming 0.15.3 takes them from the consumer's cached last stable
        offset, None until the partition has been fetched since the assignment, so recovery sees
        highwater -1: a worker holding a standby offset then crashes (ConsistencyError "persisted
        offset ... is higher than the last offset", faust-streaming/faust#158; seen here), and by
        the recovery code a new owner would skip restoring the partition's Table. `end_offsets` on
        this read_committed consumer asks the broker; under at_least_once faust does that already.
        """
        return await self._ensure_consumer().end_offsets(partitions)


class PipelineApp(faust.App):
    """faust.App with the agents to tell about every fetch (ProcessorAgent.note_fetched)."""

    def __init__(self, id: str, **options: Any) -> None:
        super().__init__(id, **options)
        self.fetch_listeners: list[Callable[[str, int, Sequence[int], int], None]] = []


class PipelineConsumer(faust_aiokafka.Consumer):
    fetch_round = 0

    async def _wait_next_records(self, timeout: float) -> tuple[RecordMap | None, set[TP] | None]:
        """faust's fetch, then every fetched offset to the agents (with this fetch's number), before any is delivered."""
        records, active_partitions = await super()._wait_next_records(timeout)
        if records:
            self.fetch_round += 1
            listeners = cast(PipelineApp, self.app).fetch_listeners
            for tp, batch in records.items():
                offsets = [record.offset for record in batch]
                for listener in listeners:
                    listener(tp.topic, tp.partition, offsets, self.fetch_round)
        return records, active_partitions

    def acknowledge(self, topic: str, partition: int, offsets: Sequence[int]) -> None:
        """Mark records an agent handled outside faust's stream as acknowledged, as `Consumer.ack` does.

        Without this, faust's commit of the partition would stop at the first of them for good.
        """
        tp = TopicPartition(topic, partition)  # what faust's messages carry, and what aiokafka commits
        committed = self._committed_offset[tp]
        for offset in offsets:  # on the event loop's thread, as faust's own acks from the agents
            if (committed is None or offset >= committed) and offset not in self._acked_index[tp]:
                self._acked_index[tp].add(offset)
                self._acked[tp].append(offset)
                self._n_acked += 1

    def _new_consumer_thread(self) -> faust_aiokafka.AIOKafkaConsumerThread:
        return PipelineConsumerThread(self, loop=self.loop, beacon=self.beacon)

    async def commit_and_end_transactions(self) -> None:
        """The last commit at stop, which must not stop the worker from leaving its group.

        faust-streaming 0.15.3 ends the transactions twice on stop (the app's wait for streams, then
        the consumer's): offsets of records processed in between have no open transaction, the
        commit raises IllegalOperation and the consumer never sends LeaveGroup, so its partitions
        wait for the session timeout. Those records' Table writes failed with the same error; the
        partitions' next owner processes them again from the committed offsets.
        """
        try:
            await super().commit_and_end_transactions()
        except IllegalOperation as error:
            logger.warning("last offsets not committed at stop, the next owner reprocesses them: %s", error)


class PipelineTransport(faust_aiokafka.Transport):
    Consumer = PipelineConsumer


def broker_urls(broker_url: str) -> list[str]:
    """ "host:9092,host2:9092" (or kafka:// URLs) -> faust's list of kafka:// URLs."""
    hosts = [part.strip() for part in broker_url.replace(";", ",").split(",") if part.strip()]
    return [host if "://" in host else f"kafka://{host}" for host in hosts]


def build_faust_app(
    processors: Processor | Sequence[Processor],
    config: PipelineConfig,
    namespace: str,
    broker_url: str,
    app_id: str,
    data_dir: str | Path,
    processing_guarantee: str = "exactly_once",
    *,
    partitions: int = 8,
    tick_interval_s: float = 1.0,
    session_timeout_s: float = 10.0,
    rebalance_timeout_s: float = 60.0,
    commit_interval_s: float = 1.0,
    clock_ms: Callable[[], int] = wall_clock_ms,
    metrics: Metrics | None = None,
) -> faust.App:
    """A faust app with one agent, Table and tick timer per processor; all workers share `app_id` (the group).

    `session_timeout_s` is how long a killed worker keeps its partitions (noida-db refuses < 6 s);
    `rebalance_timeout_s` how long a rebalance waits for members to rejoin (noida-db waits that
    long for a killed member, even past its session timeout);
    `commit_interval_s` bounds how long outputs wait in an open transaction under exactly_once.
    """
    if processing_guarantee not in GUARANTEES:
        raise ConfigError(f"processing_guarantee must be one of {GUARANTEES}, not {processing_guarantee!r}")
    chosen = [processors] if not isinstance(processors, Sequence) else list(processors)
    app = PipelineApp(
        app_id,
        broker=broker_urls(broker_url),
        datadir=str(data_dir),
        store="memory://",
        processing_guarantee=processing_guarantee,
        topic_partitions=partitions,
        topic_disable_leader=True,
        # exactly_once: faust-streaming 0.15.3 keeps the transactional producer of a partition that
        # moved to another worker if this one holds the partition's standby; the new owner fences it,
        # and when the partition comes back the fenced producer is reused and the agent crashes
        # (ProducerFenced). Without standbys a new owner restores the Table from its changelog.
        table_standby_replicas=0 if processing_guarantee == "exactly_once" else 1,
        web_enabled=False,
        autodiscover=False,
        broker_session_timeout=session_timeout_s,
        broker_rebalance_timeout=rebalance_timeout_s,
        broker_heartbeat_interval=min(1.0, session_timeout_s / 3),
        broker_commit_interval=commit_interval_s,
        consumer_auto_offset_reset="earliest",
        worker_redirect_stdouts=False,
    )
    app.transport = PipelineTransport(app.conf.broker_consumer, app)
    shared_metrics = metrics or Metrics()
    skipped_records = SkippedRecordReader(broker_url)

    async def close_reader(sender: Any, /, *_: Any, signal: Any, **__: Any) -> None:
        await skipped_records.close()

    app.on_before_shutdown.connect(close_reader, weak=False)

    for processor in chosen:
        ProcessorAgent(
            app, processor, config, namespace, partitions=partitions, tick_interval_s=tick_interval_s,
            clock_ms=clock_ms, metrics=shared_metrics, skipped_records=skipped_records,
        )  # fmt: skip
    return app


def pipeline_topics(
    processors: Sequence[Processor], namespace: str, app_id: str, partitions: int
) -> list[NewTopic]:
    """Every topic the app touches, with the app's partition count (changelogs compacted, ticks short-lived)."""
    names: dict[str, dict[str, str]] = {}
    for processor in processors:
        inputs = [topic_name(namespace, t) for t in processor.inputs]
        for name in [
            *inputs,
            *(topic_name(namespace, t) for t in processor.outputs),
            *map(dlq_topic, inputs),
        ]:
            names.setdefault(name, {})
        names[changelog_topic(app_id, processor)] = {"cleanup.policy": "compact"}
        names[tick_topic(app_id, processor)] = {"retention.ms": str(TICK_RETENTION_MS)}
    return [NewTopic(name, partitions, 1, topic_configs=configs) for name, configs in names.items()]


async def create_pipeline_topics(
    processors: Sequence[Processor], namespace: str, app_id: str, broker_url: str, partitions: int = 8
) -> None:
    """Create the app's topics before any worker starts; existing topics are kept as they are."""
    admin = AIOKafkaAdminClient(bootstrap_servers=broker_url.replace(";", ","), client_id=f"{app_id}-admin")
    await admin.start()
    try:
        response = await admin.create_topics(pipeline_topics(processors, namespace, app_id, partitions))
    finally:
        await admin.close()
    failed = [
        (t, code) for t, code, *_ in response.topic_errors if code not in (0, TopicAlreadyExistsError.errno)
    ]
    if failed:
        raise ConfigError(f"the broker at {broker_url} did not create topics: {failed}")


def run_worker(
    processors: Processor | Sequence[Processor],
    config: PipelineConfig,
    namespace: str,
    broker_url: str,
    app_id: str,
    data_dir: str | Path,
    processing_guarantee: str = "exactly_once",
    *,
    partitions: int = 8,
    loglevel: str = "info",
    **options: Any,
) -> None:
    """Create the topics, then run one faust worker of `app_id` in this process until SIGTERM/SIGINT.

    Start as many as needed (on any machines) with the same `app_id`: they form one consumer
    group and share the partitions. Never returns (faust exits the process when the worker stops).
    """
    chosen = [processors] if not isinstance(processors, Sequence) else list(processors)
    asyncio.run(create_pipeline_topics(chosen, namespace, app_id, broker_url, partitions))
    loop = asyncio.new_event_loop()  # asyncio.run closed the previous one; faust's Worker owns this one
    asyncio.set_event_loop(loop)
    app = build_faust_app(
        chosen,
        config,
        namespace,
        broker_url,
        app_id,
        data_dir,
        processing_guarantee,
        partitions=partitions,
        **options,
    )
    worker = faust.Worker(app, loglevel=loglevel, loop=loop, redirect_stdouts=False)
    worker.execute_from_commandline()
