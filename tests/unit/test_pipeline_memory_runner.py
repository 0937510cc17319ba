"""MemoryRunner: pure processors chained by topic in memory, as a reuse replay runs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.runtime.memory_runner import MemoryRunner

Event = dict[str, Any]


def event(session: str, kind: str, value: int) -> Event:
    return {"envelope": {"session_id": session, "event_type": kind}, "value": value}


@dataclass
class Doubler:
    """numbers -> doubled; forgets a session when it reads 0."""

    name: str = "doubler"
    inputs: tuple[str, ...] = ("numbers",)
    outputs: tuple[str, ...] = ("doubled",)

    def process(self, state: Any, ev: Event, config: PipelineConfig) -> tuple[Any, list[Emit]]:
        if ev["value"] == 0:
            return None, []
        seen = (state or []) + [ev["value"]]
        session = ev["envelope"]["session_id"]
        return seen, [Emit("doubled", event(session, "Doubled", 2 * ev["value"]))]

    def on_tick(self, state: Any, now_ms: int, config: PipelineConfig) -> tuple[Any, list[Emit]]:
        return state, []


@dataclass
class Summer:
    """doubled -> a running sum per session; on a tick, emits the sum and forgets the session."""

    name: str = "summer"
    inputs: tuple[str, ...] = ("doubled",)
    outputs: tuple[str, ...] = ("sums",)

    def process(self, state: Any, ev: Event, config: PipelineConfig) -> tuple[Any, list[Emit]]:
        return {
            "session": ev["envelope"]["session_id"],
            "sum": (state or {"sum": 0})["sum"] + ev["value"],
        }, []

    def on_tick(self, state: Any, now_ms: int, config: PipelineConfig) -> tuple[Any, list[Emit]]:
        return None, [Emit("sums", event(state["session"], "Sum", state["sum"]))]


def test_emits_are_handed_on_by_topic_and_states_kept_per_session() -> None:
    runner = MemoryRunner([Doubler(), Summer()], PipelineConfig())
    out = runner.feed("numbers", event("a", "Number", 3))
    assert [(e.topic, e.event["value"]) for e in out] == [("doubled", 6)]
    runner.feed("numbers", event("a", "Number", 4))
    runner.feed("numbers", event("b", "Number", 1))
    assert runner.states["doubler"] == {"a": [3, 4], "b": [1]}
    assert runner.states["summer"] == {"a": {"session": "a", "sum": 14}, "b": {"session": "b", "sum": 2}}
    assert runner.feed("sums", event("a", "Sum", 1)) == []  # nobody reads that topic


def test_a_none_state_forgets_the_session_and_a_tick_hands_its_emits_on() -> None:
    runner = MemoryRunner([Doubler(), Summer()], PipelineConfig())
    runner.feed("numbers", event("a", "Number", 5))
    runner.feed("numbers", event("a", "Number", 0))
    assert runner.states["doubler"] == {}
    ticked = runner.tick(runner.processors[1], now_ms=0)
    assert [(e.topic, e.event["value"]) for e in ticked] == [("sums", 10)]
    assert runner.states["summer"] == {}
