"""The scale-out event log: Apache Kafka (or any Kafka-protocol broker) through aiokafka.

Reads and writes the topics it is asked for on the brokers at `bootstrap_servers`, and the committed
offsets of the consumer groups it is given. Appends go through one idempotent producer (acks=all);
`append_and_commit` uses one transactional producer per group, so outputs and input offsets commit
together; consumers read with isolation_level=read_committed so they never see an aborted output.
Partitions are picked by our `Partitioner`, so a key lands where it lands on the SQLite log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as KafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    CorruptRecordException,
    InvalidMessageError,
    InvalidTimestampError,
    KafkaConnectionError,
    KafkaError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    TopicAlreadyExistsError,
)
from aiokafka.structs import RecordMetadata
from orl.connectors.event_log.base import (
    ConsumedRecord,
    Consumer,
    EventLog,
    EventLogError,
    OutgoingRecord,
    RecordPosition,
    RecordRefused,
    TopicPartition,
    TopicSpec,
)
from orl.connectors.event_log.partitioner import Partitioner
from orl.connectors.event_log.topic_policy import (
    DEFAULT_POLICY,
    RECORD_OVERHEAD_BYTES,
    TopicPolicy,
    power_cut_warning,
)
from orl.schemas.errors import ServiceUnavailable

_TOPIC_ALREADY_EXISTS = TopicAlreadyExistsError.errno
# Errors for one record that no retry can mend: the record is set aside, not sent again.
REFUSED_FOR_GOOD = (
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    CorruptRecordException,
    InvalidMessageError,
    InvalidTimestampError,
)
logger = logging.getLogger(__name__)
_Client = TypeVar("_Client")
_T = TypeVar("_T")
TXN_PRODUCER_STOP_S = 5.0  # a transactional producer given up on may not reach a broker to stop cleanly
_Kafka = TypeVar("_Kafka", AIOKafkaProducer, AIOKafkaConsumer)


@contextlib.contextmanager
def kafka_errors(address: str, action: str) -> Iterator[None]:
    """Turn aiokafka's errors into ours: an unreachable broker is ServiceUnavailable, the rest EventLogError."""
    try:
        yield
    except KafkaConnectionError as exc:
        raise ServiceUnavailable(
            f"Kafka broker at {address} unreachable while trying to {action}: {exc}"
        ) from exc
    except KafkaError as exc:
        raise EventLogError(f"Kafka at {address} refused to {action}: {exc!r}") from exc


async def start_with_retry(
    make: Callable[[], _Client],
    start: Callable[[_Client], Awaitable[None]],
    stop: Callable[[_Client], Awaitable[None]],
    address: str,
    timeout_s: float,
) -> _Client:
    """Make and start a client until one starts, backing off, for at most timeout_s; then raise ServiceUnavailable.

    A fresh client per attempt: aiokafka clients cannot be started twice.
    """
    deadline = time.monotonic() + timeout_s
    backoff_s = 0.2
    while True:
        client = make()
        try:
            await asyncio.wait_for(start(client), timeout=max(deadline - time.monotonic(), 0.1))
            return client
        except (TimeoutError, KafkaError, OSError) as exc:
            await stop(client)
            if time.monotonic() + backoff_s >= deadline:
                raise ServiceUnavailable(
                    f"Kafka broker at {address} unreachable after {timeout_s:g} s: {exc!r}"
                ) from exc
        await asyncio.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, 2.0)


async def _start_client(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    await client.start()


async def stop_client(client: AIOKafkaProducer | AIOKafkaConsumer) -> None:
    """`client.stop()`, where only a cancel of the caller's own task cancels the caller.

    When the broker is away, a consumer's stop cancels the fetch tasks it has in flight and awaits them,
    so their CancelledError comes out of `stop()` (aio-libs/aiokafka#647). Let through, it would end
    the caller's task as if cancelled: a pipeline stage stopped silently that way after a 45 s broker
    outage. The other way round, aiokafka swallows a cancel that arrives while it awaits its own fetch
    task: that one is raised again."""
    task = asyncio.current_task()
    try:
        await client.stop()
    except asyncio.CancelledError:
        if task is None or task.cancelling():
            raise
        logger.warning("a Kafka client stopped with a CancelledError of its own tasks (aiokafka#647)")
        return
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def to_kafka(tp: TopicPartition) -> KafkaTopicPartition:
    return KafkaTopicPartition(tp.topic, tp.partition)


def from_kafka(tp: KafkaTopicPartition) -> TopicPartition:
    return TopicPartition(tp.topic, tp.partition)


class KafkaEventLog(EventLog):
    """`EventLog` over Kafka. `transactional_member` names this process in its transactional ids: give a
    restarted worker the same one, so that its new producer fences the old one and aborts its open transaction.
    `policy` sets the replicas and configs of the topics it creates and the largest record it appends."""

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        client_id: str = "orl",
        connect_timeout_s: float = 15.0,
        session_timeout_s: float = 10.0,
        heartbeat_interval_s: float = 1.0,
        transactional_member: str | None = None,
        policy: TopicPolicy = DEFAULT_POLICY,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.policy = policy
        self.client_id = client_id
        self.connect_timeout_s = connect_timeout_s
        self.session_timeout_s = session_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self._transactional_member = transactional_member or uuid.uuid4().hex
        self._producer: AIOKafkaProducer | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._offsets_reader: AIOKafkaConsumer | None = None
        self._txn_producers: dict[str, AIOKafkaProducer] = {}
        self._partition_counts: dict[str, int] = {}
        self._record_limits: dict[str, int] = {}
        self._partitioner = Partitioner()

    def client_options(self) -> dict[str, Any]:
        return {"bootstrap_servers": self.bootstrap_servers, "client_id": self.client_id}

    def producer_options(self) -> dict[str, Any]:
        return {**self.client_options(), "max_request_size": self.policy.max_message_bytes}

    async def start(self) -> None:
        self._producer = await self._start_idempotent_producer()
        self._admin = await start_with_retry(
            lambda: AIOKafkaAdminClient(**self.client_options()),
            AIOKafkaAdminClient.start,
            AIOKafkaAdminClient.close,
            self.bootstrap_servers,
            self.connect_timeout_s,
        )

    async def connect(self, make: Callable[[], _Kafka]) -> _Kafka:
        """Start a producer or consumer made by `make`, retrying within connect_timeout_s."""
        return await start_with_retry(
            make, _start_client, stop_client, self.bootstrap_servers, self.connect_timeout_s
        )

    def _started(self) -> tuple[AIOKafkaProducer, AIOKafkaAdminClient]:
        if self._producer is None or self._admin is None:
            raise EventLogError(f"the Kafka event log at {self.bootstrap_servers} is not started (or closed)")
        return self._producer, self._admin

    async def _admin_call(self, action: str, call: Callable[[AIOKafkaAdminClient], Awaitable[_T]]) -> _T:
        """One admin request, sent again while it fails in a way a broker failover causes (the node it
        went to is down, a leader is moving), for at most connect_timeout_s."""
        _, admin = self._started()
        deadline = time.monotonic() + self.connect_timeout_s
        backoff_s = 0.1
        while True:
            try:
                with kafka_errors(self.bootstrap_servers, action):
                    return await call(admin)
            except (ServiceUnavailable, EventLogError) as exc:
                transient = getattr(exc.__cause__, "retriable", False) or isinstance(exc, ServiceUnavailable)
                if not transient or time.monotonic() + backoff_s > deadline:
                    raise
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, 1.0)

    async def brokers(self) -> int:
        """How many brokers the cluster has now."""
        cluster = await self._admin_call("describe the cluster", AIOKafkaAdminClient.describe_cluster)
        return len(cluster["brokers"])

    async def _listed_topics(self) -> set[str]:
        return set(await self._admin_call("list topics", AIOKafkaAdminClient.list_topics))

    async def create_topics(self, specs: Sequence[TopicSpec]) -> None:
        replicas = self.policy.replicas(await self.brokers())
        configs = self.policy.topic_configs(replicas)
        unique = {spec.name: spec for spec in reversed(specs)}  # a request naming a topic twice is refused
        new_topics = [
            NewTopic(spec.name, spec.partitions, replicas, topic_configs={**configs, **dict(spec.configs)})
            for spec in unique.values()
        ]
        response = await self._admin_call("create topics", lambda admin: admin.create_topics(new_topics))
        failed = [
            (t, code, msg)
            for t, code, *msg in response.topic_errors
            if code not in (0, _TOPIC_ALREADY_EXISTS)
        ]
        if failed:
            raise EventLogError(f"Kafka at {self.bootstrap_servers} did not create topics: {failed}")
        missing = await self._until_listed(set(unique), self.connect_timeout_s)
        if missing:
            raise EventLogError(
                f"Kafka at {self.bootstrap_servers} created but does not list {sorted(missing)}"
            )

    async def _until_listed(self, topics: set[str], timeout_s: float) -> set[str]:
        """Wait until the metadata lists `topics`, for at most timeout_s; returns those still missing.
        A new topic reaches each broker's metadata a moment after the controller created it."""
        deadline = time.monotonic() + timeout_s
        while True:
            missing = topics - await self._listed_topics()
            if not missing or time.monotonic() > deadline:
                return missing
            await asyncio.sleep(0.05)

    async def _describe_topic(self, topic: str) -> dict[str, Any]:
        # list first: a metadata request naming an unknown topic would auto-create it on most brokers;
        # a topic another process just created may take a moment to be listed by every broker
        if await self._until_listed({topic}, timeout_s=2.0):
            raise EventLogError(f"topic {topic!r} does not exist on Kafka at {self.bootstrap_servers}")
        (description,) = await self._admin_call(
            f"describe topic {topic!r}", lambda admin: admin.describe_topics([topic])
        )
        return dict(description)

    async def power_cut_warning(self, topic: str) -> str | None:
        description = await self._describe_topic(topic)
        return power_cut_warning(topic, min(len(p["replicas"]) for p in description["partitions"]))

    async def partitions_for(self, topic: str) -> int:
        """The topic's partition count, cached once known. During a broker failover a description
        can list no partitions yet: asked again until `connect_timeout_s`, never cached as 0."""
        if topic not in self._partition_counts:
            deadline = time.monotonic() + self.connect_timeout_s
            while not (count := len((await self._describe_topic(topic))["partitions"])):
                if time.monotonic() > deadline:
                    raise EventLogError(
                        f"topic {topic!r} lists no partitions on Kafka at {self.bootstrap_servers} "
                        f"after {self.connect_timeout_s:g} s (its leaders are not elected yet?)"
                    )
                await asyncio.sleep(0.2)
            self._partition_counts[topic] = count
        return self._partition_counts[topic]

    async def record_limit(self, topic: str) -> int:
        """The largest value `topic` takes: the policy's limit, or less when the topic was created with
        a smaller max.message.bytes (by another deployment, or before the limit was raised)."""
        if topic not in self._record_limits:
            resource = ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": None})
            (response,) = await self._admin_call(
                f"describe the configs of {topic!r}", lambda admin: admin.describe_configs([resource])
            )
            configs = {name: value for name, value, *_ in response.resources[0][4]}
            topic_limit = int(configs.get("max.message.bytes") or self.policy.max_message_bytes)
            self._record_limits[topic] = min(
                self.policy.max_record_bytes, topic_limit - RECORD_OVERHEAD_BYTES
            )
        return self._record_limits[topic]

    async def _send_all(
        self, producer: AIOKafkaProducer, outputs: Sequence[tuple[str, OutgoingRecord]]
    ) -> list[RecordPosition]:
        """Send every output and wait for all. RecordRefused if any was refused for good, saying where
        the others went: each one sent is waited for, and None marks those that were not appended."""
        sent: list[asyncio.Future[Any] | None] = []
        refused: dict[int, str] = {}
        for index, (topic, record) in enumerate(outputs):
            limit = await self.record_limit(topic)
            why = self.policy.oversized(record.value)
            if why is None and len(record.value) > limit:
                why = (
                    f"record of {len(record.value)} bytes exceeds the {limit}-byte limit of {topic!r} "
                    "(its max.message.bytes is below this log's --max-record-bytes)"
                )
            if why is not None:
                refused[index] = why
                sent.append(None)
                continue
            partition = self._partitioner.partition(topic, record.key, await self.partitions_for(topic))
            headers = list(record.headers) or None
            try:
                future = await producer.send(
                    topic, record.value, key=record.key, partition=partition, headers=headers
                )
            except REFUSED_FOR_GOOD as exc:  # the producer's own check (max_request_size)
                refused[index] = f"the producer refused it: {exc!r}"
                future = None
            sent.append(future)
        results = await asyncio.gather(*(f for f in sent if f is not None), return_exceptions=True)
        outcomes = iter(results)
        positions: list[RecordPosition | None] = []
        failed: list[BaseException] = []
        for index, future in enumerate(sent):
            result = None if future is None else next(outcomes)
            if isinstance(result, REFUSED_FOR_GOOD):
                refused[index] = f"the broker refused it: {result!r}"
            elif isinstance(result, BaseException):
                failed.append(result)
            positions.append(
                RecordPosition(result.partition, result.offset)
                if isinstance(result, RecordMetadata)
                else None
            )
        if any(isinstance(result, REFUSED_FOR_GOOD) for result in results):
            # The refused batch took sequence numbers the broker never saw: every later batch of this
            # idempotent producer would fail with OutOfOrderSequenceNumber. A new producer starts afresh.
            await self._replace_producer(producer)
        if refused:
            raise RecordRefused(outputs[min(refused)][0], refused, positions)
        if failed:
            raise failed[0]  # a transient failure: the caller sends the batch again
        return [position for position in positions if position is not None]

    async def _replace_producer(self, producer: AIOKafkaProducer) -> None:
        """Stop the idempotent producer and start a new one (a transactional one is left alone: its
        transaction aborts, and the next one starts with fresh sequence numbers)."""
        if producer is not self._producer:
            return
        self._producer = None
        await stop_client(producer)
        self._producer = await self._start_idempotent_producer()

    async def _start_idempotent_producer(self) -> AIOKafkaProducer:
        """The producer of plain appends: idempotent, acks=all (every in-sync replica has the record)."""
        return await self.connect(
            lambda: AIOKafkaProducer(**self.producer_options(), enable_idempotence=True, acks="all")
        )

    async def append(self, topic: str, record: OutgoingRecord) -> RecordPosition:
        return (await self.append_batch(topic, [record]))[0]

    async def append_batch(self, topic: str, records: Sequence[OutgoingRecord]) -> list[RecordPosition]:
        producer, _ = self._started()
        with kafka_errors(self.bootstrap_servers, f"append to {topic!r}"):
            return await self._send_all(producer, [(topic, record) for record in records])

    async def append_and_commit(
        self,
        outputs: Sequence[tuple[str, OutgoingRecord]],
        group_id: str,
        offsets: Mapping[TopicPartition, int],
    ) -> None:
        producer = await self._txn_producer(group_id)
        try:
            with kafka_errors(self.bootstrap_servers, f"commit a transaction for group {group_id!r}"):
                async with producer.transaction():
                    await self._send_all(producer, outputs)
                    if offsets:
                        kafka_offsets = {to_kafka(tp): offset for tp, offset in offsets.items()}
                        await producer.send_offsets_to_transaction(kafka_offsets, group_id)
        except EventLogError:
            # Fenced (a newer producer with our transactional id took over) or failed mid-transaction
            # (a broker away): this producer is done. The next transaction of the group starts a new
            # one with the same transactional id, which aborts whatever this one left open.
            if self._txn_producers.get(group_id) is producer:
                del self._txn_producers[group_id]
            with contextlib.suppress(Exception):
                await asyncio.wait_for(stop_client(producer), TXN_PRODUCER_STOP_S)
            raise

    async def _txn_producer(self, group_id: str) -> AIOKafkaProducer:
        if group_id not in self._txn_producers:
            self._started()
            transactional_id = f"orl-{group_id}-{self._transactional_member}"
            self._txn_producers[group_id] = await self.connect(
                lambda: AIOKafkaProducer(**self.producer_options(), transactional_id=transactional_id)
            )
        return self._txn_producers[group_id]

    async def end_offsets(self, topic: str) -> dict[int, int]:
        partitions = await self.partitions_for(topic)
        if self._offsets_reader is None:
            self._offsets_reader = await self.connect(
                lambda: AIOKafkaConsumer(**self.client_options(), enable_auto_commit=False)
            )
        tps = [KafkaTopicPartition(topic, p) for p in range(partitions)]
        with kafka_errors(self.bootstrap_servers, f"read end offsets of {topic!r}"):
            ends = await self._offsets_reader.end_offsets(tps)
        return {tp.partition: offset for tp, offset in ends.items()}

    def consumer(
        self, group_id: str, topics: Sequence[str], *, auto_offset_reset: str = "earliest"
    ) -> Consumer:
        if auto_offset_reset not in ("earliest", "latest"):
            raise EventLogError(
                f"auto_offset_reset must be 'earliest' or 'latest', not {auto_offset_reset!r}"
            )
        return KafkaConsumer(self, group_id, list(topics), auto_offset_reset)

    async def close(self) -> None:
        for client in [self._producer, self._offsets_reader, *self._txn_producers.values()]:
            if client is not None:
                await stop_client(client)
        if self._admin is not None:
            await self._admin.close()
        self._producer, self._admin, self._offsets_reader, self._txn_producers = None, None, None, {}


class KafkaConsumer(Consumer):
    """A member of a Kafka consumer group (no auto-commit, read_committed)."""

    def __init__(self, log: KafkaEventLog, group_id: str, topics: list[str], auto_offset_reset: str) -> None:
        self._log = log
        self._address = log.bootstrap_servers
        self._group_id = group_id
        self._topics = topics
        self._reset = auto_offset_reset
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        consumer = AIOKafkaConsumer(
            *self._topics,
            **self._log.client_options(),
            group_id=self._group_id,
            enable_auto_commit=False,
            auto_offset_reset=self._reset,
            isolation_level="read_committed",
            session_timeout_ms=int(self._log.session_timeout_s * 1000),
            heartbeat_interval_ms=int(self._log.heartbeat_interval_s * 1000),
        )
        # One attempt, not start_with_retry: a retry would join as a new member. Joining may wait for
        # the coordinator to expire a dead member (one session timeout), hence the longer bound.
        join_timeout_s = self._log.connect_timeout_s + 2 * self._log.session_timeout_s
        try:
            with kafka_errors(self._address, f"join group {self._group_id!r}"):
                await asyncio.wait_for(consumer.start(), timeout=join_timeout_s)
        except TimeoutError as exc:
            await stop_client(consumer)
            raise ServiceUnavailable(
                f"Kafka at {self._address}: no assignment in group {self._group_id!r} within {join_timeout_s:g} s"
            ) from exc
        except (ServiceUnavailable, EventLogError):
            await stop_client(consumer)
            raise
        self._consumer = consumer

    def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            raise EventLogError(f"the consumer of group {self._group_id!r} is not started (or closed)")
        return self._consumer

    async def assignment(self) -> set[TopicPartition]:
        return {from_kafka(tp) for tp in self._started().assignment()}

    async def poll(self, max_records: int = 500, timeout_s: float = 1.0) -> list[ConsumedRecord]:
        with kafka_errors(self._address, f"poll for group {self._group_id!r}"):
            batches = await self._started().getmany(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        return [
            ConsumedRecord(r.topic, r.partition, r.offset, r.key, r.value, tuple(r.headers), r.timestamp)
            for _, records in sorted(batches.items())
            for r in records
        ]

    async def position(self, tp: TopicPartition) -> int:
        with kafka_errors(self._address, f"read the position of {tp}"):
            return int(await self._started().position(self._owned([tp])[0]))

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        consumer = self._started()
        with kafka_errors(self._address, f"commit offsets of group {self._group_id!r}"):
            if offsets is None:
                positions = {tp: await consumer.position(tp) for tp in consumer.assignment()}
            else:
                positions = {to_kafka(tp): offset for tp, offset in offsets.items()}
            if positions:
                await consumer.commit(positions)

    async def committed(self, tp: TopicPartition) -> int | None:
        with kafka_errors(self._address, f"read the committed offset of {tp}"):
            offset = await self._started().committed(to_kafka(tp))
        return None if offset is None or offset < 0 else int(offset)

    def _owned(self, tps: Sequence[TopicPartition] | None) -> list[KafkaTopicPartition]:
        assigned = self._started().assignment()
        chosen = sorted(assigned) if tps is None else [to_kafka(tp) for tp in tps]
        foreign = [tp for tp in chosen if tp not in assigned]
        if foreign:
            raise EventLogError(f"partitions {foreign} are not assigned to this member of {self._group_id!r}")
        return chosen

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        if offset < 0:
            raise EventLogError(f"cannot seek {tp} to negative offset {offset}")
        self._started().seek(self._owned([tp])[0], offset)

    async def seek_to_beginning(self, tps: Sequence[TopicPartition] | None = None) -> None:
        with kafka_errors(self._address, "seek to the beginning"):
            await self._started().seek_to_beginning(*self._owned(tps))

    async def seek_to_timestamp(self, timestamp_ms: int, tps: Sequence[TopicPartition] | None = None) -> None:
        consumer, owned = self._started(), self._owned(tps)
        with kafka_errors(self._address, f"look up offsets for timestamp {timestamp_ms}"):
            found = await consumer.offsets_for_times({tp: timestamp_ms for tp in owned})
            ends = await consumer.end_offsets(owned)
        for tp in owned:
            hit = found.get(tp)
            consumer.seek(tp, ends[tp] if hit is None else hit.offset)

    async def lag(self) -> dict[TopicPartition, int]:
        consumer = self._started()
        owned = sorted(consumer.assignment())
        with kafka_errors(self._address, f"compute the lag of group {self._group_id!r}"):
            ends = await consumer.end_offsets(owned)
            beginnings = await consumer.beginning_offsets(owned)
            committed = {tp: await self.committed(from_kafka(tp)) for tp in owned}
        return {
            from_kafka(tp): ends[tp] - (beginnings[tp] if committed[tp] is None else committed[tp])
            for tp in owned
        }

    async def close(self) -> None:
        if self._consumer is not None:
            with kafka_errors(self._address, f"leave group {self._group_id!r}"):
                await stop_client(self._consumer)
        self._consumer = None
