"""The processor contract the runtimes rely on for speed, checked on the golden stream.

- A processor never modifies its input event: one decoded event is shared by the stages of a
  process (pipeline/runtime/shared_decodes.py).
- `on_tick` that returns the very state object it got, with no emits, left it unchanged: the
  runtime then skips writing it (pipeline/runtime/stream_runner.py tick).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from orl.pipeline.effects.judge_stage import JudgeStage
from orl.pipeline.effects.judging import JudgeConfig
from orl.pipeline.effects.teacher_stage import TeacherStage
from orl.pipeline.processors.config import LinkerConfig, PipelineConfig, RewardRuleConfig, SampleConfig
from orl.pipeline.processors.event_building import Event, event_type_of, occurred_at_of
from orl.pipeline.processors.registry import PURE_PROCESSORS
from orl.schemas.topics import record_key, topic_for_event

from tests.unit.pipeline_streams import PipelineDriver, ScriptedEffects, task_session

INPUT = Path(__file__).resolve().parents[1] / "golden" / "pipeline_input.json"
CONFIG = PipelineConfig(linker=LinkerConfig(idle_timeout_s=600), samples=SampleConfig(method="combined"))


def golden_stream() -> tuple[list[tuple[str, Event]], int]:
    """Every event of the golden run (inputs, then what the stages emitted), with its topic, and
    of a rollout group of tool-using sessions under the step_outcome rule (group_advantage's inputs)."""
    recorded = json.loads(INPUT.read_text())
    driver = PipelineDriver(CONFIG, ScriptedEffects(recorded["reward_outputs"], recorded["hint_outputs"]))
    driver.feed_all(recorded["events"])
    driver.tick(recorded["tick_at_ms"])
    inputs = [(topic_for_event(event_type_of(e)), e) for e in recorded["events"]]
    return inputs + [(emit.topic, emit.event) for emit in driver.log] + agent_stream(), recorded["tick_at_ms"]


def agent_stream() -> list[tuple[str, Event]]:
    good, bad = ["\\boxed{1}"] * 3, ["\\boxed{-1}"] * 3
    agents = PipelineConfig(
        linker=LinkerConfig(idle_timeout_s=600),
        samples=SampleConfig(method="binary"),
        rewards=RewardRuleConfig(
            rule="step_outcome", outcome_judge_id="outcome:outcome", group_advantage=True
        ),
    )
    sessions = [
        task_session(name, [good, bad], outcome, group=("task-1", 3))
        for name, outcome in (("ga", 1.0), ("gb", -1.0))
    ]
    outputs = {f"{c.session_id}-t{i}": votes for c in sessions for i, votes in enumerate([good, bad])}
    driver = PipelineDriver(
        agents, ScriptedEffects(outputs, {}, outcome_judge_id="outcome:outcome", hints=False)
    )
    events = [event for c in sessions for event in c.events]
    driver.feed_all(events)  # 2 of 3: the group waits, so ticks have work to do
    return [(topic_for_event(event_type_of(e)), e) for e in events] + [
        (emit.topic, emit.event) for emit in driver.log
    ]


def stages() -> list[Any]:
    judge = JudgeStage(reward_judges=(JudgeConfig(m=3),), hint_judge=JudgeConfig(judge_id="hint", m=3))
    teacher = TeacherStage("http://127.0.0.1:1/v1", "key")
    return [*PURE_PROCESSORS.values(), judge, teacher]


def step(stage: Any, state: Any, event: Event) -> Any:
    if hasattr(stage, "plan"):
        return stage.plan(state, event, CONFIG)[0]
    return stage.process(state, event, CONFIG)[0]


@pytest.mark.parametrize("stage", stages(), ids=lambda s: str(s.name))
def test_processors_never_modify_their_input_events(stage: Any) -> None:
    stream, _ = golden_stream()
    states: dict[str, Any] = {}
    fed = 0
    for topic, event in stream:
        if topic not in stage.inputs:
            continue
        before = copy.deepcopy(event)
        key = record_key(event) or ""
        states[key] = step(stage, states.get(key), event)
        assert event == before, f"{stage.name} modified a {event_type_of(event)}"
        fed += 1
    assert fed > 0


@pytest.mark.parametrize("stage", stages(), ids=lambda s: str(s.name))
def test_a_tick_that_returns_the_same_state_and_no_emits_changed_nothing(stage: Any) -> None:
    stream, tick_at_ms = golden_stream()
    states: dict[str, Any] = {}
    changed = 0
    for topic, event in stream:
        if topic not in stage.inputs:
            continue
        key = record_key(event) or ""
        states[key] = step(stage, states.get(key), event)
        if states[key] is None:
            continue
        for now_ms in (occurred_at_of(event), tick_at_ms, tick_at_ms + 10**6, tick_at_ms + 10**8):
            probe = copy.deepcopy(states[key])
            before = stage.state_codec.to_bytes(probe)
            new_state, emits = stage.on_tick(probe, now_ms, CONFIG)
            if new_state is probe and not emits:
                assert stage.state_codec.to_bytes(probe) == before, f"{stage.name} changed a state silently"
            else:
                changed += 1
    assert changed > 0, "the stream never made a tick do anything: the check above proved nothing"
