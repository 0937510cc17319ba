"""The contract every pure processor fulfils, whichever runtime (faust, embedded log) runs it.

- State is keyed by session_id (every topic is keyed by session, so one partition holds a whole
  session). A processor's `state_codec` (pipeline/processors/state_codec.py) turns its state into
  the changelog's bytes and back, so a runtime can keep it in SQLite rows, Kafka changelogs or faust
  Tables: a frozen dataclass per processor (`frozen_state`), or a JSON-serialisable dict
  (`JSON_STATE`). Returning `None` as the new state deletes the key.
- `process(state, event, config)` handles one event of one of `inputs`; `on_tick(state, now_ms,
  config)` does time-based work (idle timeouts, waiting limits). `now_ms` is the runtime's notion of
  time: the wall clock when live, the stream's watermark (latest occurred_at read) in a replay.
- `on_tick` that has nothing to do returns the very `state` object it was given, unmodified; one that
  changes the state emits something or returns another object (or None). Runtimes tick every stored
  session, so they tell a changed state from an unchanged one by that, not by serialising each state
  twice per tick.
- Processors never modify their input events: a runtime may hand one decoded event to several
  processors (pipeline/runtime/shared_decodes.py).
- Outputs are `Emit(topic, event)`; the record key is the event's session_id. Output ids are
  deterministic (inputs' ids + config version); a redelivered input is recognised by the bounded
  seen-id list in the state and emits nothing.
- Processors never read a clock, do I/O or import a runtime.
Reads and writes no topics itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.event_building import Event, State
from orl.pipeline.processors.state_codec import StateCodec


@dataclass(frozen=True)
class Emit:
    """One output: `topic` is the catalog name (e.g. "next_states"); the key is the event's session_id."""

    topic: str
    event: Event


ProcessResult = tuple[State | None, list[Emit]]


class Processor(Protocol):
    """A pure stream processor over session-keyed state."""

    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> tuple[str, ...]: ...

    @property
    def outputs(self) -> tuple[str, ...]: ...

    @property
    def state_codec(self) -> StateCodec: ...

    def process(self, state: Any, event: Event, config: PipelineConfig) -> tuple[Any, list[Emit]]:
        """Handle one input event of the session whose state is `state` (None: nothing stored yet).

        `state` is the processor's own type, the one its `state_codec` reads and writes."""
        ...

    def on_tick(self, state: Any, now_ms: int, config: PipelineConfig) -> tuple[Any, list[Emit]]:
        """Time-based work for one stored session; called periodically by the runtime.

        Returns `state` itself, unmodified, when there is nothing to do (see the module docstring).
        """
        ...
