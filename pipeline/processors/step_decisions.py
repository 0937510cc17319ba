"""Layer 2 of sample_builder under the step_outcome reward rule (general-agent tracks).

Every main turn of a session is a step: the process judge scores it on its own next state (a tool
result, the user's reply), and the task's outcome arrives once, from a connector, as a next state of
some turn that the outcome judge scores. Nothing is decided per turn: when the session is closed,
every step with a response has its process reward and the outcome is known (or at the settle
timeout, with what is known), each step's reward is

    reward_t = step_weight * process_t + (1 - step_weight) * outcome

(step_rule.trajectory_rewards; a missing process reward counts as 0, a
missing outcome as 0 with reason "no_outcome"). Without a group, the step then becomes a sample
with that reward (0: rejected "reward_zero"). With `group_advantage` and a session that carries a
group id, the steps wait instead: sample_events writes the session's trajectory for the
group_advantage stage, whose normalised reward (a RewardDecided with rule GROUP_RULE) decides each
step later, in sample_decisions.settle_turn.

Of the several rewards one judge may give a turn (one per next state), the valid one (not
"no_valid_votes") with the earliest (occurred_at, event id) counts. Calls only sample_turns and the
trajectory rule; reads and writes no topics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orl.pipeline.processors.config import RewardRuleConfig
from orl.pipeline.processors.event_building import State
from orl.pipeline.processors.sample_turns import TurnRecord, response_problem
from orl.pipeline.processors.step_rule import trajectory_rewards

STEP_RULE = "step_outcome"
GROUP_RULE = "group_step_normalised"


@dataclass(frozen=True)
class RewardPart:
    """One reward a combined reward read (a RewardDecided of a judge), with its weight."""

    reward_event_id: str
    judge_id: str
    reward: float
    weight: float
    occurred_at_ms: int


@dataclass(frozen=True)
class StepReward:
    """A step's combined reward: its position among the session's trainable steps and its parts."""

    step_index: int
    reward: float
    reason: str  # "step_outcome", or "no_outcome" when the outcome never came
    parts: tuple[RewardPart, ...]
    explanation: str


def better_reward(current: dict[str, Any] | None, candidate: dict[str, Any]) -> bool:
    """Does `candidate` replace a judge's `current` reward of a turn? Valid beats invalid, then the
    earliest (occurred_at, event id): the choice does not depend on arrival order."""
    if current is None:
        return True
    current_valid, candidate_valid = _valid(current), _valid(candidate)
    if current_valid != candidate_valid:
        return candidate_valid
    order = (candidate["occurred_at_ms"], candidate["event_id"])
    return order < (current["occurred_at_ms"], current["event_id"])


def _valid(record: dict[str, Any]) -> bool:
    return record.get("reason") != "no_valid_votes"


def judge_reward(turn: TurnRecord, judge_id: str) -> dict[str, Any] | None:
    record: dict[str, Any] | None = (turn.get("judge_rewards") or {}).get(judge_id)
    return record


def session_outcome(state: State, rules: RewardRuleConfig) -> dict[str, Any] | None:
    """The outcome judge's valid reward on the session's latest turn that has one."""
    found = [
        ((turn["index"] or 0, record["occurred_at_ms"], record["event_id"]), record)
        for turn in state["turns"].values()
        if (record := judge_reward(turn, rules.outcome_judge_id)) is not None and _valid(record)
    ]
    return max(found, key=lambda item: item[0])[1] if found else None


def steps_settled(state: State, rules: RewardRuleConfig) -> bool:
    """The session is closed on a known last turn, every main turn has its response, a next state
    and its process reward, and the outcome is known. (A main turn whose response never comes, a
    client that left, is waited for until sample_builder's settle timeout.)"""
    closed = state["closed"]
    last_turn_id = closed["last_turn_id"] if closed else None
    if last_turn_id is None or state["turns"].get(last_turn_id, {}).get("kind") is None:
        return False
    for turn in state["turns"].values():
        if turn["kind"] != "main" or turn["decided"]:
            continue
        if turn["response"] is None or not turn["next_states"]:
            return False
        if judge_reward(turn, rules.process_judge_id) is None:
            return False
    return session_outcome(state, rules) is not None


def step_rewards(state: State, rules: RewardRuleConfig) -> dict[str, StepReward]:
    """turn id -> the combined reward of every pending step with a trainable response, in turn order."""
    outcome = session_outcome(state, rules)
    outcome_value = float(outcome["reward"]) if outcome else 0.0
    steps = sorted(
        (turn["index"] or 0, turn_id)
        for turn_id, turn in state["turns"].items()
        if turn["kind"] == "main"
        and turn["response"] is not None
        and not turn["decided"]
        and response_problem(turn["response"]) is None
    )
    weight = rules.step_weight
    rewards: dict[str, StepReward] = {}
    for step_index, (_, turn_id) in enumerate(steps):
        process = judge_reward(state["turns"][turn_id], rules.process_judge_id)
        process_value = float(process["reward"]) if process else 0.0
        (reward,) = trajectory_rewards([process_value], outcome_value, weight)
        parts = []
        if process is not None:
            parts.append(_part(process, rules.process_judge_id, weight))
        if outcome is not None:
            parts.append(_part(outcome, rules.outcome_judge_id, 1.0 - weight))
        explanation = (
            f"step {step_index}: {weight:g} x process {process_value:+g} "
            f"+ {1.0 - weight:g} x outcome {outcome_value:+g}{'' if outcome else ' (no outcome)'} = {reward:+g}"
        )
        rewards[turn_id] = StepReward(
            step_index, reward, "step_outcome" if outcome else "no_outcome", tuple(parts), explanation
        )
    return rewards


def _part(record: dict[str, Any], judge_id: str, weight: float) -> RewardPart:
    return RewardPart(
        record["event_id"], judge_id, float(record["reward"]), weight, int(record["occurred_at_ms"])
    )
