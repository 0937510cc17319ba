"""The promotion gate's decision (orl.gate.promotion_rule) and the held-out split (orl.schemas.ids)."""

from __future__ import annotations

import pytest
from orl.gate.promotion_rule import (
    VersionScore,
    falls_below,
    gate_decision,
    gate_decision_with_base,
    score_version,
)
from orl.rules.gate_decisions import HELD, PROMOTED
from orl.schemas.errors import ConfigError
from orl.schemas.ids import held_out_session


def test_approval_counts_only_the_answers_the_judge_took_a_side_on() -> None:
    score = score_version([1, 1, -1, 0, None, 1], [True, True, False, True, True, False])
    assert score == VersionScore(answers=6, decisive=4, approval=0.75, relevance=4 / 6)
    assert score_version([0, None], [True, False]).approval is None


def test_one_relevance_flag_per_answer_is_required() -> None:
    with pytest.raises(ValueError, match="one relevance flag per answer"):
        score_version([1, -1], [True])
    with pytest.raises(ValueError):
        score_version([], [])


def test_a_candidate_within_the_margin_is_promoted_and_one_below_it_held() -> None:
    baseline = VersionScore(16, 16, approval=0.50, relevance=1.0)
    slightly_worse = VersionScore(16, 16, approval=0.44, relevance=0.94)
    assert gate_decision(slightly_worse, baseline, margin=0.1)[0] == PROMOTED
    decision, reason = gate_decision(VersionScore(16, 16, 1 / 16, 1.0), baseline, margin=0.1)
    assert decision == HELD
    assert reason == (
        "approval 0.06 vs 0.50; relevance 1.00 vs 1.00: approval below the baseline by more than the margin "
        "0.10 and beyond sampling noise (95%)"
    )


def test_a_fall_within_sampling_noise_does_not_hold() -> None:
    """The quick demo's v2 (approval 0.12 -> 0.50, but 2 of 8 answers off topic) is promoted; the same
    shares over 64 answers each are a real fall."""
    decision, reason = gate_decision(
        VersionScore(8, 8, 0.50, 0.75), VersionScore(8, 8, 0.12, 1.0), margin=0.1
    )
    assert decision == PROMOTED and reason.endswith("within the margin 0.10 or sampling noise, or better")
    assert gate_decision(VersionScore(64, 64, 0.50, 0.75), VersionScore(64, 64, 0.12, 1.0), 0.1)[0] == HELD
    # a fall of 0.25 on 16 answers is noise too; at 1.00 -> 0.25 it is not
    assert falls_below(0.25, 16, 0.50, 16, margin=0.1) is False
    assert falls_below(0.25, 16, 1.00, 16, margin=0.1) is True
    assert falls_below(0.0, 100, 0.05, 100, margin=0.1) is False  # within the margin: never a fall


def test_relevance_alone_holds_a_candidate_that_the_judge_cannot_score() -> None:
    """A rule judge that needs the user's reply takes no side on the gate's answers: relevance decides."""
    baseline = VersionScore(16, 0, approval=None, relevance=0.9)
    decision, reason = gate_decision(VersionScore(16, 0, None, 0.5), baseline, margin=0.1)
    assert decision == HELD and "approval not comparable" in reason and "relevance below" in reason
    assert gate_decision(VersionScore(16, 0, None, 0.9), baseline, margin=0.1)[0] == PROMOTED


def test_a_better_candidate_is_promoted_with_its_figures() -> None:
    decision, reason = gate_decision(VersionScore(8, 8, 0.9, 1.0), VersionScore(8, 8, 0.2, 0.8), margin=0.0)
    assert (decision, reason) == (
        PROMOTED,
        "approval 0.90 vs 0.20; relevance 1.00 vs 0.80: within the margin 0.00 or sampling noise, or better",
    )


def test_the_held_out_split_is_stable_and_sized_by_its_share() -> None:
    sessions = [f"s{i}" for i in range(4000)]
    tenth = [s for s in sessions if held_out_session(s, 0.1)]
    assert 320 <= len(tenth) <= 480
    assert tenth == [s for s in sessions if held_out_session(s, 0.1)]
    assert set(tenth) <= {s for s in sessions if held_out_session(s, 0.3)}  # a larger share keeps them
    assert not any(held_out_session(s, 0.0) for s in sessions)
    with pytest.raises(ConfigError, match="held-out share"):
        held_out_session("s", 1.0)


def test_the_base_model_is_a_floor_that_small_promoted_falls_cannot_add_up_below() -> None:
    """The demo's binary run: relevance 1.00 (base) -> 0.94 (v2) -> 0.81 (v3), each step within the
    noise of the one before; against the base model v3 is a real fall."""
    base, v2, v3 = (VersionScore(32, 32, a, r) for a, r in ((0.16, 1.00), (0.19, 0.94), (0.28, 0.81)))
    assert gate_decision(v3, v2, margin=0.1)[0] == PROMOTED
    decision, reason = gate_decision_with_base(v3, v2, base, baseline_version=2, margin=0.1)
    assert decision == HELD
    assert reason.startswith("against v2: approval 0.28 vs 0.19; relevance 0.81 vs 0.94: within the margin")
    assert "Against the base model: approval 0.28 vs 0.16; relevance 0.81 vs 1.00: relevance below" in reason
    # against the base model itself, or without its figures, it is the plain rule
    assert gate_decision_with_base(v2, base, base, baseline_version=0, margin=0.1) == gate_decision(
        v2, base, 0.1
    )
    assert gate_decision_with_base(v3, v2, None, baseline_version=2, margin=0.1) == gate_decision(v3, v2, 0.1)
