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
State per group: namespace, group_id, size, seen, first_ms, last_ms, trajectories (session id ->
steps), decided.
"""

from __future__ import annotations

import math
from typing import Any, cast

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, ProcessResult
from orl.pipeline.processors.event_building import (
    Event,
    State,
    build_event,
    envelope_of,
    event_id_of,
    event_type_of,
    occurred_at_of,
    producer_name,
    remember_event,
    session_id_of,
)
from orl.pipeline.processors.step_decisions import GROUP_RULE
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_types import TrajectoryScored

NAME = "group_advantage"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
EPSILON = 1e-6


def normalised_buckets(
    trajectories: dict[str, list[dict[str, Any]]],
) -> dict[tuple[str, str], tuple[float, str, str]]:
    """(session id, turn id) -> (advantage, reason, explanation) for every step of every trajectory."""
    buckets: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for session_id in sorted(trajectories):
        for step in trajectories[session_id]:
            buckets.setdefault(int(step["step_index"]), []).append((session_id, step))
    decided: dict[tuple[str, str], tuple[float, str, str]] = {}
    for index, members in buckets.items():
        values = [float(step["reward"]) for _, step in members]
        mean = sum(values) / len(values)
        std = math.sqrt(sum((value - mean) ** 2 for value in values) / len(values))
        for session_id, step in members:
            value = float(step["reward"])
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
            decided[(session_id, step["turn_id"])] = result
    return decided


class GroupAdvantage:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs

    def process(self, state: State | None, event: Event, config: PipelineConfig) -> ProcessResult:
        if event_type_of(event) != "TrajectoryScored":
            return state, []
        trajectory = cast(TrajectoryScored, event)
        state = state if state is not None else new_group_state(trajectory)
        if not remember_event(state, event_id_of(event), config.seen_window):
            return state, []
        session_id = session_id_of(event) or ""
        steps = [dict(step) for step in trajectory["steps"]]
        state["last_ms"] = max(state["last_ms"], occurred_at_of(event))
        if state["decided"]:
            return state, decide(state, {session_id: steps}, occurred_at_of(event), config)
        state["trajectories"].setdefault(session_id, steps)
        if state["size"] > 0 and len(state["trajectories"]) >= state["size"]:
            return state, decide_group(state, config)
        return state, []

    def on_tick(self, state: State, now_ms: int, config: PipelineConfig) -> ProcessResult:
        if not state["decided"]:
            if now_ms - state["first_ms"] < config.groups.timeout_s * 1000:
                return state, []
            state = dict(state)
            return state, decide_group(state, config, state["first_ms"] + int(config.groups.timeout_s * 1000))
        if now_ms - state["last_ms"] >= config.groups.retention_s * 1000:
            return None, []
        return state, []


def new_group_state(event: TrajectoryScored) -> State:
    return {
        "namespace": envelope_of(event)["namespace"],
        "group_id": event["group_id"],
        "size": int(event["group_size"]),
        "seen": [],
        "first_ms": occurred_at_of(event),
        "last_ms": occurred_at_of(event),
        "trajectories": {},
        "decided": False,
    }


def decide_group(state: State, config: PipelineConfig, deadline_ms: int | None = None) -> list[Emit]:
    """Decide the group with the trajectories it has; keep only the decided marker."""
    trajectories = state["trajectories"]
    occurred_at_ms = state["last_ms"] if deadline_ms is None else max(state["last_ms"], deadline_ms)
    emits = decide(state, trajectories, occurred_at_ms, config)
    state["decided"] = True
    state["trajectories"] = {}
    return emits


def decide(
    state: State, trajectories: dict[str, list[dict[str, Any]]], occurred_at_ms: int, config: PipelineConfig
) -> list[Emit]:
    """One RewardDecided per step of `trajectories`, normalised within them."""
    steps = {(session_id, step["turn_id"]): step for session_id, of in trajectories.items() for step in of}
    members = sorted(step["reward_event_id"] for step in steps.values())
    emits = []
    for (session_id, turn_id), (advantage, reason, explanation) in sorted(
        normalised_buckets(trajectories).items()
    ):
        step = steps[(session_id, turn_id)]
        event = build_event(
            "RewardDecided",
            producer=PRODUCER,
            namespace=state["namespace"],
            session_id=session_id,
            turn_id=turn_id,
            occurred_at_ms=occurred_at_ms,
            id_parts=(state["group_id"], step["reward_event_id"], GROUP_RULE, LOGIC_VERSION, *members),
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
                    "reward_event_id": step["reward_event_id"],
                    "judge_id": None,
                    "reward": float(step["reward"]),
                    "weight": 1.0,
                }
            ],
            explanation=f"group {state['group_id']} ({len(trajectories)} rollouts), {explanation}",
        )
        emits.append(Emit("rewards", event))
    return emits


GROUP_ADVANTAGE = GroupAdvantage()
