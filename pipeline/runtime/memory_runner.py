"""Runs pure processors over a finite stream held in memory: no log, no changelog, no offsets.

A reuse replay (pipeline/history/replay.py) has only pure stages and a recorded stream, so it needs none of
StreamRunner's bookkeeping: each event is handed to every stage that reads its topic (in the order
the stages are given, which is the topology's), and whatever a stage emits is handed on the same
way, first in first out, as if it had gone through the log. Each stage runs on the processor host
(pipeline/runtime/host.py) like on the other runtimes. State lives in dicts by session and
is gone when the process ends: a re-run starts again from the first event and, every output id
being deterministic, derives the very same events.
Reads and writes no topics itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, Processor
from orl.pipeline.runtime.host import ProcessorHost
from orl.schemas.topics import record_key


class MemoryRunner:
    """Pure processors chained by topic in one process."""

    def __init__(self, processors: Sequence[Processor], config: PipelineConfig) -> None:
        self.processors = list(processors)
        self.config = config
        self.states: dict[str, dict[str, Any]] = {p.name: {} for p in self.processors}
        self.hosts = {p.name: ProcessorHost(p, config, namespace="") for p in self.processors}
        self._readers: dict[str, list[Processor]] = {}
        for processor in self.processors:
            for topic in processor.inputs:
                self._readers.setdefault(topic, []).append(processor)

    def feed(self, topic: str, event: dict[str, Any]) -> list[Emit]:
        """Every emit that `event` (read from `topic`) leads to, directly or through later stages, in order."""
        out: list[Emit] = []
        queue = deque([Emit(topic, event)])
        while queue:
            emit = queue.popleft()
            for processor in self._readers.get(emit.topic, ()):
                emits = self._process(processor, emit.event)
                out.extend(emits)
                queue.extend(emits)
        return out

    def tick(self, processor: Processor, now_ms: int) -> list[Emit]:
        """`processor`'s time-based work for every stored session, and everything its emits lead to."""
        states, host = self.states[processor.name], self.hosts[processor.name]
        out: list[Emit] = []
        for key, state in list(states.items()):  # one session at a time: its emits go on before the next
            changed, emits = host.tick([(key, state)], now_ms)
            for changed_key, new_state in changed.items():
                self._store(states, changed_key, new_state)
            for emit in emits:
                out.append(emit)
                out.extend(self.feed(emit.topic, emit.event))
        return out

    def _process(self, processor: Processor, event: dict[str, Any]) -> list[Emit]:
        states = self.states[processor.name]
        key = record_key(event) or ""
        new_state, emits, _ = self.hosts[processor.name].step(states.get(key), event)
        self._store(states, key, new_state)
        return emits

    @staticmethod
    def _store(states: dict[str, Any], key: str, new_state: Any) -> None:
        if new_state is None:
            states.pop(key, None)
        else:
            states[key] = new_state
