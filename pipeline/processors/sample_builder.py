"""sample_builder: one SampleReady or SampleRejected per judged main turn, and at least one per session.

Reads requests (RequestReceived), responses (ResponseGenerated), next_states (NextStateObserved),
rewards (RewardDecided; its own promotions and step rewards skipped), hints (HintSelected / HintRejected; votes
skipped), teacher_scores (TeacherScored) and sessions (SessionClosed). Writes samples
(SampleReady / SampleRejected), rewards (RewardDecided, reason "at_least_one_promotion", or a
step's combined reward under the step_outcome rule) and trajectories (TrajectoryScored: a grouped
session's step rewards, for group_advantage).

One input goes down three layers, each entered once and calling only further down:
1. sample_inputs records it into its turn record (the first reward / hint outcome / teacher
   score of a turn wins; decided turns ignore further inputs);
2. sample_decisions decides what is now decided: the turn, once its request, response, a next
   state and everything the method needs are known, whatever order those came in (side turns
   never become samples); then the session, once it is closed and every main turn with a response
   is decided (or `settle_timeout_s` after the close, via on_tick): a session without any
   SampleReady gets its last judged turn promoted. Decided turns keep only a small marker (token
   arrays are dropped) unless still needed for a promotion;
3. sample_events builds the events those decisions become.
All three share the turn record format of sample_turns. The closed session's tombstone is deleted
`closed_retention_s` after the close.
State per session: namespace, session_id, seen, turns (turn_id -> index, kind, request_event_id,
response, next_states, reward, judge_rewards, hint, teacher, decided), request_turns (request_id ->
turn_id), waiting_responses (responses that came before their request), ready_count, closed,
finalized, group (the rollout group's id and size, or None).
"""

from __future__ import annotations

import logging
from typing import cast

from orl.pipeline.processors import sample_decisions, sample_events, sample_inputs
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import ProcessResult
from orl.pipeline.processors.event_building import (
    Event,
    State,
    emitted_by,
    envelope_of,
    event_id_of,
    event_type_of,
    remember_event,
    session_id_of,
)
from orl.pipeline.processors.sample_events import NAME
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_types import ResponseGenerated, RewardDecided

logger = logging.getLogger(__name__)


class SampleBuilder:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs

    def process(self, state: State | None, event: Event, config: PipelineConfig) -> ProcessResult:
        state = state if state is not None else new_state(event)
        if not remember_event(state, event_id_of(event), config.seen_window) or emitted_by(event, NAME):
            return state, []
        event_type = event_type_of(event)
        if event_type == "ResponseGenerated":
            response = cast(ResponseGenerated, event)
            turn_id = sample_inputs.record_response(state, response, packed=config.compact_states)
        elif event_type == "RewardDecided":
            turn_id = sample_inputs.record_reward(state, cast(RewardDecided, event), config.rewards)
        else:
            recorder = sample_inputs.INPUT_RECORDERS.get(event_type)
            if recorder is None:
                return state, []
            turn_id = recorder(state, event)
        outcomes = sample_decisions.settle(state, turn_id, config.samples, config.rewards)
        return state, sample_events.emits_for(state, outcomes, config)

    def on_tick(self, state: State, now_ms: int, config: PipelineConfig) -> ProcessResult:
        closed = state["closed"]
        if closed is None:
            return state, []
        if state["finalized"]:
            expired = now_ms - closed["occurred_at_ms"] >= config.samples.closed_retention_s * 1000
            return (None, []) if expired else (state, [])
        deadline_ms = closed["occurred_at_ms"] + int(config.samples.settle_timeout_s * 1000)
        if now_ms < deadline_ms:
            return state, []
        logger.info("session %s: settle timeout, finalizing with what is known", state["session_id"])
        state = dict(state)  # a new object: finalizing may change the state without emitting anything
        outcomes = sample_decisions.finalize(state, deadline_ms, config.samples, config.rewards)
        return state, sample_events.emits_for(state, outcomes, config)


def new_state(event: Event) -> State:
    return {
        "namespace": envelope_of(event)["namespace"],
        "session_id": session_id_of(event),
        "seen": [],
        "turns": {},
        "request_turns": {},
        "waiting_responses": {},
        "ready_count": 0,
        "closed": None,
        "finalized": False,
        "group": None,
    }


SAMPLE_BUILDER = SampleBuilder()
