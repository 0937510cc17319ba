"""The at-least-one guarantee: which turn of a sample-less closed session is promoted, with what reward.

Rule: when a closed session produced no SampleReady, its last judged main turn (highest
turn_index with a reward, or under opd with a hint outcome, and a trainable response) becomes a
sample with promoted=True and reward = the mean of its valid judge votes if that is non-zero,
else -promotion_reward (default 0.1). Why negative: a whole session without one positive or
negative verdict (all ties / neutral / no usable hint) is mild evidence the assistant was not
helpful, and unlike OpenClaw-RL's 0-reward promotion (a gradient no-op) the promoted sample then
actually moves the policy, gently. The decision is also recorded as a RewardDecided with reason
"at_least_one_promotion", promoted=True, and the turn's original votes.
Reads and writes no topics.
"""

from __future__ import annotations

from typing import Any

from pipeline.processors.sample_decisions import TurnRecord, response_problem


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
