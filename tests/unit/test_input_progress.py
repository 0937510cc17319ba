"""InputProgress: which fetched records a faust agent's stream skipped (pipeline/runtime/faust_patches.py)."""

from __future__ import annotations

from orl.pipeline.runtime.faust_patches import InputProgress


def handled_in_order(progress: InputProgress, offsets: list[int]) -> None:
    for offset in offsets:
        assert not progress.is_redelivery(offset)
        assert progress.skipped_before(offset) == []
        progress.handled(offset)


def test_records_handled_in_fetch_order_leave_nothing_skipped() -> None:
    progress = InputProgress()
    progress.begin(1)
    progress.note_fetched([0, 1, 2], 1, fetch_round=1)
    handled_in_order(progress, [0, 1, 2])
    progress.note_fetched([3, 4], 1, fetch_round=2)
    handled_in_order(progress, [3, 4])
    assert progress.skipped_in_rounds_before(3) == []


def test_a_gap_of_transaction_markers_is_not_a_skip() -> None:
    progress = InputProgress()
    progress.begin(1)
    progress.note_fetched([0, 1, 3, 4, 6], 1, fetch_round=1)  # 2 and 5: commit markers, never fetched
    handled_in_order(progress, [0, 1, 3, 4, 6])


def test_fetched_records_missing_before_a_later_one_are_skipped() -> None:
    progress = InputProgress()
    progress.begin(1)
    progress.note_fetched([10, 11, 12, 14], 1, fetch_round=1)  # 13: a marker
    progress.handled(10)
    assert progress.skipped_before(14) == [11, 12]
    progress.handled(14)
    assert progress.skipped_before(15) == []  # forgotten once reported


def test_the_first_record_of_a_generation_reports_records_fetched_before_it() -> None:
    """A partition taken over with no committed offset: faust fetched 0..2, dropped them, delivered 3."""
    progress = InputProgress()
    progress.begin(4)
    progress.note_fetched([0, 1, 2, 3], 4, fetch_round=7)
    assert progress.skipped_before(3) == [0, 1, 2]


def test_skipped_records_with_no_later_record_are_found_by_a_later_fetch_round() -> None:
    """The last records of a partition skipped: no later record of it comes, a tick of a later fetch does."""
    progress = InputProgress()
    progress.begin(2)
    progress.note_fetched([0, 1], 2, fetch_round=5)
    progress.note_fetched([2], 2, fetch_round=6)
    progress.handled(0)
    assert progress.skipped_in_rounds_before(6) == [1]
    assert progress.skipped_in_rounds_before(7) == [2]
    assert progress.skipped_in_rounds_before(8) == []


def test_a_redelivery_is_recognised_and_not_reported_as_skipped() -> None:
    progress = InputProgress()
    progress.begin(1)
    progress.note_fetched([0, 1, 2], 1, fetch_round=1)
    handled_in_order(progress, [0, 1, 2])
    progress.note_fetched([1, 2, 3], 1, fetch_round=2)  # a seek back to the committed offset
    assert progress.is_redelivery(1) and progress.is_redelivery(2)
    assert progress.skipped_before(3) == []
    progress.handled(3)
    progress.note_fetched([1], 1, fetch_round=3)  # fetched again but not delivered: already handled
    assert progress.skipped_in_rounds_before(4) == []


def test_a_new_generation_forgets_what_older_ones_fetched() -> None:
    """faust never delivers records fetched before a rebalance; it seeks and fetches them again."""
    progress = InputProgress()
    progress.begin(1)
    progress.note_fetched([5, 6, 7], 1, fetch_round=1)
    progress.handled(5)
    progress.begin(2)  # the partition went away and came back: another worker handled 6..9
    progress.note_fetched([10, 11], 2, fetch_round=2)
    assert progress.skipped_before(10) == []
    progress.handled(10)
    assert progress.skipped_in_rounds_before(3) == [11]
