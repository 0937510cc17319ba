"""The promotion gate's pure parts: which sessions are held out, how answers are scored, what is decided.

A candidate version is compared with the promoted one (the baseline) on the same held-out prompts,
with the same sampling seeds. Each answer gets the run's reward judge's majority verdict (+1, 0, -1
or none) and a relevance flag (it mentions a content word of the prompt). Per version:

- approval: the share of answers judged +1 among those the judge took a side on (+1 or -1); None
  when it took a side on none (a rule judge that needs a user's reply, shown no reply);
- relevance: the share of relevant answers.

The candidate is promoted unless it falls below the baseline (the promoted version, and the base
model as a fixed floor) on approval (when both have one) or on relevance by more than the margin and
beyond sampling noise: the Agresti-Caffo 95% one-sided upper
bound of the difference between the two shares is below zero. Without the second condition a few
answers decide: on 8 answers, two off-topic ones (relevance 0.75 against 1.00) would hold a version
whose approval had gone from 0.12 to 0.50. The held-out sessions are `orl.schemas.ids.held_out_session`'s.
Reads and writes no topics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orl.rules.gate_decisions import HELD, PROMOTED

Z_95_ONE_SIDED = 1.645


@dataclass(frozen=True)
class VersionScore:
    """One version's figures on the held-out answers."""

    answers: int
    decisive: int  # answers the judge rewarded +1 or -1
    approval: float | None
    relevance: float


def score_version(rewards: Sequence[int | None], relevant: Sequence[bool]) -> VersionScore:
    """A version's approval and relevance from its answers' rewards and relevance flags (same order)."""
    if len(rewards) != len(relevant) or not rewards:
        raise ValueError(
            f"need one relevance flag per answer, got {len(rewards)} rewards, {len(relevant)} flags"
        )
    decisive = [reward for reward in rewards if reward in (1, -1)]
    approval = sum(1 for reward in decisive if reward == 1) / len(decisive) if decisive else None
    return VersionScore(len(rewards), len(decisive), approval, sum(relevant) / len(relevant))


def falls_below(candidate: float, candidate_n: int, baseline: float, baseline_n: int, margin: float) -> bool:
    """Whether the candidate's share (of `candidate_n` answers) is below the baseline's by more than
    `margin` and beyond sampling noise (Agresti-Caffo: one success and one failure added to each side)."""
    if candidate >= baseline - margin:
        return False
    low = (candidate * candidate_n + 1) / (candidate_n + 2)
    high = (baseline * baseline_n + 1) / (baseline_n + 2)
    spread = math.sqrt(low * (1 - low) / (candidate_n + 2) + high * (1 - high) / (baseline_n + 2))
    return low - high + Z_95_ONE_SIDED * spread < 0


def gate_decision(candidate: VersionScore, baseline: VersionScore, margin: float) -> tuple[str, str]:
    """(PROMOTED or HELD, the reason in words)."""
    falls: list[str] = []
    figures: list[str] = []
    if candidate.approval is not None and baseline.approval is not None:
        figures.append(f"approval {candidate.approval:.2f} vs {baseline.approval:.2f}")
        if falls_below(candidate.approval, candidate.decisive, baseline.approval, baseline.decisive, margin):
            falls.append("approval")
    else:
        figures.append("approval not comparable (the judge took no side on one version's answers)")
    figures.append(f"relevance {candidate.relevance:.2f} vs {baseline.relevance:.2f}")
    if falls_below(candidate.relevance, candidate.answers, baseline.relevance, baseline.answers, margin):
        falls.append("relevance")
    said = "; ".join(figures)
    if falls:
        return HELD, (
            f"{said}: {' and '.join(falls)} below the baseline by more than the margin {margin:.2f} and "
            "beyond sampling noise (95%)"
        )
    return PROMOTED, f"{said}: within the margin {margin:.2f} or sampling noise, or better"


def gate_decision_with_base(
    candidate: VersionScore,
    baseline: VersionScore,
    base: VersionScore | None,
    baseline_version: int,
    margin: float,
) -> tuple[str, str]:
    """`gate_decision` against the promoted version and, when that is not the base model, against the
    base model too: each promoted step may fall a little, within the margin or the noise, and such
    falls add up (relevance 1.00 -> 0.94 -> 0.81 over three promotions on the demo's binary run); the
    base model is the fixed floor that catches the sum."""
    decision, reason = gate_decision(candidate, baseline, margin)
    if base is None or baseline_version == 0:
        return decision, reason
    base_decision, base_reason = gate_decision(candidate, base, margin)
    both = f"against v{baseline_version}: {reason}. Against the base model: {base_reason}"
    return (HELD if HELD in (decision, base_decision) else PROMOTED), both
