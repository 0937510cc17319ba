"""General-agent rewards: step scores combined with the task's outcome, and group-normalised advantages.

Every expected value below is computed by hand from the rule in rules/step_rewards.py
and the step-wise normalisation in pipeline/processors/group_advantage.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
from orl.pipeline.processors.config import (
    GroupConfig,
    LinkerConfig,
    PipelineConfig,
    RewardRuleConfig,
    SampleConfig,
)
from orl.pipeline.processors.event_building import Event, emitted_by, event_type_of, turn_id_of
from orl.pipeline.processors.group_advantage import GroupStep, normalised_buckets
from orl.pipeline.processors.sample_builder import SAMPLE_BUILDER
from orl.schemas.errors import ConfigError
from orl.schemas.topics import topic_for_event

from tests.unit.pipeline_streams import (
    Conversation,
    PipelineDriver,
    ScriptedEffects,
    of_type,
    run_processor,
    task_session,
)

OUTCOME_JUDGE = "outcome:outcome"
GOOD, BAD, NEUTRAL = ["\\boxed{1}"] * 3, ["\\boxed{-1}"] * 3, ["\\boxed{0}"] * 3


def config(weight: float = 0.5, *, group: bool = False) -> PipelineConfig:
    return PipelineConfig(
        linker=LinkerConfig(idle_timeout_s=600),
        samples=SampleConfig(method="binary"),
        rewards=RewardRuleConfig(
            rule="step_outcome", outcome_judge_id=OUTCOME_JUDGE, step_weight=weight, group_advantage=group
        ),
        groups=GroupConfig(timeout_s=60),
    )


Scripted = list[tuple[Conversation, list[list[str]]]]  # each session with its steps' process-judge outputs


def run(sessions: Scripted, pipeline: PipelineConfig, tick_ms: int | None = None) -> PipelineDriver:
    outputs = {f"{c.session_id}-t{i}": votes for c, steps in sessions for i, votes in enumerate(steps)}
    driver = PipelineDriver(
        pipeline, ScriptedEffects(outputs, {}, outcome_judge_id=OUTCOME_JUDGE, hints=False)
    )
    for conversation, _ in sessions:
        driver.feed_all(conversation.events)
    if tick_ms is not None:
        driver.tick(tick_ms)
    return driver


def emitted(driver: PipelineDriver, event_type: str) -> list[Event]:
    return [emit.event for emit in driver.log if event_type_of(emit.event) == event_type]


def by_turn(events: list[Event]) -> dict[str, Event]:
    return {turn_id_of(event) or "": event for event in events}


def test_each_step_gets_its_weighted_process_score_plus_the_outcome() -> None:
    session = task_session("s1", [GOOD, BAD, NEUTRAL], outcome=1.0)
    driver = run([(session, [GOOD, BAD, NEUTRAL])], config(weight=0.25))
    step_rewards = by_turn([r for r in emitted(driver, "RewardDecided") if r["rule"] == "step_outcome"])
    # 0.25 * process + 0.75 * outcome(+1)
    assert {turn: r["reward"] for turn, r in step_rewards.items()} == {
        "s1-t0": 1.0,
        "s1-t1": 0.5,
        "s1-t2": 0.75,
    }
    samples = by_turn(emitted(driver, "SampleReady"))
    assert {turn: s["reward"] for turn, s in samples.items()} == {"s1-t0": 1.0, "s1-t1": 0.5, "s1-t2": 0.75}
    for turn, sample in samples.items():
        assert sample["lineage"]["reward_event_id"] == step_rewards[turn]["envelope"]["event_id"]
    # the parts name the judges' own rewards, which audit follows to the votes
    judge_rewards = {r["envelope"]["event_id"]: r for r in emitted(driver, "RewardDecided") if r["judge_id"]}
    parts = step_rewards["s1-t1"]["parts"]
    assert [(p["judge_id"], p["reward"], p["weight"]) for p in parts] == [
        ("prm", -1.0, 0.25),
        (OUTCOME_JUDGE, 1.0, 0.75),
    ]
    assert [judge_rewards[p["reward_event_id"]]["reason"] for p in parts] == ["majority", "outcome"]
    assert step_rewards["s1-t1"]["explanation"] == "step 1: 0.25 x process -1 + 0.75 x outcome +1 = +0.5"
    assert emitted(driver, "TrajectoryScored") == []


def test_a_last_response_that_arrives_after_the_close_and_the_verdict_is_still_a_step() -> None:
    """The judge (upstream) may read a response before sample_builder (downstream) does: the
    sample builder can see a turn's rewards, the verdict and the close before the turn's response."""
    session = task_session("s1", [GOOD, BAD], outcome=-1.0)
    driver = run([(session, [GOOD, BAD])], config())
    reads = [
        e for e in session.events + [emit.event for emit in driver.log] if not emitted_by(e, "sample_builder")
    ]
    reads = [e for e in reads if topic_for_event(event_type_of(e)) in SAMPLE_BUILDER.inputs]
    last_response = [e for e in reads if event_type_of(e) == "ResponseGenerated"][-1]
    reads = [e for e in reads if e is not last_response]
    states, before = run_processor(SAMPLE_BUILDER, reads, config())
    assert of_type(before, "SampleReady") == []  # waiting for the last step's response
    _, after = run_processor(SAMPLE_BUILDER, [last_response], config(), states)
    # 0.5 * process + 0.5 * outcome(-1): step 0 +1 -> 0 (rejected), step 1 -1 -> -1
    assert [(turn_id_of(s), s["reward"]) for s in of_type(after, "SampleReady")] == [("s1-t1", -1.0)]
    assert [turn_id_of(s) for s in of_type(after, "SampleRejected")] == ["s1-t0"]


def test_a_zero_step_reward_is_rejected_and_a_session_without_outcome_waits_for_the_settle_timeout() -> None:
    solved = task_session("s1", [GOOD, BAD], outcome=1.0)
    unknown = task_session("s2", [GOOD, BAD], outcome=None)
    driver = run([(solved, [GOOD, BAD]), (unknown, [GOOD, BAD])], config())
    assert [s["reason"] for s in emitted(driver, "SampleRejected")] == ["reward_zero"]  # s1-t1: -0.5 + 0.5
    assert {turn_id_of(s) for s in emitted(driver, "SampleReady")} == {"s1-t0"}
    closed_at = unknown.now_ms
    driver.tick(closed_at + 900_000)  # sample_builder's settle timeout: decided without an outcome
    no_outcome = [r for r in emitted(driver, "RewardDecided") if r["reason"] == "no_outcome"]
    assert {turn_id_of(r): r["reward"] for r in no_outcome} == {"s2-t0": 0.5, "s2-t1": -0.5}
    assert [len(r["parts"]) for r in no_outcome] == [1, 1]


GROUP = [  # session -> per-step process votes, outcome
    ("a", [GOOD, GOOD], 1.0),  # step rewards (w 0.5): [1, 1]
    ("b", [GOOD, BAD], -1.0),  # [0, -1]
    ("c", [BAD, GOOD], 1.0),  # [0, 1]
]


def group_sessions(size: int = 3, members: list[tuple[str, list[list[str]], float]] = GROUP) -> Scripted:
    return [
        (task_session(name, steps, outcome, group=("task-7", size)), steps)
        for name, steps, outcome in members
    ]


def test_a_groups_step_rewards_are_normalised_per_step_index() -> None:
    driver = run(group_sessions(), config(group=True))
    (trajectory_a,) = [t for t in emitted(driver, "TrajectoryScored") if t["envelope"]["session_id"] == "a"]
    assert [(s["step_index"], s["reward"]) for s in trajectory_a["steps"]] == [(0, 1.0), (1, 1.0)]
    samples = {turn: s["reward"] for turn, s in by_turn(emitted(driver, "SampleReady")).items()}
    # step 0: [1, 0, 0], mean 1/3, std sqrt(2)/3; step 1: [1, -1, 1], mean 1/3, std 2 sqrt(2)/3
    expected = {"a-t0": math.sqrt(2), "b-t0": -1 / math.sqrt(2), "c-t0": -1 / math.sqrt(2),
                "a-t1": 1 / math.sqrt(2), "b-t1": -math.sqrt(2), "c-t1": 1 / math.sqrt(2)}  # fmt: skip
    assert samples == pytest.approx(expected, abs=1e-5)
    group_rewards = [r for r in emitted(driver, "RewardDecided") if r["rule"] == "group_step_normalised"]
    assert {r["reason"] for r in group_rewards} == {"normalised"}
    step_ids = {
        r["envelope"]["event_id"] for r in emitted(driver, "RewardDecided") if r["rule"] == "step_outcome"
    }
    assert {r["parts"][0]["reward_event_id"] for r in group_rewards} == step_ids
    sample_a0 = by_turn(emitted(driver, "SampleReady"))["a-t0"]
    assert sample_a0["lineage"]["reward_event_id"] == by_turn(group_rewards)["a-t0"]["envelope"]["event_id"]


def test_the_group_outputs_do_not_depend_on_the_order_the_sessions_end_in() -> None:
    outputs = []
    for order in itertools.permutations(group_sessions()):
        driver = run(list(order), config(group=True))
        outputs.append(sorted(s["envelope"]["event_id"] for s in emitted(driver, "SampleReady")))
    assert len(outputs) == 6 and all(ids == outputs[0] for ids in outputs)


def test_an_incomplete_group_is_decided_at_its_timeout_and_a_late_rollout_alone() -> None:
    sessions = group_sessions(size=4)
    driver = run(sessions, config(group=True))
    assert emitted(driver, "SampleReady") == []  # 3 of 4 arrived: waiting
    last_ms = max(c.now_ms for c, _ in sessions)
    driver.tick(last_ms + 61_000)
    assert len(emitted(driver, "SampleReady")) == 6
    late = task_session("d", [GOOD, BAD], 1.0, group=("task-7", 4))
    driver.effects.reward_outputs.update({"d-t0": GOOD, "d-t1": BAD})
    driver.feed_all(late.events)
    late_rewards = [
        r
        for r in emitted(driver, "RewardDecided")
        if r["rule"] == "group_step_normalised" and r["envelope"]["session_id"] == "d"
    ]
    assert [(r["reason"], r["reward"]) for r in late_rewards] == [
        ("single_entry", 1.0),
        ("single_entry", 0.0),
    ]
    assert {turn_id_of(s) for s in emitted(driver, "SampleRejected")} == {"d-t1"}


def test_normalised_buckets_by_hand() -> None:
    steps = {
        "s1": (GroupStep("x0", 0, 1.0, "r-x0"), GroupStep("x1", 1, 0.5, "r-x1")),
        "s2": (GroupStep("y0", 0, 1.0, "r-y0"),),
        "s3": (GroupStep("z0", 0, 1.0, "r-z0"),),
    }
    decided = normalised_buckets(steps)
    assert decided[("s1", "x1")][:2] == (0.5, "single_entry")
    assert {decided[key][:2] for key in [("s1", "x0"), ("s2", "y0"), ("s3", "z0")]} == {
        (0.0, "zero_variance")
    }
    two = normalised_buckets(
        {"p": (GroupStep("p0", 0, 1.0, "r-p0"),), "q": (GroupStep("q0", 0, -1.0, "r-q0"),)}
    )
    assert two[("p", "p0")][0] == pytest.approx(1.0 / (1.0 + 1e-6))  # mean 0, std 1
    assert two[("q", "q0")][0] == pytest.approx(-1.0 / (1.0 + 1e-6))


def test_the_reward_rule_refuses_settings_it_cannot_honour() -> None:
    with pytest.raises(ConfigError, match="binary"):
        PipelineConfig(samples=SampleConfig(method="combined"), rewards=RewardRuleConfig(rule="step_outcome"))
    with pytest.raises(ConfigError, match="step_outcome"):
        RewardRuleConfig(group_advantage=True)
    with pytest.raises(ConfigError, match="step_weight"):
        RewardRuleConfig(rule="step_outcome", step_weight=1.5)
    with pytest.raises(ConfigError, match="two judges"):
        RewardRuleConfig(rule="step_outcome", outcome_judge_id="prm")


def test_under_the_single_rule_a_second_judges_reward_does_not_change_the_sample() -> None:
    session = task_session("s1", [GOOD], outcome=-1.0)
    single = PipelineConfig(linker=LinkerConfig(idle_timeout_s=600), samples=SampleConfig(method="binary"))
    driver = PipelineDriver(single, ScriptedEffects({"s1-t0": GOOD}, {}, hints=False))
    driver.feed_all(session.events)
    assert [s["reward"] for s in emitted(driver, "SampleReady")] == [1.0]
