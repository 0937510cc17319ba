"""hint_selector: picks the hint of a turn among its m hint votes, or says why there is none.

Reads hints (HintVoteCast; its own HintSelected / HintRejected on the same topic are skipped);
writes hints (HintSelected or HintRejected).

A vote is a candidate if its score is 1 and its stripped hint is longer than `min_hint_chars`
(10, as in OpenClaw-RL). The longest candidate wins; ties go to the lowest vote_index, so the
choice never depends on arrival order. Without a candidate: HintRejected with reason
"hints_too_short" (some vote said 1 but gave no usable hint), "no_valid_votes" (every vote
failed to parse) or "all_negative". Waits for `votes_per_judgement` votes, or `vote_timeout_s`
after the first one (on_tick).
State per session: namespace, session_id, seen, last_activity_ms, judgements (as vote_tally's,
each vote also holding its hint).
"""

from __future__ import annotations

from typing import Any, cast

from orl.pipeline.processors import vote_collection
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, ProcessResult
from orl.pipeline.processors.event_building import (
    Event,
    State,
    build_event,
    event_id_of,
    event_type_of,
    producer_name,
    remember_event,
)
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_types import HintVoteCast

NAME = "hint_selector"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)


def best_hint_vote(votes: list[dict[str, Any]], min_hint_chars: int) -> dict[str, Any] | None:
    """The vote with the longest usable hint (score 1, stripped hint > min_hint_chars); first index wins ties.

    `votes` must be in vote_index order.
    """
    best: dict[str, Any] | None = None
    for vote in votes:
        hint = (vote.get("hint") or "").strip()
        if vote["score"] != 1 or len(hint) <= min_hint_chars:
            continue
        if best is None or len(hint) > len(best["hint"].strip()):
            best = vote
    return best


def rejection_reason(votes: list[dict[str, Any]]) -> str:
    scores = [vote["score"] for vote in votes]
    if 1 in scores:
        return "hints_too_short"
    if all(score is None for score in scores):
        return "no_valid_votes"
    return "all_negative"


class HintSelector:
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs

    def process(self, state: State | None, event: Event, config: PipelineConfig) -> ProcessResult:
        state = state if state is not None else vote_collection.new_vote_state(event)
        if event_type_of(event) != "HintVoteCast" or not remember_event(
            state, event_id_of(event), config.seen_window
        ):
            return state, []
        added = vote_collection.add_vote(state, cast(HintVoteCast, event), extra_fields=("hint",))
        if added is None:
            return state, []
        key, judgement = added
        if len(judgement["votes"]) < config.hints.votes_per_judgement:
            return state, []
        return state, [decide(state, key, judgement, vote_collection.last_vote_ms(judgement), config)]

    def on_tick(self, state: State, now_ms: int, config: PipelineConfig) -> ProcessResult:
        emits = [
            decide(state, key, judgement, deadline_ms, config)
            for key, judgement, deadline_ms in vote_collection.expired_judgements(
                state, now_ms, config.hints.vote_timeout_s
            )
        ]
        if not emits and vote_collection.can_forget(state, now_ms, config.hints.retention_s):
            return None, []
        return state, emits


def decide(
    state: State, key: str, judgement: vote_collection.Judgement, occurred_at_ms: int, config: PipelineConfig
) -> Emit:
    votes = vote_collection.votes_in_order(judgement)
    vote_ids = [vote["event_id"] for vote in votes]
    best = best_hint_vote(votes, config.hints.min_hint_chars)
    common: dict[str, Any] = {
        "producer": PRODUCER,
        "namespace": state["namespace"],
        "session_id": state["session_id"],
        "turn_id": judgement["turn_id"],
        "occurred_at_ms": occurred_at_ms,
        "id_parts": (key, *vote_ids, config.hints.version),
        "hint_vote_ids": vote_ids,
    }
    if best is not None:
        event = build_event(
            "HintSelected", selected_vote_id=best["event_id"], hint=best["hint"].strip(), **common
        )
    else:
        event = build_event("HintRejected", reason=rejection_reason(votes), **common)
    vote_collection.mark_decided(state, key)
    return Emit("hints", event)


HINT_SELECTOR = HintSelector()
