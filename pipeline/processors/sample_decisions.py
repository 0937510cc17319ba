"""Layer 2 of sample_builder: what the recorded inputs decide, for one turn and for the session.

Pure functions from a `SessionSamples` (sample_inputs) to the next one and the `Outcome`s that
sample_builder turns into events: they mark turns decided and the session finalized, and drop
decided turns' data. Per training method, a judged main turn (request, response and a next state
known) becomes a sample, a rejection, or waits:
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

Under the step_outcome reward rule (general-agent tracks) every main turn is a step: the process
judge scores it on its own next state, and the task's outcome arrives once, from a connector, as a
next state of some turn that the outcome judge scores. Nothing is decided per turn: when the
session is closed, every step with a response has its process reward and the outcome is known (or
at the settle timeout, with what is known), each step's reward is
`step_weight * process_t + (1 - step_weight) * outcome` (rules/step_rewards.py; a missing process
reward counts as 0, a missing outcome as 0 with reason "no_outcome"). Without a group, the step
becomes a sample with that reward (0: rejected "reward_zero"). With `group_advantage` and a session
that carries a group id, the steps wait instead: sample_builder writes the session's trajectory for
the group_advantage stage, whose normalised reward (a RewardDecided with rule GROUP_RULE) decides
each step later, in settle_turn.

A decided sample's token arrays are unpacked here (the packed form is sample_inputs'), once, into
its Outcome. Reads sample_inputs' types only; reads and writes no topics.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from orl.pipeline.processors.config import STEP_RULE, RewardRuleConfig, SampleConfig
from orl.pipeline.processors.sample_inputs import (
    NO_VALID_VOTES,
    InlineArrays,
    Response,
    Reward,
    SessionSamples,
    Turn,
)
from orl.pipeline.processors.state_codec import evolved
from orl.rules.step_rewards import trajectory_rewards
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


@dataclass(frozen=True)
class Outcome:
    """A decided turn. `turn` is its record as decided (the state may already hold only a marker);
    `arrays` its response's token arrays, for a sample; `promoted_at_ms` is set for an at-least-one
    promotion: the close (or settle deadline) time. `step` (step_outcome rule): the step's combined
    reward, a RewardDecided of its own, decided at `promoted_at_ms` too; `awaits_group`: the step
    goes to its group's normalisation, no sample yet."""

    turn_id: str
    turn: Turn
    decision: Decision
    arrays: InlineArrays | None = None
    promoted_at_ms: int | None = None
    step: StepReward | None = None
    awaits_group: bool = False


Decided = tuple[SessionSamples, list[Outcome]]


def settle(
    state: SessionSamples, turn_id: str | None, samples: SampleConfig, rules: RewardRuleConfig
) -> Decided:
    """What an input that touched `turn_id` (None: no turn) decides: that turn, then the session."""
    outcomes: list[Outcome] = []
    if turn_id is not None:
        state, outcomes = settle_turn(state, turn_id, samples, rules)
    closed = state.closed
    if closed is None or state.finalized:
        return state, outcomes
    if steps_settled(state, rules) if rules.rule == STEP_RULE else all_settled(state):
        state, finalized = finalize(state, closed.occurred_at_ms, samples, rules)
        outcomes += finalized
    return state, outcomes


def settle_turn(
    state: SessionSamples, turn_id: str, samples: SampleConfig, rules: RewardRuleConfig
) -> Decided:
    """Decide the turn if everything its method needs is known (under step_outcome: its group's
    reward, the only reward recorded as the turn's own)."""
    turn = state.turns.get(turn_id)
    response = None if turn is None else turn.response
    if turn is None or response is None or turn.decided or turn.kind != "main" or not turn.next_states:
        return state, []
    if rules.rule == STEP_RULE and turn.reward is None:
        return state, []
    decision = decide_turn(turn, response, samples.method)
    if decision is None:
        return state, []
    turn = evolved(turn, decided=True)
    ready = decision.reason is None
    state = evolved(state, turns={**state.turns, turn_id: turn}, ready_count=state.ready_count + ready)
    outcome = Outcome(turn_id, turn, decision, arrays=token_arrays(response) if ready else None)
    return prune_decided_turns(state, samples), [outcome]


def token_arrays(response: Response) -> InlineArrays:
    """A response's token arrays, unpacked if they are packed."""
    arrays = response.arrays
    if isinstance(arrays, InlineArrays):
        return arrays
    prompt_ids, response_ids = json.loads(arrays.token_ids_json)
    raw = base64.b64decode(arrays.logprobs_f64)
    return InlineArrays(prompt_ids, response_ids, list(struct.unpack(f"<{len(raw) // 8}d", raw)))


def teacher_problem(turn: Turn, response: Response) -> str | None:
    teacher, hint = turn.teacher, turn.hint
    assert teacher is not None and hint is not None
    if teacher.hint_event_id != hint.event_id:
        return "teacher_for_another_hint"
    token_ids = list(token_arrays(response).response_token_ids)
    if list(teacher.response_token_ids) != token_ids:
        return "teacher_tokens_differ"
    if len(teacher.teacher_logprobs) != len(token_ids):
        return "teacher_misaligned"
    if not top_k_rows_aligned(teacher.teacher_top_ids, teacher.teacher_top_logprobs, len(token_ids)):
        return "teacher_misaligned"
    return None


def hint_ready(turn: Turn) -> bool:
    """The hint outcome is known and, if a hint was selected, so are the teacher scores."""
    return turn.hint is not None and (not turn.hint.selected or turn.teacher is not None)


def decide_turn(turn: Turn, response: Response, method: str) -> Decision | None:
    """The decision for a main turn whose `response` is known, or None to keep waiting."""
    reward = None if turn.reward is None else turn.reward.reward
    if method == "binary":
        if reward is None:
            return WAIT
        decision = Decision(reward=reward) if reward != 0 else Decision(reason="reward_zero")
    elif method == "opd":
        if not hint_ready(turn):
            return WAIT
        if turn.hint is None or not turn.hint.selected:
            decision = Decision(reason="no_valid_hint")
        else:
            problem = teacher_problem(turn, response)
            decision = Decision(reason=problem) if problem else Decision(use_teacher=True)
    else:  # combined
        if reward is None or not hint_ready(turn):
            return WAIT
        use_teacher = turn.hint is not None and turn.hint.selected and teacher_problem(turn, response) is None
        if reward == 0 and not use_teacher:
            decision = Decision(reason="no_signal")
        else:
            decision = Decision(reward=reward if reward != 0 else None, use_teacher=use_teacher)
    return Decision(reason=response.problem) if response.problem else decision


def all_settled(state: SessionSamples) -> bool:
    """Every main turn with a response is decided, and the session's last turn is known.

    A close that names no last turn cannot tell whether more turns are still unread on other
    topics: such a session is settled only by the timeout in sample_builder.on_tick.
    """
    for turn in state.turns.values():
        if turn.kind == "main" and turn.response is not None and not turn.decided:
            return False
    last_turn_id = state.closed.last_turn_id if state.closed else None
    last = None if last_turn_id is None else state.turns.get(last_turn_id)
    return last is not None and last.kind is not None and (last.kind != "main" or last.decided)


def finalize(
    state: SessionSamples, occurred_at_ms: int, samples: SampleConfig, rules: RewardRuleConfig
) -> Decided:
    """The session is over: promote a turn if it earned no sample, then drop decided turns' data."""
    state = evolved(state, finalized=True)
    if rules.rule == STEP_RULE:
        return finalize_steps(state, occurred_at_ms, samples, rules)
    outcomes: list[Outcome] = []
    if samples.at_least_one and state.ready_count == 0 and samples.method == "opd":
        logger.info(
            "session %s: no sample; opd trains on teacher scores only, so nothing to promote",
            state.session_id,
        )
    elif samples.at_least_one and state.ready_count == 0:
        turn_id = promotion_candidate(state.turns)
        if turn_id is None:
            logger.info("session %s: no judged turn to promote", state.session_id)
        else:
            turn = evolved(state.turns[turn_id], decided=True)
            assert turn.response is not None
            state = evolved(state, turns={**state.turns, turn_id: turn}, ready_count=state.ready_count + 1)
            decision = Decision(reward=promotion_reward(turn.reward, samples.promotion_reward))
            arrays = token_arrays(turn.response)
            outcomes = [Outcome(turn_id, turn, decision, arrays, promoted_at_ms=occurred_at_ms)]
    return prune_decided_turns(state, samples), outcomes


def finalize_steps(
    state: SessionSamples, occurred_at_ms: int, samples: SampleConfig, rules: RewardRuleConfig
) -> Decided:
    """Every pending step gets its combined reward: a sample now, or (grouped) its group's reward later.
    A response that cannot be trained on exactly is rejected as under every rule."""
    rewards = step_rewards(state, rules)
    grouped = rules.group_advantage and state.group is not None
    turns, ready_count = dict(state.turns), state.ready_count
    outcomes: list[Outcome] = []
    for turn_id, turn in sorted(state.turns.items(), key=lambda item: item[1].index or 0):
        response = turn.response
        if turn.kind != "main" or response is None or turn.decided:
            continue
        step = rewards.get(turn_id)
        if step is None:  # not trainable
            turns[turn_id] = turn = evolved(turn, decided=True)
            outcomes.append(Outcome(turn_id, turn, Decision(reason=response.problem)))
            continue
        if grouped:
            decision = Decision(reward=step.reward)
            outcomes.append(Outcome(turn_id, turn, decision, None, occurred_at_ms, step, awaits_group=True))
            continue
        turns[turn_id] = turn = evolved(turn, decided=True)
        if step.reward == 0:
            outcomes.append(
                Outcome(turn_id, turn, Decision(reason="reward_zero"), None, occurred_at_ms, step)
            )
            continue
        ready_count += 1
        arrays = token_arrays(response)
        outcomes.append(Outcome(turn_id, turn, Decision(reward=step.reward), arrays, occurred_at_ms, step))
    state = evolved(state, turns=turns, ready_count=ready_count)
    return prune_decided_turns(state, samples), outcomes


def promotion_candidate(turns: Mapping[str, Turn]) -> str | None:
    """The turn id to promote: the last judged main turn with a trainable response."""
    judged = [
        (turn.index, turn_id)
        for turn_id, turn in turns.items()
        if turn.kind == "main"
        and turn.response is not None
        and (turn.reward is not None or turn.hint is not None)
        and turn.response.problem is None
    ]
    return max(judged)[1] if judged else None  # type: ignore[type-var]  # main turns have an index


def promotion_reward(reward: Reward | None, penalty: float) -> float:
    """Mean of the turn's valid votes if non-zero, else -penalty."""
    valid = [vote for vote in (reward.votes if reward else []) if vote is not None]
    mean = sum(valid) / len(valid) if valid else 0.0
    return float(mean) if mean != 0 else -penalty


def prune_decided_turns(state: SessionSamples, samples: SampleConfig) -> SessionSamples:
    """Drop the data of decided turns, except the one a later promotion may still need.

    The record is replaced by a marker: an Outcome still holds the decided record for its event.
    """
    keep = None
    if samples.at_least_one and state.ready_count == 0 and not state.finalized:
        keep = promotion_candidate(state.turns)
    markers = {
        turn_id: Turn(index=turn.index, kind=turn.kind, decided=True)
        for turn_id, turn in state.turns.items()
        if turn.decided and turn_id != keep and turn.response is not None
    }
    return evolved(state, turns={**state.turns, **markers}) if markers else state


def judge_reward(turn: Turn, judge_id: str) -> Reward | None:
    return turn.judge_rewards.get(judge_id)


def session_outcome(state: SessionSamples, rules: RewardRuleConfig) -> Reward | None:
    """The outcome judge's valid reward on the session's latest turn that has one."""
    found = [
        ((turn.index or 0, reward.occurred_at_ms, reward.event_id), reward)
        for turn in state.turns.values()
        if (reward := judge_reward(turn, rules.outcome_judge_id)) is not None
        and reward.reason != NO_VALID_VOTES
    ]
    return max(found, key=lambda item: item[0])[1] if found else None


def steps_settled(state: SessionSamples, rules: RewardRuleConfig) -> bool:
    """The session is closed on a known last turn, every main turn has its response, a next state
    and its process reward, and the outcome is known. (A main turn whose response never comes, a
    client that left, is waited for until sample_builder's settle timeout.)"""
    last_turn_id = state.closed.last_turn_id if state.closed else None
    last = None if last_turn_id is None else state.turns.get(last_turn_id)
    if last is None or last.kind is None:
        return False
    for turn in state.turns.values():
        if turn.kind != "main" or turn.decided:
            continue
        if turn.response is None or not turn.next_states:
            return False
        if judge_reward(turn, rules.process_judge_id) is None:
            return False
    return session_outcome(state, rules) is not None


def step_rewards(state: SessionSamples, rules: RewardRuleConfig) -> dict[str, StepReward]:
    """turn id -> the combined reward of every pending step with a trainable response, in turn order.

    Of the several rewards one judge may give a turn (one per next state), the valid one with the
    earliest (occurred_at, event id) counts (sample_inputs.better_reward)."""
    outcome = session_outcome(state, rules)
    outcome_value = outcome.reward if outcome else 0.0
    steps = sorted(
        (turn.index or 0, turn_id)
        for turn_id, turn in state.turns.items()
        if turn.kind == "main"
        and turn.response is not None
        and not turn.decided
        and turn.response.problem is None
    )
    weight = rules.step_weight
    rewards: dict[str, StepReward] = {}
    for step_index, (_, turn_id) in enumerate(steps):
        process = judge_reward(state.turns[turn_id], rules.process_judge_id)
        process_value = process.reward if process else 0.0
        (reward,) = trajectory_rewards([process_value], outcome_value, weight)
        parts = []
        if process is not None:
            parts.append(
                RewardPart(
                    process.event_id, rules.process_judge_id, process.reward, weight, process.occurred_at_ms
                )
            )
        if outcome is not None:
            parts.append(
                RewardPart(
                    outcome.event_id,
                    rules.outcome_judge_id,
                    outcome.reward,
                    1.0 - weight,
                    outcome.occurred_at_ms,
                )
            )
        explanation = (
            f"step {step_index}: {weight:g} x process {process_value:+g} "
            f"+ {1.0 - weight:g} x outcome {outcome_value:+g}{'' if outcome else ' (no outcome)'} = {reward:+g}"
        )
        reason = "step_outcome" if outcome else "no_outcome"
        rewards[turn_id] = StepReward(step_index, reward, reason, tuple(parts), explanation)
    return rewards
