"""sample_builder: one SampleReady or SampleRejected per judged main turn, and at least one per session.

Reads requests (RequestReceived), responses (ResponseGenerated), next_states (NextStateObserved),
rewards (RewardDecided; its own promotions and step rewards skipped), hints (HintSelected / HintRejected; votes
skipped), teacher_scores (TeacherScored) and sessions (SessionClosed). Writes samples
(SampleReady / SampleRejected), rewards (RewardDecided, reason "at_least_one_promotion", or a
step's combined reward under the step_outcome rule) and trajectories (TrajectoryScored: a grouped
session's step rewards, for group_advantage).

One input goes down three modules, each entered once, and comes back up with the events:
1. sample_inputs records it into the session's frozen state (the first reward / hint outcome /
   teacher score of a turn wins; decided turns ignore further inputs);
2. sample_decisions decides what is now decided: the turn, once its request, response, a next
   state and everything the method needs are known, whatever order those came in (side turns
   never become samples); then the session, once it is closed and every main turn with a response
   is decided (or `settle_timeout_s` after the close, via on_tick): a session without any
   SampleReady gets its last judged turn promoted. Decided turns keep only a small marker (token
   arrays are dropped) unless still needed for a promotion;
3. this module builds the events those decisions become (below).
The closed session's state is deleted `closed_retention_s` after the close.

The events: an Outcome becomes a SampleReady or a SampleRejected on samples; a promotion becomes a
RewardDecided on rewards (reason "at_least_one_promotion", promoted=True, the turn's original votes)
followed by its SampleReady; a step (step_outcome rule) becomes its combined RewardDecided (naming
its parts) followed by its sample, or, when it awaits its group, by nothing: the session's awaiting
steps become one TrajectoryScored on trajectories. Samples carry the exact sampled token ids, their
logprobs, the temperature actually used and the policy version of the response. A sample's lineage
and occurred_at come only from the inputs its method uses, so an input the method ignores (a hint
under binary) never makes the output depend on arrival order; ids are deterministic from the
lineage and the sample config version.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import cast

from orl.pipeline.processors import sample_decisions, sample_inputs
from orl.pipeline.processors.config import STEP_RULE, PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import Event, event_id_of, occurred_at_of, producer_name
from orl.pipeline.processors.sample_decisions import Outcome
from orl.pipeline.processors.sample_inputs import (
    NAME,
    SAMPLE_STATE,
    Hint,
    Reward,
    SessionSamples,
    Teacher,
    Turn,
)
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_constructors import reward_decided, sample_ready, sample_rejected, trajectory_scored
from orl.schemas.event_types import Lineage, RewardDecided, SampleReady, SampleRejected, TrajectoryScored
from orl.schemas.events import EventOrigin

logger = logging.getLogger(__name__)

LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
PROMOTION_RULE = "at_least_one_promotion"


class SampleBuilder:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs
    state_codec = SAMPLE_STATE

    def process(
        self, state: SessionSamples | None, event: Event, config: PipelineConfig
    ) -> tuple[SessionSamples, list[Emit]]:
        recorded = sample_inputs.record(state, event, config)
        if not recorded.may_decide:
            return recorded.state, []
        decided, outcomes = sample_decisions.settle(
            recorded.state, recorded.turn_id, config.samples, config.rewards
        )
        return decided, emits_for(decided, outcomes, config)

    def on_tick(
        self, state: SessionSamples, now_ms: int, config: PipelineConfig
    ) -> tuple[SessionSamples | None, list[Emit]]:
        closed = state.closed
        if closed is None:
            return state, []
        if state.finalized:
            expired = now_ms - closed.occurred_at_ms >= config.samples.closed_retention_s * 1000
            return (None, []) if expired else (state, [])
        deadline_ms = closed.occurred_at_ms + int(config.samples.settle_timeout_s * 1000)
        if now_ms < deadline_ms:
            return state, []
        logger.info("session %s: settle timeout, finalizing with what is known", state.session_id)
        decided, outcomes = sample_decisions.finalize(state, deadline_ms, config.samples, config.rewards)
        return decided, emits_for(decided, outcomes, config)


def emits_for(state: SessionSamples, outcomes: list[Outcome], config: PipelineConfig) -> list[Emit]:
    emits: list[Emit] = []
    trajectory: list[tuple[Outcome, RewardDecided]] = []
    for outcome in outcomes:
        if outcome.step is not None:
            step_reward = step_reward_event(state, outcome, config)
            emits.append(Emit("rewards", dict(step_reward)))
            if outcome.awaits_group:
                trajectory.append((outcome, step_reward))
            else:
                reward_id, occurred_at_ms = event_id_of(step_reward), occurred_at_of(step_reward)
                emits.append(Emit("samples", sample_event(state, outcome, occurred_at_ms, config, reward_id)))
        elif outcome.promoted_at_ms is not None:
            emits += promotion_emits(state, outcome, outcome.promoted_at_ms, config)
        else:
            occurred_at_ms = inputs_occurred_at_ms(outcome.turn, config.samples.method)
            emits.append(Emit("samples", sample_event(state, outcome, occurred_at_ms, config)))
    if trajectory:
        emits.append(Emit("trajectories", dict(trajectory_event(state, trajectory, config))))
    return emits


def origin(
    state: SessionSamples, turn_id: str | None, occurred_at_ms: int, id_parts: tuple[str, ...]
) -> EventOrigin:
    return EventOrigin(
        namespace=state.namespace,
        producer=PRODUCER,
        occurred_at_ms=occurred_at_ms,
        id_parts=id_parts,
        session_id=state.session_id,
        turn_id=turn_id,
    )


def sample_event(
    state: SessionSamples,
    outcome: Outcome,
    occurred_at_ms: int,
    config: PipelineConfig,
    reward_event_id: str | None = None,
    promoted: bool = False,
) -> Event:
    """The turn's SampleReady, or its SampleRejected if the decision has a reason."""
    reason = outcome.decision.reason
    if reason is not None:
        return dict(rejected_event(state, outcome, reason, occurred_at_ms, config, reward_event_id))
    return dict(ready_event(state, outcome, occurred_at_ms, config, reward_event_id, promoted))


def step_reward_event(state: SessionSamples, outcome: Outcome, config: PipelineConfig) -> RewardDecided:
    """A step's combined reward (step_outcome rule), naming the rewards it combined and how."""
    step, response = outcome.step, outcome.turn.response
    assert step is not None and outcome.promoted_at_ms is not None and response is not None
    occurred_at_ms = max(
        outcome.promoted_at_ms, response.occurred_at_ms, *(p.occurred_at_ms for p in step.parts)
    )
    part_ids = tuple(part.reward_event_id for part in step.parts)
    id_parts = (outcome.turn_id, STEP_RULE, *part_ids, config.rewards.version)
    return reward_decided(
        origin(state, outcome.turn_id, occurred_at_ms, id_parts),
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


def trajectory_event(
    state: SessionSamples, steps: list[tuple[Outcome, RewardDecided]], config: PipelineConfig
) -> TrajectoryScored:
    """The session's steps awaiting their group's normalisation, for the group_advantage stage."""
    group = state.group
    assert group is not None and state.session_id is not None
    reward_ids = tuple(event_id_of(reward) for _, reward in steps)
    occurred_at_ms = max(occurred_at_of(reward) for _, reward in steps)
    return trajectory_scored(
        origin(
            state, None, occurred_at_ms, (state.session_id, group.id, *reward_ids, config.rewards.version)
        ),
        group_id=group.id,
        group_size=group.size or 0,
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
    state: SessionSamples,
    outcome: Outcome,
    occurred_at_ms: int,
    config: PipelineConfig,
    reward_event_id: str | None,
    promoted: bool,
) -> SampleReady:
    """The SampleReady of a decided turn: its exact tokens, the reward and/or the teacher scores."""
    turn, decision, arrays, method = outcome.turn, outcome.decision, outcome.arrays, config.samples.method
    response, teacher = turn.response, turn.teacher if decision.use_teacher else None
    assert response is not None and arrays is not None
    sample_lineage = lineage(turn, method, reward_event_id)
    id_parts = (
        outcome.turn_id,
        method,
        *lineage_parts(sample_lineage),
        str(promoted),
        config.samples.version,
    )
    return sample_ready(
        origin(state, outcome.turn_id, occurred_at_ms, id_parts),
        method=method,
        prompt_token_ids=list(arrays.prompt_token_ids),
        response_token_ids=list(arrays.response_token_ids),
        old_logprobs=list(arrays.response_logprobs),
        temperature=response.temperature,
        reward=decision.reward,
        teacher_logprobs=None if teacher is None else list(teacher.teacher_logprobs),
        teacher_kind=None if teacher is None else teacher.teacher_kind,
        policy_version=response.policy_version,
        policy_run=response.policy_run,
        promoted=promoted,
        off_policy=response.off_policy,
        lineage=sample_lineage,
        teacher_top_ids=None
        if teacher is None or teacher.teacher_top_ids is None
        else [list(row) for row in teacher.teacher_top_ids],
        teacher_top_logprobs=None
        if teacher is None or teacher.teacher_top_logprobs is None
        else [list(row) for row in teacher.teacher_top_logprobs],
    )


def rejected_event(
    state: SessionSamples,
    outcome: Outcome,
    reason: str,
    occurred_at_ms: int,
    config: PipelineConfig,
    reward_event_id: str | None,
) -> SampleRejected:
    method = config.samples.method
    sample_lineage = lineage(outcome.turn, method, reward_event_id)
    id_parts = (outcome.turn_id, method, reason, *lineage_parts(sample_lineage), config.samples.version)
    return sample_rejected(
        origin(state, outcome.turn_id, occurred_at_ms, id_parts),
        method=method,
        reason=reason,
        lineage=sample_lineage,
    )


def promotion_emits(
    state: SessionSamples, outcome: Outcome, closed_at_ms: int, config: PipelineConfig
) -> list[Emit]:
    """A promoted turn: its RewardDecided (the turn's original votes), then its SampleReady."""
    turn, turn_id = outcome.turn, outcome.turn_id
    occurred_at_ms = max(closed_at_ms, inputs_occurred_at_ms(turn, config.samples.method))
    original, promoted_reward = turn.reward, outcome.decision.reward
    assert promoted_reward is not None  # a promotion always has its reward
    original_id = "" if original is None else original.event_id
    reward_event = reward_decided(
        origin(
            state, turn_id, occurred_at_ms, (turn_id, PROMOTION_RULE, original_id, config.samples.version)
        ),
        vote_ids=[] if original is None else list(original.vote_ids),
        votes=[] if original is None else list(original.votes),
        rule=PROMOTION_RULE,
        rule_version=LOGIC_VERSION,
        reward=promoted_reward,
        reason=PROMOTION_RULE,
        promoted=True,
        judge_id=None if original is None else original.judge_id,
        parts=[],
        explanation=None,
    )
    sample = sample_event(state, outcome, occurred_at_ms, config, event_id_of(reward_event), promoted=True)
    return [Emit("rewards", dict(reward_event)), Emit("samples", sample)]


def used_inputs(turn: Turn, method: str) -> tuple[Reward | None, Hint | None, Teacher | None]:
    """The reward, hint and teacher records the method waits for (None: not used, or not known)."""
    uses_reward, uses_hint = method in ("binary", "combined"), method in ("opd", "combined")
    return (
        turn.reward if uses_reward else None,
        turn.hint if uses_hint else None,
        turn.teacher if uses_hint else None,
    )


def lineage(turn: Turn, method: str, reward_event_id: str | None = None) -> Lineage:
    """The ids a sample was built from; `reward_event_id` overrides the turn's (promotion, step)."""
    reward, hint, teacher = used_inputs(turn, method)
    assert turn.request_event_id is not None and turn.response is not None
    return {
        "request_event_id": turn.request_event_id,
        "response_event_id": turn.response.event_id,
        "next_state_event_id": turn.next_state_event_id,
        "reward_event_id": (None if reward is None else reward.event_id)
        if reward_event_id is None
        else reward_event_id,
        "hint_event_id": None if hint is None else hint.event_id,
        "teacher_event_id": None if teacher is None else teacher.event_id,
    }


def lineage_parts(sample_lineage: Lineage) -> tuple[str, ...]:
    """The lineage's ids in the order of their sorted names ("" for None), for event ids."""
    ids = cast(Mapping[str, str | None], sample_lineage)
    return tuple(ids[name] or "" for name in sorted(ids))


def inputs_occurred_at_ms(turn: Turn, method: str) -> int:
    """The latest occurred_at among the inputs the method used: independent of their arrival order."""
    assert turn.response is not None
    used = [record.occurred_at_ms for record in used_inputs(turn, method) if record is not None]
    return max([turn.response.occurred_at_ms, *used])


SAMPLE_BUILDER = SampleBuilder()
