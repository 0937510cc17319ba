"""The general-agent rule: step-wise judge scores combined with the task's outcome."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from orl.rules.step_rewards import DEFAULT_STEP_WEIGHT, trajectory_rewards

scores = st.lists(st.one_of(st.none(), st.sampled_from([-1, 0, 1])), max_size=20)
unit = st.floats(min_value=-1.0, max_value=1.0)
weights = st.floats(min_value=0.0, max_value=1.0)


def test_each_step_mixes_its_score_with_the_outcome() -> None:
    assert trajectory_rewards([1, -1, 0], outcome=1.0, weight=0.25) == [1.0, 0.5, 0.75]


def test_default_weight_is_half_of_openclaw_rls_sum() -> None:
    assert DEFAULT_STEP_WEIGHT == 0.5
    for score in (-1, 0, 1):
        for outcome in (-1.0, 1.0):
            assert trajectory_rewards([score], outcome)[0] == pytest.approx((score + outcome) / 2)


def test_a_step_without_a_score_gets_only_the_outcome_term() -> None:
    assert trajectory_rewards([None], outcome=-1.0, weight=0.5) == [-0.5]


def test_weight_zero_is_outcome_only_and_one_is_judge_only() -> None:
    assert trajectory_rewards([1, -1, None], outcome=-1.0, weight=0.0) == [-1.0, -1.0, -1.0]
    assert trajectory_rewards([1, -1, None], outcome=-1.0, weight=1.0) == [1.0, -1.0, 0.0]


@pytest.mark.parametrize(
    ("step_scores", "outcome", "weight"),
    [([1], 1.0, 1.5), ([1], 1.0, -0.1), ([2], 1.0, 0.5), ([1], math.nan, 0.5), ([1], math.inf, 0.5)],
)
def test_bad_inputs_are_refused(step_scores: list, outcome: float, weight: float) -> None:
    with pytest.raises(ValueError):
        trajectory_rewards(step_scores, outcome, weight)


@given(scores, unit, weights)
def test_rewards_stay_in_range_one_per_step(step_scores: list, outcome: float, weight: float) -> None:
    rewards = trajectory_rewards(step_scores, outcome, weight)
    assert len(rewards) == len(step_scores)
    assert all(-1.0 - 1e-9 <= r <= 1.0 + 1e-9 for r in rewards)


@given(scores, unit, weights)
def test_a_better_step_score_never_gets_a_lower_reward(
    step_scores: list, outcome: float, weight: float
) -> None:
    rewards = trajectory_rewards(step_scores, outcome, weight)
    ranked = sorted(zip((0 if s is None else s for s in step_scores), rewards, strict=True))
    assert all(a[1] <= b[1] + 1e-12 for a, b in zip(ranked, ranked[1:], strict=False))
