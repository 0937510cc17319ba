"""group_advantage: normalises the step rewards of a rollout group's sessions (GRPO-style).

Reads trajectories (TrajectoryScored, keyed by group id: one group's sessions meet in one state);
writes rewards (RewardDecided with rule "group_step_normalised", one per step, keyed by its session,
which sample_builder turns into that step's sample).

A group is n sessions that attempted the same task (the X-Group-Id / X-Group-Size the client sent).
It is decided when `group_size` trajectories have arrived, or `groups.timeout_s` after the first
with those that did (a group whose size is unknown waits for the timeout). Normalisation is per
step index, as OpenClaw-RL's step-wise estimator does it: the rewards of step k of every session
form a bucket; a bucket of two or more becomes (reward - mean) / (std + 1e-6) (population std),
reason "normalised", unless all its rewards are equal (reason "zero_variance", reward 0: no
signal); a bucket of one keeps its reward, reason "single_entry". A trajectory that arrives after
its group was decided is decided alone. Sessions are ordered by id and decisions read only the
trajectories' contents, so arrival order never changes an output.
The state of a group is a frozen `GroupState`, stored by `GROUP_STATE` (state_codec.frozen_state);
the dict states stored before 2026-12-02 read as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from orl.pipeline.processors.config import GROUP_RULE, PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import (
    Event,
    event_id_of,
    event_type_of,
    namespace_of,
    occurred_at_of,
    producer_name,
    remembered,
    session_id_of,
)
from orl.pipeline.processors.state_codec import StateCodec, evolved, frozen_state
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_constructors import reward_decided
from orl.schemas.event_types import TrajectoryScored
from orl.schemas.events import EventOrigin

NAME = "group_advantage"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
EPSILON = 1e-6


@dataclass(frozen=True)
class GroupStep:
    turn_id: str
    step_index: int
    reward: float
    reward_event_id: str


@dataclass(frozen=True)
class GroupState:
    namespace: str
    group_id: str
    size: int  # 0: unknown, the group waits for its timeout
    first_ms: int
    last_ms: int
    seen: tuple[str, ...] = ()
    trajectories: Mapping[str, tuple[GroupStep, ...]] = field(default_factory=dict)  # session id -> steps
    decided: bool = False


Trajectories = Mapping[str, tuple[GroupStep, ...]]


def normalised_buckets(trajectories: Trajectories) -> dict[tuple[str, str], tuple[float, str, str]]:
    """(session id, turn id) -> (advantage, reason, explanation) for every step of every trajectory."""
    buckets: dict[int, list[tuple[str, GroupStep]]] = {}
    for session_id in sorted(trajectories):
        for step in trajectories[session_id]:
            buckets.setdefault(step.step_index, []).append((session_id, step))
    decided: dict[tuple[str, str], tuple[float, str, str]] = {}
    for index, members in buckets.items():
        values = [step.reward for _, step in members]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((value - mean) ** 2 for value in values) / len(values))
        for session_id, step in members:
            value = step.reward
            if len(values) == 1:
                result = (value, "single_entry", f"step {index}: the only one of its group; kept {value:+g}")
            elif max(values) == min(values):
                result = (
                    0.0,
                    "zero_variance",
                    f"step {index}: all {len(values)} of the group {value:+g}; no signal",
                )
            else:
                advantage = (value - mean) / (std + EPSILON)
                result = (
                    advantage,
                    "normalised",
                    f"step {index} of {len(values)}: ({value:+g} - mean {mean:+.4g}) / (std {std:.4g} + 1e-6) "
                    f"= {advantage:+.4g}",
                )
            decided[(session_id, step.turn_id)] = result
    return decided


class GroupAdvantage:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs

    @property
    def state_codec(self) -> StateCodec:
        return GROUP_STATE

    def process(
        self, state: GroupState | None, event: Event, config: PipelineConfig
    ) -> tuple[GroupState | None, list[Emit]]:
        if event_type_of(event) != "TrajectoryScored":
            return state, []
        trajectory = cast(TrajectoryScored, event)
        if state is None:
            occurred_at_ms = occurred_at_of(event)
            namespace, group_id = namespace_of(event), trajectory["group_id"]
            state = GroupState(
                namespace, group_id, int(trajectory["group_size"]), occurred_at_ms, occurred_at_ms
            )
        seen = remembered(state.seen, event_id_of(event), config.seen_window)
        if seen is None:
            return state, []
        session_id = session_id_of(event) or ""
        steps = tuple(GroupStep(**step) for step in trajectory["steps"])
        state = evolved(state, seen=seen, last_ms=max(state.last_ms, occurred_at_of(event)))
        if state.decided:
            return state, decide(state, {session_id: steps}, occurred_at_of(event), config)
        if session_id not in state.trajectories:
            state = evolved(state, trajectories={**state.trajectories, session_id: steps})
        if state.size > 0 and len(state.trajectories) >= state.size:
            return decide_group(state, config)
        return state, []

    def on_tick(
        self, state: GroupState, now_ms: int, config: PipelineConfig
    ) -> tuple[GroupState | None, list[Emit]]:
        if not state.decided:
            if now_ms - state.first_ms < config.groups.timeout_s * 1000:
                return state, []
            return decide_group(state, config, state.first_ms + int(config.groups.timeout_s * 1000))
        if now_ms - state.last_ms >= config.groups.retention_s * 1000:
            return None, []
        return state, []


def decide_group(
    state: GroupState, config: PipelineConfig, deadline_ms: int | None = None
) -> tuple[GroupState, list[Emit]]:
    """Decide the group with the trajectories it has; keep only the decided marker."""
    occurred_at_ms = state.last_ms if deadline_ms is None else max(state.last_ms, deadline_ms)
    emits = decide(state, state.trajectories, occurred_at_ms, config)
    return evolved(state, decided=True, trajectories={}), emits


def decide(
    state: GroupState, trajectories: Trajectories, occurred_at_ms: int, config: PipelineConfig
) -> list[Emit]:
    """One RewardDecided per step of `trajectories`, normalised within them."""
    steps = {(session_id, step.turn_id): step for session_id, of in trajectories.items() for step in of}
    members = sorted(step.reward_event_id for step in steps.values())
    emits = []
    for (session_id, turn_id), (advantage, reason, explanation) in sorted(
        normalised_buckets(trajectories).items()
    ):
        step = steps[(session_id, turn_id)]
        origin = EventOrigin(
            namespace=state.namespace,
            producer=PRODUCER,
            occurred_at_ms=occurred_at_ms,
            id_parts=(state.group_id, step.reward_event_id, GROUP_RULE, LOGIC_VERSION, *members),
            session_id=session_id,
            turn_id=turn_id,
        )
        event = reward_decided(
            origin,
            vote_ids=[],
            votes=[],
            rule=GROUP_RULE,
            rule_version=LOGIC_VERSION,
            reward=advantage,
            reason=reason,
            promoted=False,
            judge_id=None,
            parts=[
                {
                    "reward_event_id": step.reward_event_id,
                    "judge_id": None,
                    "reward": step.reward,
                    "weight": 1.0,
                }
            ],
            explanation=f"group {state.group_id} ({len(trajectories)} rollouts), {explanation}",
        )
        emits.append(Emit("rewards", dict(event)))
    return emits


GROUP_STATE = frozen_state(GroupState)
GROUP_ADVANTAGE = GroupAdvantage()
