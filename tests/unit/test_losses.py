"""orl.trainer.losses against hand-computed values, plus hypothesis invariants."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from orl.trainer.losses import (
    LossInputError,
    binary_advantages,
    center_rewards,
    combined_advantages,
    exact_kl,
    k3_kl,
    masked_mean,
    opd_advantages,
    ppo_clipped_surrogate,
    reduce_loss,
    total_loss,
)


def _one_token(
    ratio: float, advantage: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logprobs [1,1] requiring grad, old, advantages, mask) with exp(lp - old) == ratio."""
    old = torch.tensor([[-1.0]])
    lp = (old + math.log(ratio)).clone().requires_grad_(True)
    return lp, old, torch.tensor([[advantage]]), torch.ones(1, 1, dtype=torch.bool)


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected_loss", "clipped"),
    [
        (1.5, 1.0, -1.28, True),  # above 1+eps_high with A > 0: clipped at 1.28
        (1.5, -1.0, 1.5, False),  # above with A < 0: passes through
        (0.5, -1.0, 0.8, True),  # below 1-eps_low with A < 0: clipped at 0.8
        (0.5, 1.0, -0.5, False),  # below with A > 0: passes through
        (1.1, 2.0, -2.2, False),  # inside the range: plain ratio * A
        (0.9, -2.0, 1.8, False),
    ],
)
def test_clip_bounds_both_sides(ratio: float, advantage: float, expected_loss: float, clipped: bool) -> None:
    lp, old, adv, mask = _one_token(ratio, advantage)
    loss, stats = ppo_clipped_surrogate(lp, old, adv, mask)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    assert stats.clip_fraction == (1.0 if clipped else 0.0)
    loss.backward()
    assert lp.grad is not None
    if clipped:
        assert float(lp.grad) == 0.0  # a clipped token carries no gradient
    else:
        assert float(lp.grad) == pytest.approx(-ratio * advantage, abs=1e-6)  # d(-rho*A)/dlp = -rho*A


def test_clip_fraction_split_low_and_high() -> None:
    old = torch.zeros(1, 4)
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.0, 1.5]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    _, stats = ppo_clipped_surrogate(lp, old, adv, torch.ones(1, 4))
    assert stats.clip_fraction == pytest.approx(0.5)
    assert stats.clip_high_fraction == pytest.approx(0.25)
    assert stats.clip_low_fraction == pytest.approx(0.25)
    assert stats.tokens == 4
    assert stats.ratio_max == pytest.approx(1.5)


def test_on_policy_gradient_is_minus_advantage() -> None:
    """ratio == 1 (one step per batch): d loss / d lp_t = -A_t / n_tokens, as in the policy gradient."""
    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 0.5]])
    loss, _ = ppo_clipped_surrogate(lp, lp.detach(), adv, torch.ones(1, 3))
    loss.backward()
    assert lp.grad is not None
    assert torch.allclose(lp.grad, -adv / 3)


def test_k3_kl_values() -> None:
    lp = torch.tensor([[-1.0, -1.0, -2.0]])
    ref = torch.tensor([[-1.0, -2.0, -1.0]])
    kl = k3_kl(lp, ref)
    assert float(kl[0, 0]) == 0.0
    # d = ref - lp = -1: exp(-1) + 1 - 1 = 0.36787944; d = +1: e - 2 = 0.71828183
    assert float(kl[0, 1]) == pytest.approx(math.exp(-1), abs=1e-6)
    assert float(kl[0, 2]) == pytest.approx(math.e - 2, abs=1e-6)


def test_k3_kl_clamps_the_log_ratio() -> None:
    kl = k3_kl(torch.tensor([[0.0]]), torch.tensor([[50.0]]))
    assert float(kl) == pytest.approx(math.exp(10) - 10 - 1, rel=1e-5)


def test_exact_kl_charges_mass_moved_between_unsampled_tokens() -> None:
    ref = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25]]))
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.45, 0.05]])).requires_grad_()
    lp = torch.log_softmax(logits, dim=-1)
    kl = exact_kl(lp, ref)
    assert float(kl[0]) == 0.0
    want = 0.45 * math.log(0.45 / 0.25) + 0.05 * math.log(0.05 / 0.25)
    assert float(kl[1]) == pytest.approx(want, abs=1e-6)
    # token 0 was sampled and kept its probability: k3 sees nothing, the exact KL does
    assert float(k3_kl(lp[:, :1], ref[:, :1])[1, 0]) == 0.0
    kl.sum().backward()
    grad = logits.grad
    assert grad is not None and float(grad[1, 1]) > 0 > float(grad[1, 2])  # back toward the reference
    assert float(grad[0].abs().sum()) == pytest.approx(0.0, abs=1e-7)


def test_exact_kl_replaces_k3_in_the_total_loss() -> None:
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    mask = torch.tensor([[True, False]])
    exact_B_T = torch.tensor([[0.3, float("nan")]])  # padding holds garbage: never reaches the loss
    loss, stats = total_loss(lp, lp.detach(), torch.zeros(1, 2), mask, exact_kl_B_T=exact_B_T, beta_kl=0.5)
    assert stats.kl == pytest.approx(0.3) and float(loss) == pytest.approx(0.15)
    with pytest.raises(LossInputError):
        exact_kl(torch.zeros(2, 3), torch.zeros(2, 4))


def test_opd_advantage_sign() -> None:
    old = torch.tensor([[-2.0, -1.0]])
    teacher = torch.tensor([[-0.5, -3.0]])  # more confident on token 0, less on token 1
    adv = opd_advantages(teacher, old)
    assert float(adv[0, 0]) == pytest.approx(1.5)
    assert float(adv[0, 1]) == pytest.approx(-2.0)


def test_opd_advantage_clip_bounds_each_token_and_zero_is_off() -> None:
    old = torch.tensor([[-0.1, -1.0, -9.0]])
    teacher = torch.tensor([[-11.0, -0.5, -1.0]])  # rules token 0 out, mildly prefers 1, strongly 2
    assert opd_advantages(teacher, old, clip=2.0)[0].tolist() == pytest.approx([-2.0, 0.5, 2.0])
    assert opd_advantages(teacher, old, clip=0.0)[0].tolist() == pytest.approx([-10.9, 0.5, 8.0])
    with pytest.raises(LossInputError, match="clip must be >= 0"):
        opd_advantages(teacher, old, clip=-1.0)


def test_binary_advantages_broadcast_and_mask() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)
    adv = binary_advantages(torch.tensor([1.0, -1.0]), mask)
    assert adv.tolist() == [[1.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]


def test_combined_without_teacher_equals_binary() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.1, -0.2, -0.3]])
    rewards = torch.tensor([1.0, -1.0])
    combined = combined_advantages(None, old, rewards, mask_B_T=mask)
    assert torch.equal(combined, binary_advantages(rewards, mask))
    none_has_teacher = combined_advantages(
        torch.full_like(old, float("nan")),
        old,
        rewards,
        mask_B_T=mask,
        has_teacher_B=torch.zeros(2, dtype=torch.bool),
    )
    assert torch.equal(none_has_teacher, binary_advantages(rewards, mask))


def test_combined_per_sample_presence_and_weights() -> None:
    mask = torch.ones(3, 2, dtype=torch.bool)
    old = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-1.0, -1.0]])
    teacher = torch.tensor([[-0.5, -2.0], [float("nan"), float("nan")], [-0.5, -0.5]])
    rewards = torch.tensor([1.0, -1.0, float("nan")])
    adv = combined_advantages(
        teacher,
        old,
        rewards,
        mask_B_T=mask,
        has_teacher_B=torch.tensor([True, False, True]),
        has_reward_B=torch.tensor([True, True, False]),
        w_opd=2.0,
        w_rl=0.5,
    )
    # sample 0: 2*(0.5, -1) + 0.5*1; sample 1: reward only; sample 2: teacher only
    assert adv.tolist() == [[1.5, -1.5], [-0.5, -0.5], [1.0, 1.0]]


def test_center_rewards_ignores_missing() -> None:
    rewards = torch.tensor([1.0, -1.0, -1.0, 0.0])
    has = torch.tensor([True, True, True, False])
    centred = center_rewards(rewards, has)
    assert centred[:3].tolist() == pytest.approx([4 / 3, -2 / 3, -2 / 3])
    assert float(centred[3]) == 0.0
    assert float(center_rewards(torch.tensor([1.0, 1.0])).abs().sum()) == 0.0


def test_total_loss_hand_computed() -> None:
    lp = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]])
    ref = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    loss, stats = total_loss(lp, lp, adv, mask, ref, beta_kl=0.5)
    pg = (-1 - 1 + 1) / 3
    kl = (0.0 + math.exp(-1) + (math.e - 2)) / 3
    assert stats.pg_loss == pytest.approx(pg, abs=1e-6)
    assert stats.kl == pytest.approx(kl, abs=1e-6)
    assert loss.item() == pytest.approx(pg + 0.5 * kl, abs=1e-6)
    assert stats.tokens == 3


def test_sample_reduction_weighs_every_response_the_same() -> None:
    # One long response of -1 (3 tokens) and one short of +1 (1 token): the token mean is dominated
    # by the long one, the sample mean weighs the two alike.
    values = torch.tensor([[1.0, 1.0, 1.0], [-1.0, float("nan"), 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    assert reduce_loss(values, mask, "token").item() == pytest.approx((3 - 1) / 4)
    assert reduce_loss(values, mask, "sample").item() == pytest.approx((1 - 1) / 2)
    # A row without a valid token is left out, and an all-padding batch reduces to 0.
    with_empty = torch.cat([values, torch.tensor([[9.0, 9.0, 9.0]])])
    empty_row = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    assert reduce_loss(with_empty, empty_row, "sample").item() == pytest.approx(0.0)
    assert reduce_loss(values, torch.zeros_like(mask), "sample").item() == 0.0
    with pytest.raises(LossInputError, match="unknown loss reduction"):
        reduce_loss(values, mask, "sum")


def test_total_loss_sample_reduction_hand_computed() -> None:
    lp = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]])
    ref = torch.tensor([[-1.0, -2.0], [-1.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    loss, stats = total_loss(lp, lp, adv, mask, ref, beta_kl=0.5, reduction="sample")
    pg = ((-1 - 1) / 2 + 1 / 1) / 2
    kl = ((0.0 + math.exp(-1)) / 2 + (math.e - 2) / 1) / 2
    assert stats.pg_loss == pytest.approx(pg, abs=1e-6)
    assert stats.kl == pytest.approx(kl, abs=1e-6)
    assert loss.item() == pytest.approx(pg + 0.5 * kl, abs=1e-6)


def test_total_loss_beta_zero_needs_no_reference_and_beta_needs_one() -> None:
    lp = torch.zeros(1, 2)
    loss, stats = total_loss(lp, lp, torch.ones(1, 2), torch.ones(1, 2), None, beta_kl=0.0)
    assert stats.kl == 0.0
    assert loss.item() == pytest.approx(-1.0)
    with pytest.raises(LossInputError):
        total_loss(lp, lp, torch.ones(1, 2), torch.ones(1, 2), None, beta_kl=0.02)


def test_shape_mismatch_is_an_orl_error() -> None:
    with pytest.raises(LossInputError):
        ppo_clipped_surrogate(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 3), torch.ones(2, 3))


def test_padding_never_reaches_loss_or_gradient() -> None:
    mask = torch.tensor([[1, 1, 0, 0]], dtype=torch.bool)
    lp = torch.tensor([[-1.0, -0.5, float("nan"), 3.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -0.4, float("inf"), 7.0]])
    ref = torch.tensor([[-0.9, -0.6, float("nan"), -40.0]])
    adv = torch.tensor([[1.0, -1.0, float("nan"), 100.0]])
    loss, _ = total_loss(lp, old, adv, mask, ref)
    clean, _ = total_loss(lp[:, :2], old[:, :2], adv[:, :2], mask[:, :2], ref[:, :2])
    assert loss.item() == pytest.approx(clean.item(), abs=1e-7)
    loss.backward()
    assert lp.grad is not None
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[0, 2:].tolist() == [0.0, 0.0]


_floats = st.floats(min_value=-5.0, max_value=5.0, allow_nan=False, width=32)


@st.composite
def _batches(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 6))
    grid = st.lists(st.lists(_floats, min_size=t, max_size=t), min_size=b, max_size=b)
    lengths = draw(st.lists(st.integers(0, t), min_size=b, max_size=b))
    mask = torch.tensor([[j < n for j in range(t)] for n in lengths], dtype=torch.bool)
    return {
        "lp": torch.tensor(draw(grid)) - 6.0,
        "old": torch.tensor(draw(grid)) - 6.0,
        "ref": torch.tensor(draw(grid)) - 6.0,
        "adv": torch.tensor(draw(grid)),
        "mask": mask,
        "junk": torch.tensor(draw(grid)) * 100,
    }


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_padded_values_do_not_change_the_loss(batch: dict[str, torch.Tensor]) -> None:
    mask, junk = batch["mask"], batch["junk"]

    def with_junk(x: torch.Tensor) -> torch.Tensor:
        return torch.where(mask, x, junk)

    loss_a, _ = total_loss(batch["lp"], batch["old"], batch["adv"], mask, batch["ref"])
    loss_b, _ = total_loss(
        with_junk(batch["lp"]),
        with_junk(batch["old"]),
        with_junk(batch["adv"]),
        mask,
        with_junk(batch["ref"]),
    )
    assert loss_a.item() == pytest.approx(loss_b.item(), rel=1e-6, abs=1e-5)  # fp32 summation order


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_kl_non_negative_and_surrogate_bounded(batch: dict[str, torch.Tensor]) -> None:
    assert (k3_kl(batch["lp"], batch["ref"]) >= 0).all()
    _, stats = ppo_clipped_surrogate(batch["lp"], batch["old"], batch["adv"], batch["mask"])
    assert 0.0 <= stats.clip_fraction <= 1.0
    assert stats.clip_fraction == pytest.approx(stats.clip_low_fraction + stats.clip_high_fraction, abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_sample_order_does_not_matter(batch: dict[str, torch.Tensor]) -> None:
    perm = torch.arange(batch["lp"].shape[0] - 1, -1, -1)
    loss_a, _ = total_loss(batch["lp"], batch["old"], batch["adv"], batch["mask"], batch["ref"])
    loss_b, _ = total_loss(
        batch["lp"][perm], batch["old"][perm], batch["adv"][perm], batch["mask"][perm], batch["ref"][perm]
    )
    assert loss_a.item() == pytest.approx(loss_b.item(), rel=1e-6, abs=1e-5)  # fp32 summation order


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_on_policy_loss_is_minus_mean_advantage(batch: dict[str, torch.Tensor]) -> None:
    loss, _ = ppo_clipped_surrogate(batch["lp"], batch["lp"], batch["adv"], batch["mask"])
    assert loss.item() == pytest.approx(-float(masked_mean(batch["adv"], batch["mask"])), abs=1e-5)
