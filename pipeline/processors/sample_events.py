"""Layer 3 of sample_builder: the events its decided turns become.

An Outcome (sample_decisions) becomes a SampleReady or a SampleRejected on samples; a promotion
becomes a RewardDecided on rewards (reason "at_least_one_promotion", promoted=True, the turn's
original votes) followed by its SampleReady; a step (step_outcome rule) becomes its combined
RewardDecided (naming its parts) followed by its sample, or, when it awaits its group, by nothing:
the session's awaiting steps become one TrajectoryScored on trajectories, keyed by the group id.
Samples carry the exact sampled token ids, their logprobs, the temperature actually used and the
policy version of the response. A sample's lineage and occurred_at come only from the inputs its
method uses, so an input the method ignores (a hint under binary) never makes the output depend on
arrival order; ids are deterministic from the lineage and the sample config version.
Calls only event_building (build_event), sample_turns (unpacking the token arrays) and
step_decisions (the rule's name); writes the samples, rewards and trajectories events that
sample_builder emits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import Event, State, build_event, event_id_of, producer_name
from orl.pipeline.processors.sample_decisions import Decision, Outcome
from orl.pipeline.processors.sample_turns import TurnRecord, response_arrays
from orl.pipeline.processors.step_decisions import STEP_RULE
from orl.schemas.event_types import Lineage

NAME = "sample_builder"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
PROMOTION_RULE = "at_least_one_promotion"

# The inputs each method waits for: only these go into a sample's lineage and occurred_at.
METHOD_INPUTS = {"binary": ("reward",), "opd": ("hint", "teacher"), "combined": ("reward", "hint", "teacher")}


def emits_for(state: State, outcomes: list[Outcome], config: PipelineConfig) -> list[Emit]:
    emits: list[Emit] = []
    trajectory: list[tuple[Outcome, Event]] = []
    for outcome in outcomes:
        turn_id, turn, decision = outcome.turn_id, outcome.turn, outcome.decision
        if outcome.step is not None:
            step_reward = step_reward_event(state, outcome, config)
            emits.append(Emit("rewards", step_reward))
            if outcome.awaits_group:
                trajectory.append((outcome, step_reward))
            else:
                emits.append(Emit("samples", step_sample_event(state, outcome, step_reward, config)))
            continue
        if outcome.promoted_at_ms is not None:
            emits += promotion_emits(state, turn_id, turn, decision, outcome.promoted_at_ms, config)
            continue
        occurred_at_ms = inputs_occurred_at_ms(turn, config.samples.method)
        if decision.reason is not None:
            event = rejected_event(state, turn_id, turn, decision.reason, occurred_at_ms, config)
        else:
            event = ready_event(state, turn_id, turn, decision, occurred_at_ms, config)
        emits.append(Emit("samples", event))
    if trajectory:
        emits.append(Emit("trajectories", trajectory_event(state, trajectory, config)))
    return emits


def step_reward_event(state: State, outcome: Outcome, config: PipelineConfig) -> Event:
    """A step's combined reward (step_outcome rule), naming the rewards it combined and how."""
    step = outcome.step
    assert step is not None and outcome.promoted_at_ms is not None
    occurred_at_ms = max(
        outcome.promoted_at_ms,
        int(outcome.turn["response"]["occurred_at_ms"]),
        *(part.occurred_at_ms for part in step.parts),
    )
    part_ids = tuple(part.reward_event_id for part in step.parts)
    return build_event(
        "RewardDecided",
        **envelope_args(
            state,
            outcome.turn_id,
            occurred_at_ms,
            (outcome.turn_id, STEP_RULE, *part_ids, config.rewards.version),
        ),
        vote_ids=[],
        votes=[],
        rule=STEP_RULE,
        rule_version=LOGIC_VERSION,
        reward=step.reward,
        reason=step.reason,
        promoted=False,
        judge_id=None,
        parts=[
            {
                "reward_event_id": p.reward_event_id,
                "judge_id": p.judge_id,
                "reward": p.reward,
                "weight": p.weight,
            }
            for p in step.parts
        ],
        explanation=step.explanation,
    )


def step_sample_event(state: State, outcome: Outcome, step_reward: Event, config: PipelineConfig) -> Event:
    """The step's SampleReady (or SampleRejected "reward_zero"), its lineage naming the combined reward."""
    occurred_at_ms = step_reward["envelope"]["occurred_at"]
    reward_id = event_id_of(step_reward)
    if outcome.decision.reason is not None:
        return rejected_event(
            state, outcome.turn_id, outcome.turn, outcome.decision.reason, occurred_at_ms, config, reward_id
        )
    return ready_event(
        state,
        outcome.turn_id,
        outcome.turn,
        outcome.decision,
        occurred_at_ms,
        config,
        reward_event_id=reward_id,
    )


def trajectory_event(state: State, steps: list[tuple[Outcome, Event]], config: PipelineConfig) -> Event:
    """The session's steps awaiting their group's normalisation, for the group_advantage stage."""
    group = state["group"]
    reward_ids = tuple(event_id_of(reward) for _, reward in steps)
    return build_event(
        "TrajectoryScored",
        producer=PRODUCER,
        namespace=state["namespace"],
        session_id=state["session_id"],
        turn_id=None,
        occurred_at_ms=max(reward["envelope"]["occurred_at"] for _, reward in steps),
        id_parts=(state["session_id"], group["id"], *reward_ids, config.rewards.version),
        group_id=group["id"],
        group_size=group["size"] or 0,
        steps=[
            {
                "turn_id": outcome.turn_id,
                "step_index": outcome.step.step_index,
                "reward": outcome.step.reward,
                "reward_event_id": event_id_of(reward),
            }
            for outcome, reward in steps
            if outcome.step is not None
        ],
    )


def ready_event(
    state: State,
    turn_id: str,
    turn: TurnRecord,
    decision: Decision,
    occurred_at_ms: int,
    config: PipelineConfig,
    *,
    promoted: bool = False,
    reward_event_id: str | None = None,
) -> Event:
    method = config.samples.method
    payload = sample_payload(turn, method, decision, promoted=promoted, reward_event_id=reward_event_id)
    id_parts = (turn_id, method, *lineage_parts(payload["lineage"]), str(promoted), config.samples.version)
    return build_event("SampleReady", **envelope_args(state, turn_id, occurred_at_ms, id_parts), **payload)


def rejected_event(
    state: State,
    turn_id: str,
    turn: TurnRecord,
    reason: str,
    occurred_at_ms: int,
    config: PipelineConfig,
    reward_event_id: str | None = None,
) -> Event:
    method = config.samples.method
    sample_lineage = lineage(turn, method, reward_event_id)
    id_parts = (turn_id, method, reason, *lineage_parts(sample_lineage), config.samples.version)
    return build_event(
        "SampleRejected",
        **envelope_args(state, turn_id, occurred_at_ms, id_parts),
        method=method,
        reason=reason,
        lineage=sample_lineage,
    )


def promotion_emits(
    state: State,
    turn_id: str,
    turn: TurnRecord,
    decision: Decision,
    closed_at_ms: int,
    config: PipelineConfig,
) -> list[Emit]:
    occurred_at_ms = max(closed_at_ms, inputs_occurred_at_ms(turn, config.samples.method))
    original = turn["reward"] or {"event_id": "", "vote_ids": [], "votes": []}
    reward_event = build_event(
        "RewardDecided",
        **envelope_args(
            state,
            turn_id,
            occurred_at_ms,
            (turn_id, PROMOTION_RULE, original["event_id"], config.samples.version),
        ),
        vote_ids=original["vote_ids"],
        votes=original["votes"],
        rule=PROMOTION_RULE,
        rule_version=LOGIC_VERSION,
        reward=decision.reward,
        reason=PROMOTION_RULE,
        promoted=True,
        judge_id=original.get("judge_id"),
        parts=[],
        explanation=None,
    )
    sample = ready_event(
        state, turn_id, turn, decision, occurred_at_ms, config,
        promoted=True, reward_event_id=event_id_of(reward_event),
    )  # fmt: skip
    return [Emit("rewards", reward_event), Emit("samples", sample)]


def envelope_args(
    state: State, turn_id: str, occurred_at_ms: int, id_parts: tuple[str, ...]
) -> dict[str, Any]:
    return {
        "producer": PRODUCER,
        "namespace": state["namespace"],
        "session_id": state["session_id"],
        "turn_id": turn_id,
        "occurred_at_ms": occurred_at_ms,
        "id_parts": id_parts,
    }


def used_inputs(turn: TurnRecord, method: str) -> dict[str, dict[str, Any]]:
    return {name: turn[name] for name in METHOD_INPUTS[method] if turn.get(name) is not None}


def lineage(turn: TurnRecord, method: str, reward_event_id: str | None = None) -> Lineage:
    """The ids a sample was built from; `reward_event_id` overrides the turn's (promotion)."""
    used = {name: str(record["event_id"]) for name, record in used_inputs(turn, method).items()}
    return {
        "request_event_id": turn["request_event_id"],
        "response_event_id": turn["response"]["event_id"],
        "next_state_event_id": turn.get("next_state_event_id"),
        "reward_event_id": reward_event_id if reward_event_id is not None else used.get("reward"),
        "hint_event_id": used.get("hint"),
        "teacher_event_id": used.get("teacher"),
    }


def lineage_parts(sample_lineage: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(sample_lineage[key] or "" for key in sorted(sample_lineage))


def sample_payload(
    turn: TurnRecord, method: str, decision: Decision, *, promoted: bool, reward_event_id: str | None = None
) -> dict[str, Any]:
    """The SampleReady fields (besides the envelope) of a turn."""
    response = turn["response"]
    arrays = response_arrays(response)
    teacher = turn["teacher"] if decision.use_teacher else None
    return {
        "method": method,
        "prompt_token_ids": arrays["prompt_token_ids"],
        "response_token_ids": arrays["response_token_ids"],
        "old_logprobs": arrays["response_logprobs"],
        "temperature": response["temperature"],
        "reward": decision.reward,
        "teacher_logprobs": teacher["teacher_logprobs"] if teacher else None,
        "teacher_kind": teacher["teacher_kind"] if teacher else None,
        "policy_version": response["policy_version"],
        "promoted": promoted,
        "off_policy": response["off_policy"],
        "lineage": lineage(turn, method, reward_event_id),
        "teacher_top_ids": teacher.get("teacher_top_ids") if teacher else None,
        "teacher_top_logprobs": teacher.get("teacher_top_logprobs") if teacher else None,
    }


def inputs_occurred_at_ms(turn: TurnRecord, method: str) -> int:
    """The latest occurred_at among the inputs the method used: independent of their arrival order."""
    times = [int(record["occurred_at_ms"]) for record in used_inputs(turn, method).values()]
    return max([int(turn["response"]["occurred_at_ms"]), *times])
