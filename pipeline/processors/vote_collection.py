"""Collecting the m votes of one judgement in session state: `VoteCollector`, the processor skeleton
vote_tally and hint_selector share, its frozen state and that state's codec.

A judgement = the votes of one judge config on one next state of one turn. Votes are kept by
vote_index (a second vote with the same index is ignored), decided once all expected votes are in
or, from `on_tick`, once `vote_timeout_s` has passed since the first vote (missing votes count as
failures). A decided judgement is compacted to a marker so late duplicates are ignored; a session
with nothing pending is deleted `retention_s` after its last vote. `VOTE_STATE` stores a session
(state_codec.frozen_state); the dict states stored before 2026-12-02 read as they are (a decided
marker was {"decided": true}: the other fields take their defaults).
Reads and writes no topics itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import (
    Event,
    event_id_of,
    event_type_of,
    namespace_of,
    occurred_at_of,
    remembered,
    session_id_of,
    turn_id_of,
)
from orl.pipeline.processors.state_codec import StateCodec, evolved, frozen_state
from orl.schemas.event_types import HintVoteCast, JudgeVoteCast

Vote = JudgeVoteCast | HintVoteCast


@dataclass(frozen=True)
class CastVote:
    event_id: str
    score: int | None
    occurred_at_ms: int
    hint: str | None = None  # a hint vote's hint


@dataclass(frozen=True)
class Judgement:
    """The votes of one judge config on one next state of one turn, by vote index; once decided,
    only the marker (decided, no votes) is kept."""

    turn_id: str | None = None
    judge_id: str = ""
    judge_kind: str = ""
    next_state_event_id: str = ""
    first_vote_ms: int = 0
    votes: Mapping[str, CastVote] = field(default_factory=dict)
    decided: bool = False


DECIDED = Judgement(decided=True)


@dataclass(frozen=True)
class VoteSession:
    namespace: str
    session_id: str | None
    last_activity_ms: int
    seen: tuple[str, ...] = ()
    judgements: Mapping[str, Judgement] = field(default_factory=dict)


class VoteCollector:
    """A processor that gathers each judgement's votes and decides once they are all in, or once its
    vote timeout has passed (on_tick). A subclass names the vote event it reads (`vote_type`),
    whether each vote keeps its hint, and says how many votes a judgement needs, which timeouts
    apply and what event a decided judgement becomes."""

    vote_type: str
    keeps_hints: bool = False
    state_codec: StateCodec

    def votes_needed(self, judgement: Judgement, config: PipelineConfig) -> int:
        raise NotImplementedError

    def timeouts_s(self, config: PipelineConfig) -> tuple[float, float]:
        """(vote timeout, retention): how long a judgement waits for votes, and a quiet session's state."""
        raise NotImplementedError

    def decide(
        self, state: VoteSession, key: str, judgement: Judgement, occurred_at_ms: int, config: PipelineConfig
    ) -> Emit:
        raise NotImplementedError

    def process(
        self, state: VoteSession | None, event: Event, config: PipelineConfig
    ) -> tuple[VoteSession, list[Emit]]:
        if state is None:
            state = VoteSession(namespace_of(event), session_id_of(event), occurred_at_of(event))
        if event_type_of(event) != self.vote_type:
            return state, []
        seen = remembered(state.seen, event_id_of(event), config.seen_window)
        if seen is None:
            return state, []
        vote = cast(Vote, event)
        key = judgement_key(vote)
        judgement = with_vote(state.judgements.get(key), vote, self.keeps_hints)
        decided = judgement is not None and len(judgement.votes) >= self.votes_needed(judgement, config)
        emits = (
            [self.decide(state, key, judgement, last_vote_ms(judgement), config)]
            if judgement and decided
            else []
        )
        stored = DECIDED if decided else judgement
        state = evolved(
            state,
            seen=seen,
            last_activity_ms=max(state.last_activity_ms, occurred_at_of(event)),
            judgements=state.judgements if stored is None else {**state.judgements, key: stored},
        )
        return state, emits

    def on_tick(
        self, state: VoteSession, now_ms: int, config: PipelineConfig
    ) -> tuple[VoteSession | None, list[Emit]]:
        vote_timeout_s, retention_s = self.timeouts_s(config)
        emits = []
        for key, judgement, deadline_ms in expired_judgements(state, now_ms, vote_timeout_s):
            emits.append(self.decide(state, key, judgement, deadline_ms, config))
            state = with_decided(state, key)
        if not emits and can_forget(state, now_ms, retention_s):
            return None, []
        return state, emits


def judgement_key(event: Vote) -> str:
    parts = (
        turn_id_of(event) or "",
        event["next_state_event_id"],
        event["judge_id"],
        event["judge_config_version"],
    )
    return "|".join(parts)


def with_vote(judgement: Judgement | None, event: Vote, keeps_hint: bool) -> Judgement | None:
    """The judgement (None: its first vote) with the vote stored, or None if the vote is ignored: the
    judgement is already decided or the vote's index is taken."""
    if judgement is None:
        judgement = Judgement(
            turn_id=turn_id_of(event),
            judge_id=event["judge_id"],
            judge_kind=event["judge_kind"],
            next_state_event_id=event["next_state_event_id"],
            first_vote_ms=occurred_at_of(event),
        )
    index = str(int(event["vote_index"]))
    if judgement.decided or index in judgement.votes:
        return None
    hint = cast(HintVoteCast, event)["hint"] if keeps_hint else None
    vote = CastVote(event_id_of(event), event["score"], occurred_at_of(event), hint)
    return evolved(judgement, votes={**judgement.votes, index: vote})


def votes_in_order(judgement: Judgement) -> list[CastVote]:
    """The judgement's votes sorted by vote_index, whatever order they arrived in."""
    return [judgement.votes[index] for index in sorted(judgement.votes, key=int)]


def last_vote_ms(judgement: Judgement) -> int:
    """The latest occurred_at among the votes: order-invariant, unlike 'the vote that arrived last'."""
    return max(vote.occurred_at_ms for vote in judgement.votes.values())


def with_decided(state: VoteSession, key: str) -> VoteSession:
    return evolved(state, judgements={**state.judgements, key: DECIDED})


def expired_judgements(state: VoteSession, now_ms: int, timeout_s: float) -> list[tuple[str, Judgement, int]]:
    """(key, judgement, deadline_ms) of undecided judgements whose vote timeout has passed."""
    expired = []
    for key, judgement in sorted(state.judgements.items()):
        if judgement.decided:
            continue
        deadline_ms = judgement.first_vote_ms + int(timeout_s * 1000)
        if now_ms >= deadline_ms:
            expired.append((key, judgement, deadline_ms))
    return expired


def can_forget(state: VoteSession, now_ms: int, retention_s: float) -> bool:
    """Nothing pending and no vote for `retention_s`: the session's state can be deleted."""
    pending = any(not judgement.decided for judgement in state.judgements.values())
    return not pending and now_ms - state.last_activity_ms >= retention_s * 1000


VOTE_STATE = frozen_state(VoteSession)
