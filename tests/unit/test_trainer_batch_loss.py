"""batch_loss on a tiny random Llama: which temperature each term of the loss is computed at."""

from __future__ import annotations

import copy
import math
from dataclasses import replace

import pytest
import torch
from orl.connectors.event_log.base import TopicPartition
from orl.trainer.batch_loss import LossConfig, advantages, batch_loss, method_weights
from orl.trainer.batching import TrainingSample
from orl.trainer.logprobs import response_logprobs
from orl.trainer.policy_model import PolicyModel
from transformers import LlamaConfig, LlamaForCausalLM

PROMPT, RESPONSE = (1, 5, 9, 3), (7, 2, 11)


@pytest.fixture
def policy() -> PolicyModel:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    module = LlamaForCausalLM(config)
    module.train()
    return PolicyModel(module, "full", base_dir=None, frozen_ref=copy.deepcopy(module).eval())  # type: ignore[arg-type]


def opd_sample(rollout: tuple[float, ...], teacher: tuple[float, ...]) -> TrainingSample:
    return TrainingSample(
        "s0", "opd", PROMPT, RESPONSE, rollout, 0.7, None, teacher, 0, TopicPartition("t", 0), 0
    )


def logprobs_at(policy: PolicyModel, temperature: float) -> list[float]:
    with torch.no_grad():
        row = response_logprobs(policy.module, [PROMPT], [RESPONSE], [temperature], autocast=False)[0]
    return [float(x) for x in row]


def test_by_default_every_term_is_at_the_sample_temperature(policy: PolicyModel) -> None:
    teacher = (-0.5, -1.0, -2.0)
    result = batch_loss(policy, [opd_sample((0.0, 0.0, 0.0), teacher)], LossConfig(autocast=False))
    old = logprobs_at(policy, 0.7)  # recompute: the current weights at the sample's temperature
    expected = sum(t - o for t, o in zip(teacher, old, strict=True)) / 3
    assert math.isclose(result.opd_advantage_mean, expected, rel_tol=1e-5)


def test_a_train_temperature_moves_the_gradient_but_not_the_opd_advantage(policy: PolicyModel) -> None:
    rollout, teacher = (-0.25, -0.75, -1.5), (-0.5, -1.0, -2.0)
    config = LossConfig(autocast=False, beta_kl=0.0, train_temperature=1.0)
    result = batch_loss(policy, [opd_sample(rollout, teacher)], config)
    # teacher - rollout: both recorded by serving at the sample's temperature
    assert math.isclose(result.opd_advantage_mean, (-0.25 - 0.25 - 0.5) / 3, rel_tol=1e-6)


def test_the_policy_gradient_uses_logprobs_at_the_train_temperature(policy: PolicyModel) -> None:
    sample = TrainingSample(
        "s1", "binary", PROMPT, RESPONSE, (0.0, 0.0, 0.0), 0.7, 1.0, None, 0, TopicPartition("t", 0), 1
    )
    config = LossConfig(autocast=False, beta_kl=0.0, train_temperature=1.0)
    batch_loss(policy, [sample], config).loss.backward()
    got = [p.grad.clone() for p in policy.trainable_parameters()]
    policy.module.zero_grad()
    # ratio == 1 in value, so the loss's gradient is that of -mean(r * log p) at T = 1
    manual = response_logprobs(policy.module, [PROMPT], [RESPONSE], [1.0], autocast=False)[0]
    (-manual.mean()).backward()
    for a, b in zip(got, (p.grad for p in policy.trainable_parameters()), strict=True):
        assert b is not None and torch.allclose(a, b, atol=1e-6)


def topk_sample(
    policy: PolicyModel,
    method: str = "opd",
    k: int = 4,
    temperature: float = 0.7,
    reward: float | None = None,
) -> TrainingSample:
    """A sample whose teacher top-K is the tiny model's own top-K at `temperature`, shifted: the KL is > 0."""
    with torch.no_grad():
        logits = policy.module(torch.tensor([PROMPT + RESPONSE])).logits[0, len(PROMPT) - 1 : -1]
        top = torch.log_softmax(logits / temperature, dim=-1).topk(k)
    teacher_top = (top.values - torch.linspace(0.0, 1.0, k)).tolist()  # sharper than the student
    sampled = [row[0] for row in teacher_top]
    return TrainingSample(
        "s-top", method, PROMPT, RESPONSE, (0.0, 0.0, 0.0), temperature, reward, tuple(sampled), 0,
        TopicPartition("t", 0), 2, teacher_top_ids=tuple(map(tuple, top.indices.tolist())),
        teacher_top_logprobs=tuple(map(tuple, teacher_top)),
    )  # fmt: skip


def test_a_topk_batch_trains_and_the_weights_move(policy: PolicyModel) -> None:
    config = LossConfig(autocast=False, opd_loss="topk")
    samples = [topk_sample(policy), topk_sample(policy, "combined", reward=1.0)]
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    result = batch_loss(policy, samples, config)
    assert math.isfinite(result.stats.loss) and result.distill_kl > 0
    assert math.isnan(result.opd_advantage_mean)  # no token-level OPD term left
    result.loss.backward()
    optimizer.step()
    moved = [
        float((p.detach() - b).abs().max())
        for p, b in zip(policy.trainable_parameters(), before, strict=True)
    ]
    assert max(moved) > 0
    after = batch_loss(policy, samples, config)
    assert after.distill_kl < result.distill_kl  # one step towards the teacher


def test_topk_falls_back_to_token_level_for_samples_without_top_k(policy: PolicyModel) -> None:
    teacher = (-0.5, -1.0, -2.0)
    samples = [opd_sample((0.0, 0.0, 0.0), teacher), topk_sample(policy)]
    result = batch_loss(policy, samples, LossConfig(autocast=False, opd_loss="topk"))
    old = logprobs_at(policy, 0.7)
    expected = sum(t - o for t, o in zip(teacher, old, strict=True)) / 3
    assert math.isclose(result.opd_advantage_mean, expected, rel_tol=1e-5)  # the token-level sample only
    assert result.distill_kl > 0


def test_token_opd_loss_ignores_the_top_k(policy: PolicyModel) -> None:
    result = batch_loss(policy, [topk_sample(policy)], LossConfig(autocast=False))
    assert math.isnan(result.distill_kl) and math.isfinite(result.opd_advantage_mean)


def test_the_student_top_k_is_at_the_sample_temperature_even_with_a_train_temperature(
    policy: PolicyModel,
) -> None:
    sample = topk_sample(policy, k=3)
    same = replace(sample, teacher_top_logprobs=None)  # rebuilt below from the student itself
    with torch.no_grad():
        logits = policy.module(torch.tensor([PROMPT + RESPONSE])).logits[0, len(PROMPT) - 1 : -1]
        own = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, torch.tensor(sample.teacher_top_ids))
    same = replace(same, teacher_top_logprobs=tuple(map(tuple, own.tolist())))
    config = LossConfig(autocast=False, beta_kl=0.0, opd_loss="topk", train_temperature=1.0)
    assert abs(batch_loss(policy, [same], config).distill_kl) < 1e-6  # teacher == student at T = 0.7


def test_w_rl_weighs_the_binary_reward_and_minus_one_inverts_it() -> None:
    binary = TrainingSample(
        "s1", "binary", PROMPT, RESPONSE, (-1.0, -1.0, -1.0), 0.7, 1.0, None, 0, TopicPartition("t", 0), 1
    )
    weights = [method_weights([binary], LossConfig(w_rl=w_rl))[1].tolist() for w_rl in (1.0, -1.0, 0.5)]
    assert weights == [[1.0], [-1.0], [0.5]]


def test_the_opd_advantage_clip_reaches_the_batch_advantage() -> None:
    combined = TrainingSample(
        "s2", "combined", PROMPT, RESPONSE, (-0.1, -1.0, -9.0), 0.7, -1.0, (-11.0, -0.5, -1.0), 0,
        TopicPartition("t", 0), 2,
    )  # fmt: skip
    old_B_T = torch.tensor([[-0.1, -1.0, -9.0]])
    teacher_B_T = torch.tensor([[-11.0, -0.5, -1.0]])
    mask_B_T = torch.ones(1, 3, dtype=torch.bool)
    rewards_B = torch.tensor([-1.0])
    clipped, _ = advantages(
        [combined], old_B_T, teacher_B_T, rewards_B, mask_B_T, LossConfig(opd_advantage_clip=2.0)
    )
    unclipped, _ = advantages([combined], old_B_T, teacher_B_T, rewards_B, mask_B_T, LossConfig())
    assert clipped[0].tolist() == pytest.approx([-3.0, -0.5, 1.0])  # OPD in [-2, 2], plus the reward -1
    assert unclipped[0].tolist() == pytest.approx([-11.9, -0.5, 7.0])


def test_the_prompt_baseline_compares_answers_to_the_same_prompt_only() -> None:
    def binary(prompt: tuple[int, ...], reward: float, offset: int) -> TrainingSample:
        return TrainingSample(
            f"s{offset}", "binary", prompt, RESPONSE, (-1.0, -1.0, -1.0), 0.7, reward, None, 0,
            TopicPartition("t", 0), offset,
        )  # fmt: skip

    other = (1, 5, 9, 4)
    # two answers to PROMPT (+1, -1), two to `other` (both -1), one alone with its prompt (-1)
    samples = [
        binary(PROMPT, 1.0, 0),
        binary(other, -1.0, 1),
        binary(PROMPT, -1.0, 2),
        binary(other, -1.0, 3),
    ]
    samples.append(binary((2, 2), -1.0, 4))
    rewards_B = torch.tensor([s.reward for s in samples])
    mask_B_T = torch.ones(len(samples), 3, dtype=torch.bool)
    zeros_B_T = torch.zeros(len(samples), 3)
    with_baseline, _ = advantages(
        samples, zeros_B_T, zeros_B_T, rewards_B, mask_B_T, LossConfig(prompt_baseline=True)
    )
    raw, _ = advantages(samples, zeros_B_T, zeros_B_T, rewards_B, mask_B_T, LossConfig())
    assert with_baseline[:, 0].tolist() == [1.0, 0.0, -1.0, 0.0, -1.0]
    assert raw[:, 0].tolist() == [1.0, -1.0, -1.0, -1.0, -1.0]


def reference_logprobs_at(policy: PolicyModel, temperature: float) -> list[float]:
    with policy.reference() as reference:
        row = response_logprobs(reference, [PROMPT], [RESPONSE], [temperature], autocast=False)[0]
    return [float(x) for x in row]


def test_the_opd_anchor_keeps_a_share_of_the_pull_back_to_the_base(policy: PolicyModel) -> None:
    with torch.no_grad():  # move the policy away from the base, as training does
        for parameter in policy.module.parameters():
            parameter.add_(0.5 * torch.randn_like(parameter))
    base = reference_logprobs_at(policy, 0.7)
    hinted = tuple(x + 0.3 for x in base)  # a hint that makes every sampled token 0.3 nats likelier
    rollout = tuple(logprobs_at(policy, 0.7))
    # teacher - old: the hint's 0.3 plus how far the policy moved from the base
    moved = sum(h - r for h, r in zip(hinted, rollout, strict=True)) / 3
    assert abs(moved - 0.3) > 0.01
    # with a KL and no train temperature the base logprobs come from the KL's reference forward
    for train_temperature, beta_kl in ((None, 0.0), (1.0, 0.0), (None, 0.02)):
        config = LossConfig(autocast=False, beta_kl=beta_kl, train_temperature=train_temperature)
        for anchor, expected in ((1.0, moved), (0.0, 0.3), (0.5, (moved + 0.3) / 2)):
            result = batch_loss(policy, [opd_sample(rollout, hinted)], replace(config, opd_anchor=anchor))
            assert math.isclose(result.opd_advantage_mean, expected, rel_tol=1e-4), (
                anchor,
                train_temperature,
            )


def binary_sample(reward: float) -> TrainingSample:
    return TrainingSample(
        "s2", "binary", PROMPT, RESPONSE, (0.0, 0.0, 0.0), 0.7, reward, None, 0, TopicPartition("t", 0), 2
    )


def test_the_exact_kl_is_summed_over_the_vocabulary_against_the_reference(policy: PolicyModel) -> None:
    with torch.no_grad():
        for parameter in policy.trainable_parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))  # move the policy off its frozen reference
    config = LossConfig(autocast=False, kl_estimator="exact", train_temperature=1.0)
    result = batch_loss(policy, [binary_sample(1.0)], config)
    with torch.no_grad(), policy.reference() as reference:
        ids = torch.tensor([PROMPT + RESPONSE])
        start = len(PROMPT) - 1
        lp = torch.log_softmax(policy.module(input_ids=ids).logits[0, start : start + len(RESPONSE)], -1)
        ref = torch.log_softmax(reference(input_ids=ids).logits[0, start : start + len(RESPONSE)], -1)
    manual = float((lp.exp() * (lp - ref)).sum(-1).mean())
    assert manual > 1e-4 and math.isclose(result.stats.kl, manual, rel_tol=1e-4)
    k3 = batch_loss(policy, [binary_sample(1.0)], replace(config, kl_estimator="k3")).stats.kl
    assert not math.isclose(k3, manual, rel_tol=1e-3)  # the estimate from three sampled tokens differs
