"""hint_selector: picks the hint of a turn among its m hint votes, or says why there is none.

Reads hints (HintVoteCast; its own HintSelected / HintRejected on the same topic are skipped);
writes hints (HintSelected or HintRejected).

A vote is a candidate if its score is 1 and its stripped hint is longer than `min_hint_chars`
(10, as in OpenClaw-RL). The longest candidate wins; ties go to the lowest vote_index, so the
choice never depends on arrival order. Without a candidate: HintRejected with reason
"hints_too_short" (some vote said 1 but gave no usable hint), "no_valid_votes" (every vote
failed to parse) or "all_negative". Waits for `votes_per_judgement` votes, or `vote_timeout_s`
after the first one (on_tick).
State per session: vote_collection's VoteSession, each vote also holding its hint.
"""

from __future__ import annotations

from orl.pipeline.processors import vote_collection
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import producer_name
from orl.pipeline.processors.topology import stage_named
from orl.pipeline.processors.vote_collection import CastVote
from orl.schemas.event_constructors import hint_rejected, hint_selected
from orl.schemas.events import EventOrigin

NAME = "hint_selector"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)


def best_hint_vote(votes: list[CastVote], min_hint_chars: int) -> CastVote | None:
    """The vote with the longest usable hint (score 1, stripped hint > min_hint_chars); first index wins ties.

    `votes` must be in vote_index order.
    """
    best: CastVote | None = None
    for vote in votes:
        hint = (vote.hint or "").strip()
        if vote.score != 1 or len(hint) <= min_hint_chars:
            continue
        if best is None or len(hint) > len((best.hint or "").strip()):
            best = vote
    return best


def rejection_reason(votes: list[CastVote]) -> str:
    scores = [vote.score for vote in votes]
    if 1 in scores:
        return "hints_too_short"
    if all(score is None for score in scores):
        return "no_valid_votes"
    return "all_negative"


def decide(
    state: vote_collection.VoteSession,
    key: str,
    judgement: vote_collection.Judgement,
    occurred_at_ms: int,
    config: PipelineConfig,
) -> Emit:
    votes = vote_collection.votes_in_order(judgement)
    vote_ids = [vote.event_id for vote in votes]
    best = best_hint_vote(votes, config.hints.min_hint_chars)
    origin = EventOrigin(
        namespace=state.namespace,
        producer=PRODUCER,
        occurred_at_ms=occurred_at_ms,
        id_parts=(key, *vote_ids, config.hints.version),
        session_id=state.session_id,
        turn_id=judgement.turn_id,
    )
    if best is not None and best.hint is not None:
        event = dict(
            hint_selected(
                origin, hint_vote_ids=vote_ids, selected_vote_id=best.event_id, hint=best.hint.strip()
            )
        )
    else:
        event = dict(hint_rejected(origin, hint_vote_ids=vote_ids, reason=rejection_reason(votes)))
    return Emit("hints", event)


class HintSelector(vote_collection.VoteCollector):
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs
    state_codec = vote_collection.VOTE_STATE
    vote_type = "HintVoteCast"
    keeps_hints = True

    def votes_needed(self, judgement: vote_collection.Judgement, config: PipelineConfig) -> int:
        return config.hints.votes_per_judgement

    def timeouts_s(self, config: PipelineConfig) -> tuple[float, float]:
        return config.hints.vote_timeout_s, config.hints.retention_s

    decide = staticmethod(decide)


HINT_SELECTOR = HintSelector()
