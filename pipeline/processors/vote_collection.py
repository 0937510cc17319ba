"""Collecting the m votes of one judgement in session state: `VoteCollector`, the processor skeleton
vote_tally and hint_selector share, and the state functions under it.

A judgement = the votes of one judge config on one next state of one turn. Votes are kept by
vote_index (a second vote with the same index is ignored), decided once all expected votes are in
or, from `on_tick`, once `vote_timeout_s` has passed since the first vote (missing votes count as
failures). A decided judgement is compacted to a marker so late duplicates are ignored; a session
with nothing pending is deleted `retention_s` after its last vote.
Reads and writes no topics itself.
"""

from __future__ import annotations

from typing import Any, cast

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, ProcessResult
from orl.pipeline.processors.event_building import (
    AnyEvent,
    Event,
    State,
    envelope_of,
    event_id_of,
    event_type_of,
    occurred_at_of,
    remember_event,
    turn_id_of,
)
from orl.schemas.event_types import HintVoteCast, JudgeVoteCast

Judgement = dict[str, Any]
Vote = JudgeVoteCast | HintVoteCast


class VoteCollector:
    """A processor that gathers each judgement's votes and decides once they are all in, or once its
    vote timeout has passed (on_tick). A subclass names the vote event it reads (`vote_type`), what
    each vote keeps besides its score (`extra_fields`), and says how many votes a judgement needs,
    which timeouts apply and how a judgement is decided."""

    vote_type: str
    extra_fields: tuple[str, ...] = ()

    def votes_needed(self, judgement: Judgement, config: PipelineConfig) -> int:
        raise NotImplementedError

    def timeouts_s(self, config: PipelineConfig) -> tuple[float, float]:
        """(vote timeout, retention): how long a judgement waits for votes, and a quiet session's state."""
        raise NotImplementedError

    def decide(
        self, state: State, key: str, judgement: Judgement, occurred_at_ms: int, config: PipelineConfig
    ) -> Emit:
        raise NotImplementedError

    def process(self, state: State | None, event: Event, config: PipelineConfig) -> ProcessResult:
        state = state if state is not None else new_vote_state(event)
        if event_type_of(event) != self.vote_type or not remember_event(
            state, event_id_of(event), config.seen_window
        ):
            return state, []
        added = add_vote(state, cast(Vote, event), self.extra_fields)
        if added is None:
            return state, []
        key, judgement = added
        if len(judgement["votes"]) < self.votes_needed(judgement, config):
            return state, []
        return state, [self.decide(state, key, judgement, last_vote_ms(judgement), config)]

    def on_tick(self, state: State, now_ms: int, config: PipelineConfig) -> ProcessResult:
        vote_timeout_s, retention_s = self.timeouts_s(config)
        emits = [
            self.decide(state, key, judgement, deadline_ms, config)
            for key, judgement, deadline_ms in expired_judgements(state, now_ms, vote_timeout_s)
        ]
        if not emits and can_forget(state, now_ms, retention_s):
            return None, []
        return state, emits


def new_vote_state(event: AnyEvent) -> State:
    envelope = envelope_of(event)
    return {
        "namespace": envelope["namespace"],
        "session_id": envelope.get("session_id"),
        "seen": [],
        "last_activity_ms": occurred_at_of(event),
        "judgements": {},
    }


def judgement_key(event: Vote) -> str:
    parts = (
        turn_id_of(event) or "",
        event["next_state_event_id"],
        event["judge_id"],
        event["judge_config_version"],
    )
    return "|".join(parts)


def add_vote(state: State, event: Vote, extra_fields: tuple[str, ...] = ()) -> tuple[str, Judgement] | None:
    """Store a vote in its judgement; None if the judgement is already decided or the index is taken."""
    state["last_activity_ms"] = max(state["last_activity_ms"], occurred_at_of(event))
    key = judgement_key(event)
    judgement = state["judgements"].setdefault(key, new_judgement(event))
    index = str(int(event["vote_index"]))
    if judgement["decided"] or index in judgement["votes"]:
        return None
    vote: dict[str, Any] = {
        "event_id": event_id_of(event),
        "score": event.get("score"),
        "occurred_at_ms": occurred_at_of(event),
    }
    vote.update({name: event.get(name) for name in extra_fields})
    judgement["votes"][index] = vote
    return key, judgement


def new_judgement(event: Vote) -> Judgement:
    return {
        "turn_id": turn_id_of(event),
        "judge_id": event["judge_id"],
        "judge_kind": event["judge_kind"],
        "next_state_event_id": event["next_state_event_id"],
        "first_vote_ms": occurred_at_of(event),
        "votes": {},
        "decided": False,
    }


def votes_in_order(judgement: Judgement) -> list[dict[str, Any]]:
    """The judgement's votes sorted by vote_index, whatever order they arrived in."""
    return [judgement["votes"][index] for index in sorted(judgement["votes"], key=int)]


def last_vote_ms(judgement: Judgement) -> int:
    """The latest occurred_at among the votes: order-invariant, unlike 'the vote that arrived last'."""
    return max(vote["occurred_at_ms"] for vote in judgement["votes"].values())


def mark_decided(state: State, key: str) -> None:
    state["judgements"][key] = {"decided": True}


def expired_judgements(state: State, now_ms: int, timeout_s: float) -> list[tuple[str, Judgement, int]]:
    """(key, judgement, deadline_ms) of undecided judgements whose vote timeout has passed."""
    expired = []
    for key, judgement in sorted(state["judgements"].items()):
        if judgement["decided"]:
            continue
        deadline_ms = judgement["first_vote_ms"] + int(timeout_s * 1000)
        if now_ms >= deadline_ms:
            expired.append((key, judgement, deadline_ms))
    return expired


def can_forget(state: State, now_ms: int, retention_s: float) -> bool:
    """Nothing pending and no vote for `retention_s`: the session's state can be deleted."""
    pending = any(not judgement["decided"] for judgement in state["judgements"].values())
    return not pending and now_ms - state["last_activity_ms"] >= retention_s * 1000
