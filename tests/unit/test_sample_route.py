"""The sample builder's route, traced with sys.settrace over the golden runs (issue 43).

One input goes down three modules: sample_builder (the processor; it builds the events) calls
sample_inputs (record), then sample_decisions (decide), and emits. The route calls only downward
(builder > decisions > inputs) and re-enters no module it has left: once no frame of a module is on
the stack during one `process` or `on_tick`, nothing calls into it again until that call returns.
Shared lower modules (event_building, config, rules, schemas) are not part of the route.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from orl.pipeline.processors import sample_builder, sample_decisions, sample_inputs
from orl.pipeline.processors.config import LinkerConfig, PipelineConfig, RewardRuleConfig, SampleConfig
from orl.pipeline.processors.sample_inputs import Turn

from tests.unit.pipeline_streams import PipelineDriver, ScriptedEffects, task_session

INPUT = Path(__file__).resolve().parents[1] / "golden" / "pipeline_input.json"
RANK = {  # a module may call only modules of a lower rank (or itself)
    sample_builder.__file__: ("sample_builder", 2),
    sample_decisions.__file__: ("sample_decisions", 1),
    sample_inputs.__file__: ("sample_inputs", 0),
}


@dataclass
class RouteTrace:
    """Every route through the three modules; `problems` names each upward call and re-entry."""

    routes: int = 0
    problems: list[str] = field(default_factory=list)
    _depth: Counter[str] = field(default_factory=Counter)
    _left: set[str] = field(default_factory=set)
    _in_route: bool = False

    def tracer(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if event != "call" or frame.f_code.co_filename not in RANK:
            return None
        module, rank = RANK[frame.f_code.co_filename]
        caller = self._route_caller(frame)
        if caller is None:  # a call from outside the three modules
            if module != "sample_builder" or frame.f_code.co_name not in ("process", "on_tick"):
                return None  # e.g. the codec, called by the runtime
            self.routes += 1
            self._in_route, self._left = True, set()
        elif not self._in_route:
            return None
        else:
            caller_module, caller_rank = RANK[caller.f_code.co_filename]
            if rank > caller_rank:
                self.problems.append(f"{caller_module}.{caller.f_code.co_name} calls up into {module}")
            if module in self._left:
                self.problems.append(
                    f"{caller_module}.{caller.f_code.co_name} re-enters {module}, left before"
                )
        self._depth[module] += 1
        return self._returns(module, route_start=caller is None)

    def _returns(self, module: str, route_start: bool) -> Callable[..., Any]:
        def local(frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
            if event == "return":
                self._depth[module] -= 1
                if self._depth[module] == 0:
                    self._left.add(module)
                if route_start:
                    self._in_route = False
            return local

        return local

    @staticmethod
    def _route_caller(frame: FrameType) -> FrameType | None:
        """The nearest frame below `frame` in one of the three modules (None: called from elsewhere)."""
        caller = frame.f_back
        while caller is not None and caller.f_code.co_filename not in RANK:
            caller = caller.f_back
        return caller


@contextmanager
def traced() -> Iterator[RouteTrace]:
    trace = RouteTrace()
    sys.settrace(trace.tracer)
    try:
        yield trace
    finally:
        sys.settrace(None)


def run_golden(method: str) -> None:
    recorded = json.loads(INPUT.read_text())
    config = PipelineConfig(linker=LinkerConfig(idle_timeout_s=600), samples=SampleConfig(method=method))  # type: ignore[arg-type]
    driver = PipelineDriver(config, ScriptedEffects(recorded["reward_outputs"], recorded["hint_outputs"]))
    driver.feed_all(recorded["events"])
    driver.tick(recorded["tick_at_ms"])
    driver.tick(recorded["tick_at_ms"] + 10**8)


def run_grouped_steps() -> None:
    """Tool-using sessions of one rollout group under the step_outcome rule: the step paths."""
    good, bad = ["\\boxed{1}"] * 3, ["\\boxed{-1}"] * 3
    config = PipelineConfig(
        linker=LinkerConfig(idle_timeout_s=600),
        rewards=RewardRuleConfig(
            rule="step_outcome", outcome_judge_id="outcome:outcome", group_advantage=True
        ),
    )
    sessions = [
        task_session(name, [good, bad], outcome, group=("task-1", 2))
        for name, outcome in (("ga", 1.0), ("gb", -1.0))
    ]
    outputs = {f"{c.session_id}-t{i}": votes for c in sessions for i, votes in enumerate([good, bad])}
    driver = PipelineDriver(
        config, ScriptedEffects(outputs, {}, outcome_judge_id="outcome:outcome", hints=False)
    )
    driver.feed_all([event for c in sessions for event in c.events])
    driver.tick(10**13)
    assert any(emit.event["envelope"]["event_type"] == "SampleReady" for emit in driver.log)


@pytest.mark.parametrize(
    "run",
    [
        lambda: run_golden("binary"),
        lambda: run_golden("opd"),
        lambda: run_golden("combined"),
        run_grouped_steps,
    ],
    ids=["binary", "opd", "combined", "grouped-steps"],
)
def test_the_sample_route_calls_only_down_and_re_enters_no_module(run: Callable[[], None]) -> None:
    with traced() as trace:
        run()
    assert trace.routes > 20
    assert trace.problems == []


def test_the_trace_sees_a_module_re_entered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a decision step that calls back into sample_inputs is reported."""
    monkeypatch.setattr(
        sample_decisions,
        "prune_decided_turns",
        lambda state, samples: sample_inputs.with_turn(state, "t", Turn()),
    )
    with traced() as trace:
        run_golden("binary")
    assert any("re-enters sample_inputs" in problem for problem in trace.problems)


def test_the_trace_sees_an_upward_call(monkeypatch: pytest.MonkeyPatch) -> None:
    recording = sample_inputs.record_request
    monkeypatch.setattr(
        sample_inputs,
        "record_request",
        lambda state, event: (sample_decisions.hint_ready(Turn()), recording(state, event))[1],
    )
    with traced() as trace:
        run_golden("binary")
    assert any("calls up into sample_decisions" in problem for problem in trace.problems)
