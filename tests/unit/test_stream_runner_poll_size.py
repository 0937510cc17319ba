"""next_poll_size: StreamRunner's poll grows while full batches touch many sessions, and shrinks back."""

from __future__ import annotations

from orl.pipeline.runtime.stream_runner import next_poll_size

FLOOR, CAP = 2000, 16000


def test_full_batches_over_many_interleaved_sessions_double_the_poll_up_to_the_cap() -> None:
    size = FLOOR
    sizes = []
    for _ in range(5):  # each batch full, one state written per two records
        size = next_poll_size(size, size, size // 2, FLOOR, CAP)
        sizes.append(size)
    assert sizes == [4000, 8000, 16000, 16000, 16000]


def test_full_batches_over_few_sessions_keep_the_poll_size() -> None:
    """400 sessions: a full batch of 2,000 records writes at most 400 states, so batches stay small."""
    assert next_poll_size(FLOOR, FLOOR, 400, FLOOR, CAP) == FLOOR
    assert next_poll_size(8000, 8000, 1000, FLOOR, CAP) == 8000


def test_the_poll_shrinks_back_without_a_backlog_or_once_states_repeat() -> None:
    assert next_poll_size(16000, 300, 300, FLOOR, CAP) == 8000  # caught up: less than half full
    assert next_poll_size(16000, 16000, 1500, FLOOR, CAP) == 8000  # under a tenth of records
    assert next_poll_size(4000, 10, 10, FLOOR, CAP) == FLOOR  # never below the configured size
