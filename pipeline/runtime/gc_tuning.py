"""Fewer garbage-collector passes for stream processing, where millions of long-lived objects (the
sessions' states, decoded events) make CPython's default young-generation threshold (700
allocations) cost a quarter of the CPU: every young collection that gets promoted into the older
generations walks them again.

Events and states are trees (dicts, lists, strings, numbers) without reference cycles, so almost
nothing the collector finds is garbage; reference counting frees them. A threshold of 100,000
allocations keeps the collector for the rare cycle at a small fraction of the cost (a 20,000-turn
reuse replay: 2,360 -> 3,110 turns/s, benchmarks/RESULTS-replay-audit.md).
Reads and writes no topics.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

STREAM_THRESHOLD = (100_000, 10, 10)


@contextlib.contextmanager
def tuned_for_streams() -> Iterator[None]:
    """The stream threshold for the duration of a call (`orl pipeline`, a replay), restoring the
    caller's thresholds afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(*STREAM_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*before)
