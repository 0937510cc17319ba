"""Layer 2 of sample_builder: what the recorded inputs decide, for one turn and for the session.

Pure functions over the session state and its turn records (sample_turns); they mark turns decided
and the session finalized, drop decided turns' data, and return `Outcome`s that sample_events turns
into events. Per training method, a judged main turn (request, response and a next state known)
becomes a sample, a rejection, or waits:
- binary: waits for the reward; +-1 -> sample with that reward; 0 -> rejected "reward_zero".
- opd: waits for the hint outcome (and the teacher scores if a hint was selected); sample with the
  teacher logprobs and no reward; no hint -> rejected "no_valid_hint".
- combined: waits for the reward AND the hint outcome (and the teacher if a hint was selected);
  one sample with the reward if non-zero and the teacher logprobs if any; a reward-only turn has
  teacher_logprobs None (no spurious OPD term); neither -> rejected "no_signal".
A response that cannot be trained on exactly (empty, logprobs not one per token, greedy sampling)
and teacher logprobs (or top-K rows) not aligned with the response tokens are rejected instead of padded.

At least one sample per session (binary and combined): when the session is closed and every main
turn with a response is decided (or at the settle timeout, sample_builder.on_tick), a session
without any SampleReady gets its last judged main turn (highest turn_index with a reward and a
trainable response) promoted, with reward = the mean of its valid judge votes if that is non-zero,
else -promotion_reward (default 0.1). Why negative: a whole session without one positive or
negative verdict (all ties / neutral / no usable hint) is mild evidence the assistant was not
helpful, and unlike OpenClaw-RL's 0-reward promotion (a gradient no-op) the promoted sample then
actually moves the policy, gently. Not under opd: its trainer term needs teacher scores, which a
session without a sample has none of, so a promoted OPD sample would only add zero-advantage
tokens (diluting the batch's real ones) and KL (issue 19).
Under the step_outcome reward rule (general-agent tracks) the session decides its turns together
when it is over: see step_decisions.
Calls only sample_turns and step_decisions; reads and writes no topics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from orl.pipeline.processors import step_decisions
from orl.pipeline.processors.config import RewardRuleConfig, SampleConfig
from orl.pipeline.processors.event_building import State
from orl.pipeline.processors.sample_turns import TurnRecord, new_turn, response_arrays, response_problem
from orl.rules.top_k import top_k_rows_aligned

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Decision:
    """`reason` set: a rejection. Otherwise a sample with `reward` and/or teacher scores."""

    reason: str | None = None
    reward: float | None = None
    use_teacher: bool = False


WAIT: Decision | None = None


@dataclass(frozen=True)
class Outcome:
    """A decided turn. `turn` is its record as decided (the state may already hold only a marker);
    `promoted_at_ms` is set for an at-least-one promotion: the close (or settle deadline) time.
    `step` (step_outcome rule): the step's combined reward, a RewardDecided of its own, decided at
    `promoted_at_ms` too; `awaits_group`: the step goes to its group's normalisation, no sample yet."""

    turn_id: str
    turn: TurnRecord
    decision: Decision
    promoted_at_ms: int | None = None
    step: step_decisions.StepReward | None = None
    awaits_group: bool = False


def settle(
    state: State, turn_id: str | None, samples: SampleConfig, rules: RewardRuleConfig
) -> list[Outcome]:
    """What an input that touched `turn_id` (None: no turn) decides: that turn, then the session."""
    outcomes = settle_turn(state, turn_id, samples, rules) if turn_id is not None else []
    if state["closed"] is not None and not state["finalized"]:
        by_steps = rules.rule == step_decisions.STEP_RULE
        if step_decisions.steps_settled(state, rules) if by_steps else all_settled(state):
            outcomes += finalize(state, state["closed"]["occurred_at_ms"], samples, rules)
    return outcomes


def settle_turn(state: State, turn_id: str, samples: SampleConfig, rules: RewardRuleConfig) -> list[Outcome]:
    """Decide the turn if everything its method needs is known (under step_outcome: its group's
    reward, the only reward recorded as the turn's own)."""
    turn = state["turns"].get(turn_id)
    if turn is None or turn["decided"] or turn["kind"] != "main" or turn["response"] is None:
        return []
    if not turn["next_states"]:
        return []
    if rules.rule == step_decisions.STEP_RULE and turn["reward"] is None:
        return []
    decision = decide_turn(turn, samples.method)
    if decision is None:
        return []
    turn["decided"] = True
    if decision.reason is None:
        state["ready_count"] += 1
    prune_decided_turns(state, samples)
    return [Outcome(turn_id, turn, decision)]


def teacher_problem(turn: TurnRecord) -> str | None:
    teacher, response, hint = turn["teacher"], turn["response"], turn["hint"]
    if teacher["hint_event_id"] != hint["event_id"]:
        return "teacher_for_another_hint"
    token_ids = response_arrays(response)["response_token_ids"]
    if teacher["response_token_ids"] != token_ids:
        return "teacher_tokens_differ"
    if len(teacher["teacher_logprobs"]) != len(token_ids):
        return "teacher_misaligned"
    if not top_k_rows_aligned(
        teacher.get("teacher_top_ids"), teacher.get("teacher_top_logprobs"), len(token_ids)
    ):
        return "teacher_misaligned"
    return None


def hint_ready(turn: TurnRecord) -> bool:
    """The hint outcome is known and, if a hint was selected, so are the teacher scores."""
    hint = turn["hint"]
    return hint is not None and (not hint["selected"] or turn["teacher"] is not None)


def decide_binary(turn: TurnRecord) -> Decision | None:
    if turn["reward"] is None:
        return WAIT
    reward = float(turn["reward"]["reward"])
    return Decision(reward=reward) if reward != 0 else Decision(reason="reward_zero")


def decide_opd(turn: TurnRecord) -> Decision | None:
    if not hint_ready(turn):
        return WAIT
    if not turn["hint"]["selected"]:
        return Decision(reason="no_valid_hint")
    problem = teacher_problem(turn)
    return Decision(reason=problem) if problem else Decision(use_teacher=True)


def decide_combined(turn: TurnRecord) -> Decision | None:
    if turn["reward"] is None or not hint_ready(turn):
        return WAIT
    reward = float(turn["reward"]["reward"])
    use_teacher = bool(turn["hint"]["selected"]) and teacher_problem(turn) is None
    if reward == 0 and not use_teacher:
        return Decision(reason="no_signal")
    return Decision(reward=reward if reward != 0 else None, use_teacher=use_teacher)


DECIDERS = {"binary": decide_binary, "opd": decide_opd, "combined": decide_combined}


def decide_turn(turn: TurnRecord, method: str) -> Decision | None:
    """The decision for a main turn whose response is known, or None to keep waiting."""
    decision = DECIDERS[method](turn)
    if decision is None:
        return WAIT
    problem = response_problem(turn["response"])
    return Decision(reason=problem) if problem else decision


def all_settled(state: State) -> bool:
    """Every main turn with a response is decided, and the session's last turn is known.

    A close that names no last turn cannot tell whether more turns are still unread on other
    topics: such a session is settled only by the timeout in sample_builder.on_tick.
    """
    turns = state["turns"]
    for turn in turns.values():
        if turn["kind"] == "main" and turn["response"] is not None and not turn["decided"]:
            return False
    last_turn_id = state["closed"]["last_turn_id"]
    if last_turn_id is None:
        return False
    last = turns.get(last_turn_id)
    return last is not None and last["kind"] is not None and (last["kind"] != "main" or last["decided"])


def finalize(
    state: State, occurred_at_ms: int, samples: SampleConfig, rules: RewardRuleConfig
) -> list[Outcome]:
    """The session is over: promote a turn if it earned no sample, then drop decided turns' data."""
    state["finalized"] = True
    if rules.rule == step_decisions.STEP_RULE:
        return finalize_steps(state, occurred_at_ms, samples, rules)
    outcomes: list[Outcome] = []
    if samples.at_least_one and state["ready_count"] == 0 and samples.method == "opd":
        logger.info(
            "session %s: no sample; opd trains on teacher scores only, so nothing to promote",
            state["session_id"],
        )
    elif samples.at_least_one and state["ready_count"] == 0:
        turn_id = promotion_candidate(state["turns"])
        if turn_id is None:
            logger.info("session %s: no judged turn to promote", state["session_id"])
        else:
            turn = state["turns"][turn_id]
            reward = promotion_reward(turn, samples.promotion_reward)
            turn["decided"] = True
            state["ready_count"] += 1
            outcomes = [Outcome(turn_id, turn, Decision(reward=reward), promoted_at_ms=occurred_at_ms)]
    prune_decided_turns(state, samples)
    return outcomes


def finalize_steps(
    state: State, occurred_at_ms: int, samples: SampleConfig, rules: RewardRuleConfig
) -> list[Outcome]:
    """Every pending step gets its combined reward: a sample now, or (grouped) its group's reward later.
    A response that cannot be trained on exactly is rejected as under every rule."""
    rewards = step_decisions.step_rewards(state, rules)
    grouped = rules.group_advantage and state.get("group") is not None
    outcomes: list[Outcome] = []
    for turn_id, turn in sorted(state["turns"].items(), key=lambda item: item[1]["index"] or 0):
        if turn["kind"] != "main" or turn["response"] is None or turn["decided"]:
            continue
        step = rewards.get(turn_id)
        if step is None:  # not trainable
            turn["decided"] = True
            outcomes.append(Outcome(turn_id, turn, Decision(reason=response_problem(turn["response"]))))
            continue
        if grouped:
            outcomes.append(Outcome(turn_id, turn, Decision(reward=step.reward), occurred_at_ms, step, True))
            continue
        turn["decided"] = True
        decision = Decision(reward=step.reward) if step.reward != 0 else Decision(reason="reward_zero")
        if decision.reason is None:
            state["ready_count"] += 1
        outcomes.append(Outcome(turn_id, turn, decision, occurred_at_ms, step))
    prune_decided_turns(state, samples)
    return outcomes


def promotion_candidate(turns: dict[str, TurnRecord]) -> str | None:
    """The turn id to promote: the last judged main turn with a trainable response."""
    judged = [
        (turn["index"], turn_id)
        for turn_id, turn in turns.items()
        if turn.get("kind") == "main"
        and turn.get("response") is not None
        and (turn.get("reward") is not None or turn.get("hint") is not None)
        and response_problem(turn["response"]) is None
    ]
    return max(judged)[1] if judged else None


def promotion_reward(turn: TurnRecord, penalty: float) -> float:
    """Mean of the turn's valid votes if non-zero, else -penalty."""
    reward: dict[str, Any] | None = turn.get("reward")
    valid = [vote for vote in (reward["votes"] if reward else []) if vote is not None]
    mean = sum(valid) / len(valid) if valid else 0.0
    return float(mean) if mean != 0 else -penalty


def prune_decided_turns(state: State, samples: SampleConfig) -> None:
    """Drop the data of decided turns, except the one a later promotion may still need.

    The record is replaced, not cleared: an Outcome still holds the decided record for its event.
    """
    keep = None
    if samples.at_least_one and state["ready_count"] == 0 and not state["finalized"]:
        keep = promotion_candidate(state["turns"])
    for turn_id, turn in state["turns"].items():
        if turn["decided"] and turn_id != keep and turn["response"] is not None:
            state["turns"][turn_id] = {
                **new_turn(),
                "index": turn["index"],
                "kind": turn["kind"],
                "decided": True,
            }
