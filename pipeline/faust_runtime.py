"""The scale-out runtime: the pure processors as faust-streaming agents with changelog-backed Tables.

Same semantics and the same output bytes as `pipeline.stream_runner.StreamRunner`, on Kafka:

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
workers hit (tests/integration/test_faust_multiworker.py).

Reads: the processors' input topics, their tick topics and changelogs. Writes: their output
topics, `<input>.dlq`, their changelogs and tick topics.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import IllegalOperation, TopicAlreadyExistsError
from faust.transport.drivers import aiokafka as faust_aiokafka
from faust.types import EventT, StreamT, TopicT
from mode import CrashingSupervisor

from connectors.event_log.partitioner import partition_for_key
from connectors.metrics import Metrics
from pipeline.config import PipelineConfig
from pipeline.dead_letters import dead_letter_event
from pipeline.processor import Emit, Processor
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


class ProcessorAgent:
    """Binds one pure processor to a faust agent, its Table, its tick topic and its tick timer."""

    def __init__(
        self,
        app: faust.App,
        processor: Processor,
        config: PipelineConfig,
        namespace: str,
        *,
        partitions: int,
        tick_interval_s: float,
        clock_ms: Callable[[], int],
        metrics: Metrics,
    ) -> None:
        self.app, self.processor, self.config, self.namespace = app, processor, config, namespace
        self.partitions, self.clock_ms, self.metrics = partitions, clock_ms, metrics
        self.acknowledge_outputs = app.conf.processing_guarantee.value == "at_least_once"
        # str keys and bytes values travel raw: the changelog holds session ids and the JSON state bytes
        self.table = app.Table(table_name(processor), key_type=str, value_type=bytes, partitions=partitions)
        self.tick_topic = tick_topic(app.conf.id, processor)
        self.inputs = tuple(topic_name(namespace, topic) for topic in processor.inputs)
        self._topics: dict[str, TopicT] = {}
        self._owned: list[int] = []
        source = app.topic(*self.inputs, self.tick_topic, partitions=partitions, **RAW)
        # CrashingSupervisor: an unexpected error stops the worker loudly instead of restarting the
        # agent past the failing record; a restart is safe because state and offsets agree.
        app.agent(source, name=f"orl.{processor.name}", supervisor_strategy=CrashingSupervisor)(self.consume)
        app.timer(tick_interval_s, name=f"orl.{processor.name}.ticks")(self.send_ticks)

    async def consume(self, stream: StreamT) -> None:
        event: EventT
        async for event in stream.events():
            if event.message.topic == self.tick_topic:
                await self.tick(event.message.partition, int(event.value))
            else:
                await self.handle(event)

    async def handle(self, event: EventT) -> None:
        message = event.message
        try:
            decoded = decode(message.value or b"")
        except EventDecodeError as error:
            await self.dead_letter(message, str(error))
            return
        key = (message.key or b"").decode() or str(decoded["envelope"].get("session_id") or "")
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

    async def dead_letter(self, message: Any, error: str) -> None:
        self.metrics.count("dead_lettered", topic=message.topic, processor=self.processor.name)
        logger.warning(
            "dead-lettering %s[%d]@%d: %s", message.topic, message.partition, message.offset, error
        )
        event = dead_letter_event(
            self.namespace,
            message.topic,
            message.partition,
            message.offset,
            message.value,
            error,
            round(message.timestamp * 1000),
        )  # faust gives seconds
        await self.send(dlq_topic(message.topic), message.key, encode(event))

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


class PipelineConsumer(faust_aiokafka.Consumer):
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
    app = faust.App(
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
    for processor in chosen:
        ProcessorAgent(
            app, processor, config, namespace, partitions=partitions, tick_interval_s=tick_interval_s,
            clock_ms=clock_ms, metrics=shared_metrics,
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
