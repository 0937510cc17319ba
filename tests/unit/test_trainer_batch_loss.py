"""batch_loss on a tiny random Llama: which temperature each term of the loss is computed at."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from connectors.event_log.base import TopicPartition
from trainer.batch_loss import LossConfig, batch_loss
from trainer.batching import TrainingSample
from trainer.logprobs import response_logprobs
from trainer.policy_model import PolicyModel

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
