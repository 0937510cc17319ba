"""General-agent tracks: one reward per step from step-wise judge scores and the task's outcome.

A multi-step task (terminal, tool-call, SWE-style) is a trajectory of turns: each step is a turn
the judge scores on its own next state (the tool result), and the task ends with one outcome from
a connector (tests passed, exit code, verdict). Outcome-only rewards give every step the same
signal however good or bad it was; OpenClaw-RL reports tool-call accuracy rising from 0.17 to 0.30
when step-wise PRM rewards are integrated with the outcome reward. The rule here:

    reward_t = weight * step_score_t + (1 - weight) * outcome

- `step_score_t` in [-1, 1] is the step's decided judge reward; None (no valid vote, or the step
  was never judged) counts as 0, as a tied vote does, so such a step gets only the outcome term.
- `outcome` is the trajectory's outcome reward (e.g. +1 / -1, or pytest's 2 * passed / total - 1).
- `weight` in [0, 1]: 0 is outcome-only (every step gets the outcome), 1 is judge-only.
  DEFAULT_STEP_WEIGHT = 0.5 weighs both equally: it is OpenClaw-RL's own rule (`prm_t + outcome`,
  coefficient 1 in terminal-, swe- and toolcall-rl) scaled by 1/2, which keeps rewards in [-1, 1].

sample_builder applies it under the step_outcome reward rule (pipeline/processors/sample_decisions.py).
Pure function, no I/O; reads and writes no topics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

DEFAULT_STEP_WEIGHT = 0.5


def trajectory_rewards(
    step_scores: Sequence[float | None], outcome: float, weight: float = DEFAULT_STEP_WEIGHT
) -> list[float]:
    """Each step's reward: `weight * step_score + (1 - weight) * outcome` (None scores count as 0)."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must be in [0, 1]; got {weight}")
    if not math.isfinite(outcome):
        raise ValueError(f"outcome must be finite; got {outcome}")
    rewards = []
    for index, score in enumerate(step_scores):
        value = 0.0 if score is None else float(score)
        if not -1.0 <= value <= 1.0:
            raise ValueError(f"step {index}: score must be in [-1, 1] or None; got {score}")
        rewards.append(weight * value + (1.0 - weight) * outcome)
    return rewards
