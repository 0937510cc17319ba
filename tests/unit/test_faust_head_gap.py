"""The faust head-gap fix (docs/faust-notes.md): a commit never passes a fetched record no agent handled.

`PipelineConsumer._new_offset` runs on a consumer object that holds only the bookkeeping faust's
method reads (acknowledged offsets, gaps, the committed offset) plus the fetched offsets: faust's own
`Consumer._new_offset` runs underneath, unpatched.
"""

from __future__ import annotations

from collections import defaultdict

from faust.types import TP
from intervaltree import IntervalTree
from orl.pipeline.runtime.faust_patches import PipelineConsumer

PARTITION = TP("live.requests", 0)


def consumer(committed: int | None, acked: list[int], fetched: list[int]) -> PipelineConsumer:
    bare = object.__new__(PipelineConsumer)  # only the state _new_offset reads; no broker
    bare._acked = defaultdict(list, {PARTITION: list(acked)})
    bare._acked_index = defaultdict(set, {PARTITION: set(acked)})
    bare._committed_offset = defaultdict(lambda: None, {PARTITION: committed})
    bare._gap = defaultdict(IntervalTree)
    bare.fetched_offsets(PARTITION).update(fetched)
    return bare


def test_unpatched_faust_commits_past_one_missing_record_at_the_head() -> None:
    from faust.transport.consumer import Consumer

    bare = consumer(committed=10, acked=[11, 12, 13], fetched=[10, 11, 12, 13])
    assert Consumer._new_offset(bare, PARTITION) == 14  # record 10 was fetched, never handled: lost


def test_a_fetched_record_at_the_head_that_no_agent_handled_holds_the_commit() -> None:
    bare = consumer(committed=10, acked=[11, 12, 13], fetched=[10, 11, 12, 13])
    assert bare._new_offset(PARTITION) is None
    assert bare._acked[PARTITION] == [11, 12, 13]  # every acknowledgement kept for the next commit
    bare.acknowledge("live.requests", 0, [10])  # the agent re-read and handled it (InputProgress)
    assert bare._new_offset(PARTITION) == 14
    assert bare.fetched_offsets(PARTITION) == set()


def test_a_transaction_marker_at_the_head_is_passed_as_faust_means_to() -> None:
    bare = consumer(committed=10, acked=[11, 12], fetched=[11, 12])  # offset 10: never fetched
    assert bare._new_offset(PARTITION) == 13


def test_a_partition_without_a_committed_offset_is_checked_too() -> None:
    bare = consumer(committed=None, acked=[3, 4], fetched=[0, 1, 2, 3, 4])
    assert bare._new_offset(PARTITION) is None
    bare.acknowledge("live.requests", 0, [0, 1, 2])
    assert bare._new_offset(PARTITION) == 5
