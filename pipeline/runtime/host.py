"""The processor host: what every runtime does with one stage's records, with no I/O of its own.

decode -> key -> session state -> process (or plan) -> encoded outputs / dead letter -> changelog
bytes, and the ticks' time-based work. The runtimes are I/O shells around it: StreamRunner (any
EventLog), the faust agent (Kafka, faust Tables) and MemoryRunner (a replay held in memory) fetch
records, keep the states where their runtime keeps them and write what the host hands back, so
the three cannot drift apart in how they decode, key, dead-letter, encode or store a state.

Processing-error policy (as Kafka Streams' processing-exception handler can be set to continue): a
record the stage cannot process is dead-lettered, not retried. An undecodable record, and a decoded
one whose processing raises (a stage's bug or an event it cannot take) with the error and its
traceback: no output of it is written, the runtime commits past the record, and the
`dead_lettered` metric and a log line say so. (A processor that changed its session's state in place
before raising leaves that change: stages read and check an event before they change anything.) A pure step is deterministic, so its first failure
would be its every failure: before this policy, the process died and its restart replayed the same
record and died again.

A changelog value is the state as the stage's `state_codec` writes it (pipeline/processors/contract.py);
an empty value deletes the session. A tick changes a state only by returning another object or
emitting something (pipeline/processors/contract.py), so ticks never serialise unchanged states.
Reads and writes no topics itself.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from orl.connectors.event_log.base import ConsumedRecord, OutgoingRecord
from orl.connectors.metrics import Metrics
from orl.pipeline.effects.contract import EffectCall, EffectStage
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, Processor
from orl.pipeline.processors.event_building import Event, State
from orl.pipeline.processors.state_codec import StateCodec
from orl.pipeline.runtime.shared_decodes import SharedDecodes
from orl.schemas.codec import encode, installed_data_keys
from orl.schemas.errors import EventDecodeError
from orl.schemas.event_constructors import dead_lettered
from orl.schemas.events import EventOrigin
from orl.schemas.sealing import PayloadForgotten, is_sealed_blob, open_blob, seal_blob
from orl.schemas.topics import dlq_topic, record_key, topic_name

logger = logging.getLogger(__name__)

DEAD_LETTER_PRODUCER = "pipeline/0.1.0"
Output = tuple[str, OutgoingRecord]  # (full topic name, record)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


@dataclass(slots=True)  # not frozen: one per record, and frozen dataclasses are slower to build
class Step:
    """What one input record did: the session's key and new state (None: deleted), its outputs
    (encoded emits, or the dead letter of a record the stage cannot process) and, for an effect stage,
    the calls to perform, and the event's occurred_at. `processed` is False for a dead-lettered
    record (no state is stored for it)."""

    key: str
    state: State | None
    outputs: list[Output]
    calls: list[EffectCall]
    occurred_at: int = 0
    processed: bool = True


@dataclass
class ProcessorHost:
    """One stage (pure processor or effect stage) as every runtime runs it."""

    stage: Processor | EffectStage
    config: PipelineConfig
    namespace: str  # for topic names; MemoryRunner hands the host decoded events and names no topic
    metrics: Metrics = field(default_factory=Metrics)
    # shared by the runners of one process (pipeline/runtime/shared_decodes.py); None: a private one
    decodes: SharedDecodes | None = None
    # decided once: a Protocol isinstance check costs ~40 us, too much per record
    effect: EffectStage | None = None
    pure: Processor | None = None
    # events emitted per catalog topic since the last `report_metrics` (a metric update per record costs
    # more than the record's processing)
    emitted: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.stage, EffectStage):
            self.effect = self.stage
        else:
            self.pure = self.stage
        if self.decodes is not None:
            self.decodes.subscribe(self.input_topics)

    @property
    def name(self) -> str:
        return self.stage.name

    @property
    def state_codec(self) -> StateCodec:
        """How the stage's session states become changelog values and back."""
        return self.stage.state_codec

    def forgotten(self, key: str) -> bool:
        """Whether `orl forget` destroyed the session's keys: its state is dropped, not carried on
        (a session once forgotten stays so: what arrives for it later is recorded, sealed under a new
        key, and starts from no state)."""
        keys = installed_data_keys()
        return keys is not None and bool(key) and keys.was_forgotten(key)

    def state_bytes(self, key: str, state: State) -> bytes:
        """The session's state as its changelog value: sealed with the session's data key when this
        process has a key store (orl.schemas.sealing), since a state holds the turn's text."""
        value = self.state_codec.to_bytes(state)
        keys = installed_data_keys()
        return seal_blob(value, key, f"changelog:{self.name}", keys) if keys is not None and key else value

    def state_from_bytes(self, key: str, value: bytes) -> State | None:
        """The state a changelog value holds; None when the session was forgotten (`orl forget`)."""
        if is_sealed_blob(value):
            keys = installed_data_keys()
            if keys is None:
                raise EventDecodeError(
                    f"{self.name}: the state of session {key!r} is sealed and this process has no key store"
                )
            try:
                value = open_blob(value, key, f"changelog:{self.name}", keys)
            except PayloadForgotten:
                return None
        return self.state_codec.from_bytes(value)

    @property
    def input_topics(self) -> list[str]:
        """The full names of the stage's input topics."""
        return [topic_name(self.namespace, topic) for topic in self.stage.inputs]

    @property
    def output_topics(self) -> list[str]:
        return [topic_name(self.namespace, topic) for topic in self.stage.outputs]

    @property
    def dead_letter_topics(self) -> list[str]:
        return [dlq_topic(topic) for topic in self.input_topics]

    def _private_decodes(self) -> SharedDecodes:
        """A cache of this stage's own: the decode path is the same as when decodes are shared."""
        self.decodes = SharedDecodes()
        self.decodes.subscribe(self.input_topics)
        return self.decodes

    def handle(self, record: ConsumedRecord, state_of: Callable[[str], State | None]) -> Step:
        """One input record; `state_of(key)` is the session's stored state (None: nothing stored).

        The state key is the record key (the session id), else the event's key (orl.schemas.topics.record_key).
        """
        try:
            decodes = self.decodes if self.decodes is not None else self._private_decodes()  # it has a len()
            event = decodes.decode(record)
        except (
            PayloadForgotten
        ):  # `orl forget` destroyed the session's key: nothing to learn from, nothing to keep
            self.metrics.count("forgotten_skipped", topic=record.topic, processor=self.name)
            return Step("", None, [], [], processed=False)
        except EventDecodeError as error:
            return Step("", None, [self.dead_letter(record, str(error))], [], processed=False)
        envelope = event["envelope"]
        key = (record.key or b"").decode() or (record_key(event) or "")
        state = state_of(key)
        if state is not None and self.forgotten(key):
            state = None  # what the forgotten session said before is not carried into anything new
        try:
            new_state, emits, calls = self.step(state, event)
            outputs = self.encode(emits)
        except Exception as error:  # noqa: BLE001 - the processing-error policy (module docstring)
            logger.exception("%s cannot process %s", self.name, envelope["event_id"])
            reason = f"{self.name} raised {type(error).__name__}: {error}\n{traceback.format_exc()}"
            return Step("", None, [self.dead_letter(record, reason)], [], processed=False)
        return Step(key, new_state, outputs, calls, envelope["occurred_at"])

    def step(self, state: State | None, event: Event) -> tuple[State | None, list[Emit], list[EffectCall]]:
        """One decoded event through the stage: (new state, emits, calls to perform)."""
        if self.effect is not None:
            new_state, calls = self.effect.plan(state, event, self.config)
            return new_state, [], calls
        assert self.pure is not None
        new_state, emits = self.pure.process(state, event, self.config)
        return new_state, emits, []

    def tick(
        self, sessions: Iterable[tuple[str, State]], now_ms: int
    ) -> tuple[dict[str, State | None], list[Emit]]:
        """Time-based work for `sessions` (key, state): (the changed states by key, the emits)."""
        changed: dict[str, State | None] = {}
        emits_all: list[Emit] = []
        for key, state in sessions:
            if self.forgotten(key):  # `orl forget`: the state is dropped, never written again
                changed[key] = None
                continue
            new_state, emits = self.stage.on_tick(state, now_ms, self.config)
            if emits or new_state is not state:
                changed[key] = new_state
            emits_all.extend(emits)
        return changed, emits_all

    def encode(self, emits: list[Emit]) -> list[Output]:
        """The emits as records keyed by session id (orl.schemas.topics.record_key), on their full topic names."""
        if not emits:
            return []
        out = []
        emitted = self.emitted
        for emit in emits:
            key = record_key(emit.event)
            record = OutgoingRecord(value=encode(emit.event), key=key.encode() if key is not None else None)
            out.append((topic_name(self.namespace, emit.topic), record))
            emitted[emit.topic] = emitted.get(emit.topic, 0) + 1
        return out

    def report_metrics(self, records: int) -> None:
        """Count `records` handled and the events emitted since the last report (once per batch)."""
        self.metrics.count("records_processed", records, processor=self.name)
        for topic, count in self.emitted.items():
            self.metrics.count("events_emitted", count, topic=topic, processor=self.name)
        self.emitted.clear()

    def dead_letter(self, record: ConsumedRecord, error: str) -> Output:
        """The DeadLettered event for a record the stage cannot process, on `<topic>.dlq`, with the
        original bytes."""
        self.metrics.count("dead_lettered", topic=record.topic, processor=self.name)
        logger.warning("dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, error)
        origin = EventOrigin(
            namespace=self.namespace,
            producer=DEAD_LETTER_PRODUCER,
            occurred_at_ms=record.timestamp_ms,
            id_parts=(record.topic, record.partition, record.offset),
        )
        event = dead_lettered(
            origin,
            source_topic=record.topic,
            source_partition=record.partition,
            source_offset=record.offset,
            original_bytes=record.value,
            error=error,
        )
        return dlq_topic(record.topic), OutgoingRecord(value=encode(event), key=record.key)
