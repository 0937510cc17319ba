"""sample_builder: one SampleReady or SampleRejected per judged main turn, and at least one per session.

Reads requests (RequestReceived), responses (ResponseGenerated), next_states (NextStateObserved),
rewards (RewardDecided; its own promotions skipped), hints (HintSelected / HintRejected; votes
skipped), teacher_scores (TeacherScored) and sessions (SessionClosed). Writes samples
(SampleReady / SampleRejected) and rewards (RewardDecided, reason "at_least_one_promotion").

A main turn is decided once its request, response and a next state are known and everything the
method needs has arrived (pipeline/processors/sample_decisions.py), whatever order those came in; the first
reward / hint outcome / teacher score of a turn wins. Samples carry the exact sampled token ids,
their logprobs, the temperature actually used and the policy version of the response. Side turns
never become samples. When the session is closed and every main turn with a response is decided
(or `settle_timeout_s` after the close, via on_tick), a session without any SampleReady gets its
last judged turn promoted (pipeline/processors/session_promotion.py). Decided turns keep only a small marker
(token arrays are dropped) unless still needed for a promotion; the closed session's tombstone is
deleted `closed_retention_s` after the close.
State per session: namespace, session_id, seen, turns (turn_id -> index, kind, request_event_id,
response, next_states, reward, hint, teacher, decided), request_turns (request_id -> turn_id),
waiting_responses (responses that came before their request), ready_count, closed, finalized.
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline.processors import sample_decisions, session_promotion
from pipeline.processors.config import PipelineConfig
from pipeline.processors.contract import Emit, ProcessResult
from pipeline.processors.event_building import (
    Event,
    State,
    build_event,
    emitted_by,
    envelope_of,
    event_id_of,
    event_type_of,
    occurred_at_of,
    producer_name,
    remember_event,
    session_id_of,
)
from pipeline.processors.sample_decisions import Decision, TurnRecord
from pipeline.processors.sample_inputs import INPUT_RECORDERS, new_turn, record_response
from pipeline.processors.topology import stage_named

logger = logging.getLogger(__name__)

NAME = "sample_builder"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
PROMOTION_RULE = "at_least_one_promotion"


class SampleBuilder:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs

    def process(self, state: State | None, event: Event, config: PipelineConfig) -> ProcessResult:
        state = state if state is not None else new_state(event)
        if not remember_event(state, event_id_of(event), config.seen_window) or emitted_by(event, NAME):
            return state, []
        event_type = event_type_of(event)
        if event_type == "SessionClosed":
            on_session_closed(state, event)
            return state, try_finalize(state, config)
        if event_type == "ResponseGenerated":
            turn_id = record_response(state, event, packed=config.compact_states)
        else:
            recorder = INPUT_RECORDERS.get(event_type)
            if recorder is None:
                return state, []
            turn_id = recorder(state, event)
        emits = settle_turn(state, turn_id, config) if turn_id is not None else []
        return state, emits + try_finalize(state, config)

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
        return state, finalize(state, deadline_ms, config)


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
    }


def on_session_closed(state: State, event: Event) -> None:
    state["closed"] = {
        "event_id": event_id_of(event),
        "last_turn_id": event.get("last_turn_id"),
        "occurred_at_ms": occurred_at_of(event),
    }
    state["finalized"] = False


def settle_turn(state: State, turn_id: str, config: PipelineConfig) -> list[Emit]:
    """Decide the turn if everything its method needs is known."""
    turn = state["turns"].get(turn_id)
    if turn is None or turn["decided"] or turn["kind"] != "main" or turn["response"] is None:
        return []
    if not turn["next_states"]:
        return []
    method = config.samples.method
    decision = sample_decisions.decide_turn(turn, method)
    if decision is None:
        return []
    turn["decided"] = True
    occurred_at_ms = sample_decisions.inputs_occurred_at_ms(turn, method)
    if decision.reason is not None:
        emit = Emit("samples", rejected_event(state, turn_id, turn, decision.reason, occurred_at_ms, config))
    else:
        state["ready_count"] += 1
        emit = Emit("samples", ready_event(state, turn_id, turn, decision, occurred_at_ms, config))
    prune_decided_turns(state, config)
    return [emit]


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
    payload = sample_decisions.sample_payload(
        turn, method, decision, promoted=promoted, reward_event_id=reward_event_id
    )
    id_parts = (turn_id, method, *lineage_parts(payload["lineage"]), str(promoted), config.samples.version)
    return build_event("SampleReady", **envelope_args(state, turn_id, occurred_at_ms, id_parts), **payload)


def rejected_event(
    state: State, turn_id: str, turn: TurnRecord, reason: str, occurred_at_ms: int, config: PipelineConfig
) -> Event:
    method = config.samples.method
    lineage = sample_decisions.lineage(turn, method)
    id_parts = (turn_id, method, reason, *lineage_parts(lineage), config.samples.version)
    return build_event(
        "SampleRejected",
        **envelope_args(state, turn_id, occurred_at_ms, id_parts),
        method=method,
        reason=reason,
        lineage=lineage,
    )


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


def lineage_parts(lineage: dict[str, Any]) -> tuple[str, ...]:
    return tuple(lineage[key] or "" for key in sorted(lineage))


def all_settled(state: State) -> bool:
    """Every main turn with a response is decided, and the session's last turn is known.

    A close that names no last turn cannot tell whether more turns are still unread on other
    topics: such a session is settled only by the timeout in on_tick.
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


def try_finalize(state: State, config: PipelineConfig) -> list[Emit]:
    if state["closed"] is None or state["finalized"] or not all_settled(state):
        return []
    return finalize(state, state["closed"]["occurred_at_ms"], config)


def finalize(state: State, occurred_at_ms: int, config: PipelineConfig) -> list[Emit]:
    """The session is over: promote a turn if it earned no sample, then drop decided turns' data."""
    state["finalized"] = True
    emits: list[Emit] = []
    if config.samples.at_least_one and state["ready_count"] == 0:
        turn_id = session_promotion.promotion_candidate(state["turns"])
        if turn_id is None:
            logger.info("session %s: no judged turn to promote", state["session_id"])
        else:
            emits = promote(state, turn_id, occurred_at_ms, config)
    prune_decided_turns(state, config)
    return emits


def promote(state: State, turn_id: str, closed_at_ms: int, config: PipelineConfig) -> list[Emit]:
    turn = state["turns"][turn_id]
    method = config.samples.method
    occurred_at_ms = max(closed_at_ms, sample_decisions.inputs_occurred_at_ms(turn, method))
    reward = session_promotion.promotion_reward(turn, config.samples.promotion_reward)
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
        reward=reward,
        reason=PROMOTION_RULE,
        promoted=True,
    )
    sample = ready_event(
        state, turn_id, turn, Decision(reward=reward), occurred_at_ms, config,
        promoted=True, reward_event_id=event_id_of(reward_event),
    )  # fmt: skip
    turn["decided"] = True
    state["ready_count"] += 1
    return [Emit("rewards", reward_event), Emit("samples", sample)]


def prune_decided_turns(state: State, config: PipelineConfig) -> None:
    """Drop the data of decided turns, except the one a later promotion may still need."""
    keep = None
    if config.samples.at_least_one and state["ready_count"] == 0 and not state["finalized"]:
        keep = session_promotion.promotion_candidate(state["turns"])
    for turn_id, turn in state["turns"].items():
        if turn["decided"] and turn_id != keep and turn["response"] is not None:
            state["turns"][turn_id] = {
                **new_turn(),
                "index": turn["index"],
                "kind": turn["kind"],
                "decided": True,
            }


SAMPLE_BUILDER = SampleBuilder()
