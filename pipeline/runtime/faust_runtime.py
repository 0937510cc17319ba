"""The scale-out runtime: the pure processors as faust-streaming agents with changelog-backed Tables.

Each agent is a thin I/O shell around the processor host (pipeline/runtime/host.py), as
StreamRunner is on the embedded log, so both decode, key, dead-letter, encode and store states
the same way and produce the same output bytes:

- One agent per processor reads its input topics (`<namespace>.<topic>`) as raw bytes and hands
  each record to the host; it sends the host's outputs (emits keyed by session_id, or the
  DeadLettered event of an undecodable record on `<topic>.dlq`) and stores the new state.
- State is a faust Table keyed by session_id (`<app_id>-<processor>-state-changelog`) holding the
  host's changelog bytes; None deletes it.
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
consumer works around faust-streaming 0.15.3 defects (pipeline/runtime/faust_patches.py, which
pins that version); with it an agent handles records the stream skipped before later ones.

Reads: the processors' input topics (also directly, for skipped records), their tick topics and
changelogs. Writes: their output topics, `<input>.dlq`, their changelogs and tick topics.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import faust
from faust.types import EventT, StreamT, TopicT
from mode import CrashingSupervisor
from orl.connectors.event_log.base import ConsumedRecord, TopicSpec
from orl.connectors.event_log.kafka_log import KafkaEventLog
from orl.connectors.event_log.partitioner import partition_for_key
from orl.connectors.event_log.topic_policy import DEFAULT_POLICY, TopicPolicy
from orl.connectors.metrics import Metrics
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Processor
from orl.pipeline.processors.event_building import State
from orl.pipeline.runtime.faust_patches import (
    InputProgress,
    PipelineApp,
    PipelineConsumer,
    PipelineTransport,
    SkippedRecordReader,
    check_faust_version,
)
from orl.pipeline.runtime.host import Output, ProcessorHost, wall_clock_ms
from orl.schemas.errors import ConfigError
from orl.schemas.topics import dlq_topic, topic_name

logger = logging.getLogger(__name__)

GUARANTEES = ("exactly_once", "at_least_once")
TICK_RETENTION_MS = 3_600_000
RAW: dict[str, Any] = {
    "key_type": bytes,
    "value_type": bytes,
    "key_serializer": "raw",
    "value_serializer": "raw",
}


def table_name(processor: Processor) -> str:
    return f"{processor.name}-state"


def changelog_topic(app_id: str, processor: Processor) -> str:
    """faust's name for the Table's changelog: `<app_id>-<table>-changelog`."""
    return f"{app_id}-{table_name(processor)}-changelog"


def tick_topic(app_id: str, processor: Processor) -> str:
    return f"{app_id}-{processor.name}-ticks"


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
        self.host = ProcessorHost(processor, config, namespace, metrics)
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
        # The decoded state beside the Table's bytes it came from (a restore brings new bytes: decoded
        # again), and each session's partition: ticks would otherwise redo both for every session.
        self._decoded: dict[str, tuple[bytes, State]] = {}
        self._partitions_of: dict[str, int] = {}
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
                record = ConsumedRecord(
                    message.topic,
                    message.partition,
                    message.offset,
                    message.key,
                    message.value or b"",
                    timestamp_ms=round(message.timestamp * 1000),  # faust gives seconds
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

    async def handle_in_order(self, record: ConsumedRecord) -> None:
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

    async def handle(self, record: ConsumedRecord) -> None:
        step = self.host.handle(record, self.load)
        await self.send_outputs(step.outputs)
        if step.processed:
            self.store(step.key, step.state)
        self.host.report_metrics(1)

    async def tick(self, partition: int, now_ms: int) -> None:
        """on_tick for every session of `partition` (the tick record's partition, owned by this worker)."""
        owned = sorted(key for key in self.table if self.partition_of(key) == partition)
        sessions = [(key, state) for key in owned if (state := self.load(key)) is not None]
        changed, emits = self.host.tick(sessions, now_ms)
        await self.send_outputs(self.host.encode(emits))
        for key, new_state in changed.items():
            self.store(key, new_state)
        self.host.report_metrics(0)

    def load(self, key: str) -> State | None:
        """The session's state: decoded once per stored value (ticks read every session every second)."""
        stored = self.table.get(key)
        if stored is None:
            return None
        cached = self._decoded.get(key)
        if cached is not None and cached[0] is stored:  # the very bytes this worker stored or decoded
            return cached[1]
        state = self.host.state_from_bytes(key, stored)
        if state is not None:  # None: a forgotten session's state (`orl forget`) reads as none
            self._decoded[key] = (stored, state)
        return state

    def partition_of(self, key: str) -> int:
        # Kafka's default partitioner, as the producers of our topics use it (keys are session ids).
        partition = self._partitions_of.get(key)
        if partition is None:
            partition = self._partitions_of[key] = partition_for_key(key.encode(), self.partitions)
        return partition

    def store(self, key: str, state: State | None) -> None:
        if state is None:
            self._decoded.pop(key, None)
            self._partitions_of.pop(key, None)
            if key in self.table:
                del self.table[key]
        else:
            value = self.host.state_bytes(key, state)
            self.table[key] = value
            self._decoded[key] = (value, state)

    async def send_outputs(self, outputs: Sequence[Output]) -> None:
        for topic, record in outputs:
            await self.send(topic, record.key, record.value)

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
    replicas: int = 1,
    max_message_bytes: int = DEFAULT_POLICY.max_message_bytes,
    tick_interval_s: float = 1.0,
    session_timeout_s: float = 10.0,
    rebalance_timeout_s: float = 60.0,
    commit_interval_s: float = 1.0,
    clock_ms: Callable[[], int] = wall_clock_ms,
    metrics: Metrics | None = None,
) -> faust.App:
    """A faust app with one agent, Table and tick timer per processor; all workers share `app_id` (the group).

    `replicas` is the replication factor of any topic faust creates itself (create the app's topics
    first with `create_pipeline_topics`, which returns it); `max_message_bytes` its producer's
    max_request_size (`TopicPolicy.max_message_bytes`);
    `session_timeout_s` is how long a killed worker keeps its partitions;
    `rebalance_timeout_s` how long a rebalance waits for members to rejoin;
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
        topic_replication_factor=replicas,
        producer_max_request_size=max_message_bytes,
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
) -> list[TopicSpec]:
    """Every topic the app touches, with the app's partition count (changelogs compacted, ticks short-lived)."""
    names: dict[str, tuple[tuple[str, str], ...]] = {}
    for processor in processors:
        inputs = [topic_name(namespace, t) for t in processor.inputs]
        for name in [
            *inputs,
            *(topic_name(namespace, t) for t in processor.outputs),
            *map(dlq_topic, inputs),
        ]:
            names.setdefault(name, ())
        names[changelog_topic(app_id, processor)] = (("cleanup.policy", "compact"),)
        names[tick_topic(app_id, processor)] = (("retention.ms", str(TICK_RETENTION_MS)),)
    return [TopicSpec(name, partitions, configs) for name, configs in names.items()]


async def create_pipeline_topics(
    processors: Sequence[Processor],
    namespace: str,
    app_id: str,
    broker_url: str,
    partitions: int = 8,
    policy: TopicPolicy = DEFAULT_POLICY,
) -> int:
    """Create the app's topics before any worker starts, as the Kafka log creates every topic (replicas
    and configs from `policy`); existing topics are kept as they are. Returns the replication factor."""
    async with KafkaEventLog(broker_url.replace(";", ","), client_id=f"{app_id}-admin", policy=policy) as log:
        await log.create_topics(pipeline_topics(processors, namespace, app_id, partitions))
        return policy.replicas(await log.brokers())


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
    policy: TopicPolicy = DEFAULT_POLICY,
    loglevel: str = "info",
    **options: Any,
) -> None:
    """Create the topics, then run one faust worker of `app_id` in this process until SIGTERM/SIGINT.

    Start as many as needed (on any machines) with the same `app_id`: they form one consumer
    group and share the partitions. Never returns (faust exits the process when the worker stops).
    """
    check_faust_version()
    chosen = [processors] if not isinstance(processors, Sequence) else list(processors)
    replicas = asyncio.run(create_pipeline_topics(chosen, namespace, app_id, broker_url, partitions, policy))
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
        replicas=replicas,
        max_message_bytes=policy.max_message_bytes,
        **options,
    )
    worker = faust.Worker(app, loglevel=loglevel, loop=loop, redirect_stdouts=False)
    # faust's terminal spinner (on at loglevel warning and above) sets the root logger to DEBUG, so every
    # debug record of aiokafka and faust is built and handled: about 5% of a busy worker's CPU (py-spy)
    worker.spinner = None
    worker.execute_from_commandline()
