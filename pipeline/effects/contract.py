"""The contract of effect stages (judge, teacher): a pure planner plus the calls it asks for.

An effect stage splits like a pure processor plus I/O: `plan(state, event, config)` is pure and
returns the new session state and the calls to make; `perform(call)` does the I/O (an HTTP call
to a judge or to the server's scoring endpoint, or a rule judge: inline while it is fast, else in
a thread) and returns the events to emit. `perform` never raises for a failing judge: it returns failed votes. The stream
runner performs a batch's calls concurrently (bounded) and commits their events with the input
offsets, so a crash before the commit re-plans and re-performs them; the events' deterministic
ids make any duplicates harmless downstream.
Reads and writes no topics itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import Event
from orl.pipeline.processors.state_codec import StateCodec


@dataclass(frozen=True)
class EffectCall:
    """One unit of I/O asked for by a planner; `payload` is JSON-serialisable."""

    kind: str
    payload: dict[str, Any]


PlanResult = tuple[Any, list[EffectCall]]  # the stage's new state (None: forget it), its calls


@runtime_checkable
class EffectStage(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def outputs(self) -> tuple[str, ...]: ...

    @property
    def state_codec(self) -> StateCodec: ...

    def plan(self, state: Any, event: Event, config: PipelineConfig) -> PlanResult:
        """Pure: update the session state and say which calls to make."""
        ...

    def on_tick(self, state: Any, now_ms: int, config: PipelineConfig) -> tuple[Any, list[Emit]]:
        """Pure: retention of idle session state (the same contract as Processor.on_tick)."""
        ...

    async def perform(self, call: EffectCall) -> list[Emit]:
        """I/O: make the call, return the events that record it."""
        ...
