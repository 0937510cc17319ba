"""SampleBatcher: batches of N trainable samples, skip reasons, offsets, and partial batches."""

from __future__ import annotations

import copy
from typing import Any

from orl.connectors.event_log.base import ConsumedRecord, TopicPartition
from orl.schemas.codec import encode
from orl.schemas.ids import held_out_session
from orl.trainer.batching import SampleBatcher

from tests.unit.event_examples import sample_ready, sample_rejected

TOPIC = "test.samples"


def ready(sample_id: str, policy_version: int = 7) -> dict[str, Any]:
    event = copy.deepcopy(sample_ready())
    event["envelope"]["event_id"] = sample_id
    event["policy_version"] = policy_version
    return event


def records(*events: dict[str, Any] | bytes) -> list[ConsumedRecord]:
    return [
        ConsumedRecord(TOPIC, 0, offset, None, e if isinstance(e, bytes) else encode(e))
        for offset, e in enumerate(events)
    ]


def test_a_batch_is_cut_after_n_trainable_samples_and_counts_what_it_skipped() -> None:
    batcher = SampleBatcher(batch_size=2, max_staleness=2)
    batcher.add(records(ready("a"), sample_rejected(), b"garbage", ready("a"), ready("b"), ready("c")))
    batch = batcher.take(current_version=7)
    assert batch is not None
    assert batch.sample_ids == ["a", "b"]
    assert batch.skipped == {"duplicate": 1, "rejected": 1, "undecodable": 1}
    assert batch.consumed_offsets == {TopicPartition(TOPIC, 0): 5}  # "c" stays pending
    assert batcher.take(current_version=8) is None  # one sample is not a batch
    assert batcher.pending_records == 1


def test_stale_samples_are_dropped_and_counted() -> None:
    batcher = SampleBatcher(batch_size=1, max_staleness=2)
    batcher.add(records(ready("old", policy_version=4), ready("new", policy_version=5)))
    batch = batcher.take(current_version=7)
    assert batch is not None and batch.sample_ids == ["new"] and batch.skipped == {"stale": 1}
    assert batch.staleness == (2,)


def test_a_partial_batch_takes_everything_pending_and_needs_one_sample() -> None:
    batcher = SampleBatcher(batch_size=16, max_staleness=2)
    batcher.add(records(sample_rejected()))
    assert batcher.take(current_version=7, partial=True) is None  # nothing to train on
    batcher.add(records(ready("a"), ready("b"), sample_rejected()))
    assert batcher.take(current_version=7) is None
    batch = batcher.take(current_version=7, partial=True)
    assert batch is not None and batch.sample_ids == ["a", "b"]
    assert batch.skipped == {"rejected": 2}
    assert batcher.pending_records == 0


def test_top_k_rows_reach_the_training_sample_and_bad_ones_are_malformed() -> None:
    good = ready("good")  # the example carries [3][2] top-K rows
    short = ready("short")
    short["teacher_top_ids"] = short["teacher_top_ids"][:2]
    ragged = ready("ragged")
    ragged["teacher_top_logprobs"] = [[-0.25], [-0.5, -1.5], [-0.125, -3.0]]
    one_sided = ready("one-sided")
    one_sided["teacher_top_logprobs"] = None
    batcher = SampleBatcher(batch_size=1, max_staleness=-1)
    batcher.add(records(short, ragged, one_sided, good))
    batch = batcher.take(current_version=7)
    assert batch is not None and batch.skipped == {"malformed": 3}
    (sample,) = batch.samples
    assert sample.teacher_top_ids == ((77, 5), (6, 78), (79, 7))
    assert sample.teacher_top_logprobs == ((-0.25, -2.0), (-0.5, -1.5), (-0.125, -3.0))


def test_samples_of_held_out_sessions_are_never_trained() -> None:
    sessions = [f"session-{i}" for i in range(200)]
    events = []
    for index, session in enumerate(sessions):
        event = ready(f"s{index}")
        event["envelope"]["session_id"] = session
        events.append(event)
    batcher = SampleBatcher(batch_size=1000, max_staleness=-1, holdout_share=0.25)
    batcher.add(records(*events))
    batch = batcher.take(current_version=7, partial=True)
    assert batch is not None
    held_out = [s for s in sessions if held_out_session(s, 0.25)]
    assert batch.skipped == {"held_out": len(held_out)}
    assert 25 <= len(held_out) <= 75  # about a quarter of 200
    trained = {events[int(sample_id[1:])]["envelope"]["session_id"] for sample_id in batch.sample_ids}
    assert trained == set(sessions) - set(held_out)


def test_a_tenant_run_trains_only_the_sessions_its_filter_keeps() -> None:
    events = []
    for index, session in enumerate(["alice-1", "bob-1", "alice-2", "nobody-1"]):
        event = ready(f"s{index}")
        event["envelope"]["session_id"] = session
        events.append(event)
    batcher = SampleBatcher(
        batch_size=2, max_staleness=-1, trains_session=lambda session: session.startswith("alice")
    )
    batcher.add(records(*events))
    batch = batcher.take(current_version=7)
    assert batch is not None and batch.sample_ids == ["s0", "s2"]
    assert batch.skipped == {"other_tenant": 1}  # bob's; nobody's stays pending after the batch
    assert batcher.pending_records == 1


def test_staleness_counts_only_samples_of_the_run_s_own_versions() -> None:
    own, shared, unnamed = ready("own", policy_version=1), ready("shared", policy_version=1), ready("old", 1)
    own["policy_run"] = "live.alice"
    shared["policy_run"] = "live"  # answered by the shared policy's v1 before alice had a version
    unnamed["policy_run"] = None  # recorded before servers named the run: counted as the run's own
    fresh = ready("fresh", policy_version=6)
    fresh["policy_run"] = "live.alice"
    batcher = SampleBatcher(batch_size=3, max_staleness=2, run_id="live.alice")
    batcher.add(records(own, shared, unnamed, fresh))
    batch = batcher.take(current_version=6, partial=True)
    assert batch is not None
    assert batch.skipped == {"stale": 2}  # own v1 and the unnamed v1 at v6, max staleness 2
    assert [s.sample_id for s in batch.samples] == ["shared", "fresh"]
    assert batch.staleness == (0,)  # only "fresh" is of this run's versions
