"""From sample-topic records to training batches of exactly N effective samples, with exact offsets.

Pure logic over `ConsumedRecord`s (no I/O, no clock): the loop feeds every polled record of the
`<namespace>.samples` topic in arrival order; `take` returns the next batch once N trainable samples
are pending. A batch covers a prefix of the pending records (per partition, a prefix in offset
order): every record of the prefix is either trained or skipped with a counted reason, and
`Batch.consumed_offsets` is, per partition, the offset after the last record of that prefix. Records
after the N-th sample stay pending for the next batch; they are not covered by the offsets, so a
restart from a manifest re-reads them (none trained twice, none skipped).

Skip reasons (counted; the decision depends only on the record and the version being trained, so a
restart decides the same): rejected (SampleRejected upstream), stale, duplicate (a sample id already
trained), undecodable, forgotten (its data key was destroyed: `orl forget`), unknown_event,
unknown_method, empty_response, malformed (lengths that do not match the response, non-finite values, top-K rows that are not [T][K]), held_out (a session held out
for the promotion gate: `orl.schemas.ids.held_out_session`).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from orl.connectors.event_log.base import ConsumedRecord, TopicPartition
from orl.rules.top_k import top_k_rows_aligned
from orl.schemas.codec import FORGOTTEN, decode
from orl.schemas.errors import EventDecodeError, UnknownEventTypeError
from orl.schemas.event_types import SampleReady
from orl.schemas.ids import held_out_session
from orl.schemas.sealing import PayloadForgotten

METHODS = ("binary", "opd", "combined")
SEEN_IDS_KEPT = 100_000  # duplicate detection window (sample ids); far more than any redelivery spans


@dataclass(frozen=True)
class TrainingSample:
    """The fields of a SampleReady the loss needs, plus where it came from."""

    sample_id: str
    method: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    rollout_logprobs: tuple[float, ...]
    temperature: float
    reward: float | None
    teacher_logprobs: tuple[float, ...] | None
    policy_version: int
    position: TopicPartition
    offset: int
    teacher_top_ids: tuple[tuple[int, ...], ...] | None = None  # [T][K] for top-K distillation
    teacher_top_logprobs: tuple[tuple[float, ...], ...] | None = None  # [T][K], at `temperature`
    promoted: bool = False  # an at-least-one promotion: its reward is not a judgement of the answer


@dataclass(frozen=True)
class Batch:
    samples: tuple[TrainingSample, ...]
    consumed_offsets: dict[TopicPartition, int]  # next offset to read, per partition, after this batch
    skipped: dict[str, int]  # reason -> records of this batch's prefix that were not trained
    staleness: tuple[int, ...]  # current version - sample's policy version, per sample

    @property
    def sample_ids(self) -> list[str]:
        return [s.sample_id for s in self.samples]

    @property
    def mean_staleness(self) -> float:
        return sum(self.staleness) / len(self.staleness) if self.staleness else 0.0


@dataclass(frozen=True)
class _Pending:
    record: ConsumedRecord
    event: dict[str, Any] | None  # None when the bytes did not decode
    event_type: str  # "" when they did not decode; FORGOTTEN when the payload was forgotten


def _decoded(record: ConsumedRecord) -> _Pending:
    try:
        event = decode(record.value)
    except PayloadForgotten:  # `orl forget`: the sample is not trained on
        return _Pending(record, None, FORGOTTEN)
    except (EventDecodeError, UnknownEventTypeError):
        return _Pending(record, None, "")
    return _Pending(record, event, str(event["envelope"]["event_type"]))


def _finite(values: Iterable[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def sample_problem(event: SampleReady) -> str | None:
    """Why a decoded SampleReady cannot be trained (a skip reason), or None if it can."""
    response = event["response_token_ids"]
    teacher = event["teacher_logprobs"]
    if event["method"] not in METHODS:
        return "unknown_method"
    if not response:
        return "empty_response"
    malformed = (
        not event["prompt_token_ids"]
        or len(event["old_logprobs"]) != len(response)
        or (teacher is not None and len(teacher) != len(response))
        or not _finite(event["old_logprobs"])
        or (teacher is not None and not _finite(teacher))
        or not event["temperature"] >= 0
        or (event["reward"] is not None and not math.isfinite(event["reward"]))
    )
    return "malformed" if malformed or not _top_k_trainable(event) else None


def _top_k_trainable(event: SampleReady) -> bool:
    """No top-K data, or [T][K] ids >= 0 and finite logprobs with one K >= 1 (T = the response length)."""
    ids, logprobs = event.get("teacher_top_ids"), event.get("teacher_top_logprobs")
    if not top_k_rows_aligned(ids, logprobs, len(event["response_token_ids"])):
        return False
    if ids is None or logprobs is None:  # aligned: both absent
        return True
    return all(i >= 0 for row in ids for i in row) and all(_finite(row) for row in logprobs)


def training_sample(pending: _Pending) -> TrainingSample:
    assert pending.event is not None
    event = cast(SampleReady, pending.event)
    teacher = event["teacher_logprobs"]
    return TrainingSample(
        sample_id=str(event["envelope"]["event_id"]),
        method=str(event["method"]),
        prompt_ids=tuple(event["prompt_token_ids"]),
        response_ids=tuple(event["response_token_ids"]),
        rollout_logprobs=tuple(event["old_logprobs"]),
        temperature=float(event["temperature"]),
        reward=None if event["reward"] is None else float(event["reward"]),
        teacher_logprobs=None if teacher is None else tuple(teacher),
        policy_version=int(event["policy_version"]),
        position=pending.record.topic_partition,
        offset=pending.record.offset,
        teacher_top_ids=_rows(event.get("teacher_top_ids")),
        teacher_top_logprobs=_rows(event.get("teacher_top_logprobs")),
        promoted=bool(event["promoted"]),
    )


def _rows(values: Sequence[Sequence[Any]] | None) -> tuple[tuple[Any, ...], ...] | None:
    return None if values is None else tuple(tuple(row) for row in values)


class SampleBatcher:
    """Buffers polled records and cuts them into batches of `batch_size` trainable samples."""

    def __init__(
        self,
        batch_size: int,
        max_staleness: int,
        consumed_offsets: Mapping[TopicPartition, int] | None = None,
        trained_ids: Sequence[str] = (),
        holdout_share: float = 0.0,
    ) -> None:
        self.batch_size = batch_size
        self.holdout_share = holdout_share  # sessions held out for the promotion gate: never trained
        self.max_staleness = max_staleness  # negative: never drop for staleness
        self.consumed_offsets: dict[TopicPartition, int] = dict(consumed_offsets or {})
        self._pending: list[_Pending] = []
        self._seen: OrderedDict[str, None] = OrderedDict.fromkeys(trained_ids)

    @property
    def pending_records(self) -> int:
        return len(self._pending)

    def add(self, records: Iterable[ConsumedRecord]) -> None:
        """Append polled records (in the order the consumer returned them)."""
        self._pending.extend(_decoded(record) for record in records)

    def _verdict(self, pending: _Pending, current_version: int, batch_ids: set[str]) -> TrainingSample | str:
        if pending.event is None:
            return "forgotten" if pending.event_type == FORGOTTEN else "undecodable"
        if pending.event_type == "SampleRejected":
            return "rejected"
        if pending.event_type != "SampleReady":
            return "unknown_event"
        problem = sample_problem(cast(SampleReady, pending.event))
        if problem is not None:
            return problem
        if held_out_session(pending.event["envelope"].get("session_id") or "", self.holdout_share):
            return "held_out"
        sample = training_sample(pending)
        if sample.sample_id in self._seen or sample.sample_id in batch_ids:
            return "duplicate"
        if self.max_staleness >= 0 and sample.policy_version < current_version - self.max_staleness:
            return "stale"
        return sample

    def take(self, current_version: int, *, partial: bool = False) -> Batch | None:
        """The next batch trained at `current_version`, or None while fewer than N samples are pending.

        `partial` cuts a smaller batch from everything pending (at least one sample): the loop asks
        for it when the stream has gone quiet, so a trickle of samples is not held back forever.
        """
        samples: list[TrainingSample] = []
        skipped: Counter[str] = Counter()
        for index, pending in enumerate(self._pending):
            verdict = self._verdict(pending, current_version, {s.sample_id for s in samples})
            if isinstance(verdict, str):
                skipped[verdict] += 1
                continue
            samples.append(verdict)
            if len(samples) == self.batch_size:
                return self._cut(index + 1, samples, skipped, current_version)
        if partial and samples:
            return self._cut(len(self._pending), samples, skipped, current_version)
        return None

    def _cut(
        self, count: int, samples: list[TrainingSample], skipped: Counter[str], current_version: int
    ) -> Batch:
        taken, self._pending = self._pending[:count], self._pending[count:]
        for pending in taken:
            self.consumed_offsets[pending.record.topic_partition] = pending.record.offset + 1
        for sample in samples:
            self._seen[sample.sample_id] = None
        while len(self._seen) > SEEN_IDS_KEPT:
            self._seen.popitem(last=False)
        return Batch(
            samples=tuple(samples),
            consumed_offsets=dict(self.consumed_offsets),
            skipped=dict(sorted(skipped.items())),
            staleness=tuple(current_version - s.policy_version for s in samples),
        )
