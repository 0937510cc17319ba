"""vote_tally: turns the m judge votes of a judgement into one RewardDecided.

Reads judge_votes (JudgeVoteCast); writes rewards (RewardDecided).

Rule "majority" (LLM judges): the most frequent valid score wins; a tie or no valid vote gives 0
with reason "tie" / "no_valid_votes" (OpenClaw-RL's rule: [1,1,-1] -> 1, [1,-1,0] -> 0,
[1,None,None] -> 1, [1,-1,None] -> 0). Rule "rule_judge" (judge_kind "rule", one vote): the
vote is the reward, reason "outcome". The decision waits for `votes_per_judgement` votes (or
`rule_votes_per_judgement`), or for `vote_timeout_s` after the first vote (on_tick; missing votes
count as failures). Votes are ordered by vote_index and occurred_at is the latest vote's, so the
arrival order of the votes never changes the output.
State per session: vote_collection's VoteSession.
"""

from __future__ import annotations

from collections import Counter

from orl.pipeline.processors import vote_collection
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import producer_name
from orl.pipeline.processors.topology import stage_named
from orl.schemas.event_constructors import reward_decided
from orl.schemas.events import EventOrigin

NAME = "vote_tally"
LOGIC_VERSION = "1"
PRODUCER = producer_name(NAME, LOGIC_VERSION)
MAJORITY_RULE = "majority"
RULE_JUDGE_RULE = "rule_judge"
RULE_VERSION = "1"


def majority(scores: list[int | None]) -> tuple[float, str]:
    """(reward, reason): the majority of the valid scores; a tie or no valid score is 0."""
    valid = [score for score in scores if score is not None]
    if not valid:
        return 0.0, "no_valid_votes"
    counts = Counter(valid).most_common()
    top_count = counts[0][1]
    winners = [score for score, count in counts if count == top_count]
    if len(winners) > 1:
        return 0.0, "tie"
    return float(winners[0]), "majority"


def rule_judge_reward(scores: list[int | None]) -> tuple[float, str]:
    valid = [score for score in scores if score is not None]
    return (float(valid[0]), "outcome") if valid else (0.0, "no_valid_votes")


def votes_needed(judgement: vote_collection.Judgement, config: PipelineConfig) -> int:
    if judgement.judge_kind == "rule":
        return config.tally.rule_votes_per_judgement
    return config.tally.votes_per_judgement


def decide(
    state: vote_collection.VoteSession,
    key: str,
    judgement: vote_collection.Judgement,
    occurred_at_ms: int,
    config: PipelineConfig,
) -> Emit:
    votes = vote_collection.votes_in_order(judgement)
    vote_ids = [vote.event_id for vote in votes]
    scores = [vote.score for vote in votes]
    is_rule = judgement.judge_kind == "rule"
    reward, reason = rule_judge_reward(scores) if is_rule else majority(scores)
    rule = RULE_JUDGE_RULE if is_rule else MAJORITY_RULE
    origin = EventOrigin(
        namespace=state.namespace,
        producer=PRODUCER,
        occurred_at_ms=occurred_at_ms,
        id_parts=(key, *vote_ids, rule, RULE_VERSION, config.tally.version),
        session_id=state.session_id,
        turn_id=judgement.turn_id,
    )
    event = reward_decided(
        origin,
        vote_ids=vote_ids,
        votes=scores,
        rule=rule,
        rule_version=RULE_VERSION,
        reward=reward,
        reason=reason,
        promoted=False,
        judge_id=judgement.judge_id,
        parts=[],
        explanation=None,
    )
    return Emit("rewards", dict(event))


class VoteTally(vote_collection.VoteCollector):
    name = NAME
    inputs = stage_named(NAME).inputs
    outputs = stage_named(NAME).outputs
    state_codec = vote_collection.VOTE_STATE
    vote_type = "JudgeVoteCast"

    votes_needed = staticmethod(votes_needed)

    def timeouts_s(self, config: PipelineConfig) -> tuple[float, float]:
        return config.tally.vote_timeout_s, config.tally.retention_s

    decide = staticmethod(decide)


VOTE_TALLY = VoteTally()
