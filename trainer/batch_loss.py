"""One batch of samples through the policy to the loss: logprobs, advantages per method, total loss.

Recomputes the policy's logprobs (with gradient) and the frozen reference's (for the KL) on the exact
sampled token ids, each sample at its own temperature (`orl.trainer.logprobs`), picks pi_old per the
`old_logprobs` setting, builds each sample's advantage from its method and hands everything to the
pure `orl.trainer.losses.total_loss`. Reads and writes no topics or object keys.

Temperatures: by default every logprob is taken at the sample's own temperature, as sampled. With
`train_temperature` set (the demo uses 1.0), the policy gradient, the PPO ratio and the KL use
logits / train_temperature, while the OPD advantage stays teacher - rollout, both recorded by
serving at the sample's temperature, so it still compares like with like. Why: at a sampling
temperature below 1 the sampled tokens' tempered probabilities saturate near 1 and their gradients
vanish; on SmolLM2 at T = 0.7 the policy moved about 7x less per step (k3 KL after 3 binary steps:
0.005 against 0.038 at 1.0), which is most of what separated the demo from its CPU prototype.

Advantages per sample method (DESIGN.md "Methods"):
- binary: A_t = w_rl * r (no OPD term even if teacher logprobs are present; w_rl is 1 unless set);
- opd: A_t = teacher_t - old_t (no reward term);
- combined: A_t = w_opd * (teacher_t - old_t) + w_rl * r, each term only when the sample has it.
With `opd_anchor` a < 1, old_t in the OPD term becomes a * old_t + (1 - a) * base_t, base_t the frozen
base model's logprob of the token without the hint (at the sample's temperature): at 0 the term is
only what the hint changes, without the frozen teacher's pull back toward the base.

Top-K distillation (`opd_loss` "topk"): a sample whose OPD term is on and that carries the teacher's
top-K drops teacher_t - old_t from its advantage and instead adds its OPD weight times the reverse
KL(student || teacher) over the teacher's K ids plus a tail bin (`orl.trainer.losses.topk_reverse_kl`),
token mean over the batch's valid tokens like the surrogate, so a distilled token weighs what its
token-level OPD term would have. The student's top-K logprobs come from the same forward as its
sampled-token logprobs, at the sample's own temperature (the teacher's top-K came from logits / T),
even with `train_temperature` set. Samples without top-K keep the token-level advantage.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from orl.trainer.batching import TrainingSample
from orl.trainer.logprobs import (
    LogprobInputError,
    collate_samples,
    pad_right,
    response_and_top_k_logprobs,
    response_logprobs,
)
from orl.trainer.losses import (
    LossStats,
    binary_advantages,
    center_rewards,
    center_rewards_per_prompt,
    exact_kl,
    opd_advantages,
    reduce_loss,
    topk_reverse_kl,
    total_loss,
)
from orl.trainer.policy_model import PolicyModel
from orl.trainer.settings import LossFlags
from torch import Tensor


@dataclass(frozen=True)
class LossConfig:
    beta_kl: float = 0.02
    kl_estimator: str = "exact"  # exact | k3 (orl.trainer.settings.KlEstimator)
    eps_low: float = 0.2
    eps_high: float = 0.28
    w_opd: float = 1.0
    w_rl: float = 1.0
    center_rewards: bool = False
    prompt_baseline: bool = False  # subtract the mean reward of the batch's answers to the same prompt
    old_logprobs: str = "recompute"  # recompute | rollout
    autocast: bool = False  # bf16 autocast forwards (`loss_config` decides per machine)
    train_temperature: float | None = None  # None: each sample's own temperature
    opd_loss: str = "token"  # token | topk (orl.trainer.settings.OpdLoss)
    loss_reduction: str = "token"  # token | sample (orl.trainer.losses.reduce_loss)
    opd_advantage_clip: float = 0.0  # clamp teacher - old per token to [-c, c] (0: off)
    opd_anchor: float = 1.0  # OPD: teacher - (a * old + (1 - a) * base without the hint)


def loss_config(settings: LossFlags, autocast: bool) -> LossConfig:
    """The loss of `orl train`'s settings or the megatron worker's flags."""
    return LossConfig(
        beta_kl=settings.beta_kl,
        kl_estimator=settings.kl_estimator,
        eps_low=settings.eps_low,
        eps_high=settings.eps_high,
        w_opd=settings.w_opd,
        w_rl=settings.w_rl,
        center_rewards=settings.center_rewards,
        prompt_baseline=settings.prompt_baseline,
        opd_anchor=settings.opd_anchor,
        old_logprobs=settings.old_logprobs,
        autocast=autocast,
        train_temperature=settings.train_temperature,
        opd_loss=settings.opd_loss,
        loss_reduction=settings.loss_reduction,
        opd_advantage_clip=settings.opd_advantage_clip,
    )


@dataclass(frozen=True)
class BatchLoss:
    loss: Tensor  # scalar, with gradient
    stats: LossStats
    reward_mean: float  # over samples that carry a reward (nan when none)
    opd_advantage_mean: float  # mean teacher - old over tokens of samples with an OPD term (nan when none)
    opd_tokens: int  # how many tokens that mean is over
    distill_kl: float = float("nan")  # mean top-K KL(student || teacher) per distilled token (nan when none)


def method_weights(samples: Sequence[TrainingSample], config: LossConfig) -> tuple[Tensor, Tensor]:
    """Per-sample (OPD weight, RL weight); 0 where the method or the sample lacks the term."""
    opd_w, rl_w = [], []
    for s in samples:
        has_teacher, has_reward = s.teacher_logprobs is not None, s.reward is not None
        if s.method == "binary":
            opd_w.append(0.0)
            rl_w.append(config.w_rl if has_reward else 0.0)
        elif s.method == "opd":
            opd_w.append(1.0 if has_teacher else 0.0)
            rl_w.append(0.0)
        else:
            opd_w.append(config.w_opd if has_teacher else 0.0)
            rl_w.append(config.w_rl if has_reward else 0.0)
    return torch.tensor(opd_w), torch.tensor(rl_w)


def distills_top_k(sample: TrainingSample, config: LossConfig) -> bool:
    """The sample's OPD term is the top-K distillation (else, if it has one, the token-level advantage)."""
    return config.opd_loss == "topk" and sample.teacher_top_ids is not None and sample.method != "binary"


def token_opd_weights(samples: Sequence[TrainingSample], config: LossConfig) -> Tensor:
    """Per-sample weight of the token-level OPD advantage: 0 for a distilled sample (its OPD term is
    the distillation loss instead) and where the method or the sample lacks the term."""
    distilled_B = torch.tensor([distills_top_k(s, config) for s in samples], dtype=torch.bool)
    return torch.where(distilled_B, 0.0, method_weights(samples, config)[0])


def rewards_after_baselines(
    samples: Sequence[TrainingSample], rewards_B: Tensor, config: LossConfig
) -> Tensor:
    """The batch's rewards after the baselines the config asks for (both off by default, as in
    OpenClaw-RL): the batch mean (`center_rewards`), then the mean of the answers to the same prompt
    (`prompt_baseline`). Computed over the whole batch, whichever backend and shard trains it."""
    has_reward_B = method_weights(samples, config)[1] != 0
    if config.center_rewards:
        rewards_B = center_rewards(rewards_B, has_reward_B)
    if config.prompt_baseline:
        rewards_B = center_rewards_per_prompt(rewards_B, has_reward_B, [tuple(s.prompt_ids) for s in samples])
    return rewards_B


def advantages(
    samples: Sequence[TrainingSample],
    old_logprobs_B_T: Tensor,
    teacher_logprobs_B_T: Tensor,
    rewards_B: Tensor,
    mask_B_T: Tensor,
    config: LossConfig,
) -> tuple[Tensor, float]:
    """(A_B_T, mean OPD advantage (after the clip) over the tokens that have one)."""
    opd_w_B, rl_w_B = token_opd_weights(samples, config), method_weights(samples, config)[1]
    rewards_B = rewards_after_baselines(samples, rewards_B, config)
    opd_B_T = opd_advantages(teacher_logprobs_B_T, old_logprobs_B_T, config.opd_advantage_clip)
    has_opd_B_T = (opd_w_B != 0)[:, None] & mask_B_T
    opd_term_B_T = torch.where(has_opd_B_T, opd_w_B[:, None] * opd_B_T, 0.0)
    rl_term_B_T = binary_advantages(rl_w_B * rewards_B, mask_B_T)
    opd_mean = float(opd_B_T[has_opd_B_T].mean()) if bool(has_opd_B_T.any()) else float("nan")
    return torch.where(mask_B_T, opd_term_B_T + rl_term_B_T, 0.0), opd_mean


@dataclass(frozen=True)
class ScoredBatch:
    """One backend's forwards over a batch: what the shared loss assembly (`assemble_loss`) needs."""

    logprobs_B_T: Tensor  # the policy's, with gradient, at each sample's training temperature
    reference_B_T: Tensor | None  # the frozen reference's, at the same temperatures (None: beta_kl 0)
    exact_kl_B_T: Tensor | None  # KL(policy || reference) over the vocabulary per token (None: k3 or off)
    student_top_k: Sequence[Tensor | None] | None  # per sample, at the teacher's top-K ids (None: not scored)


def batch_loss(policy: PolicyModel, samples: Sequence[TrainingSample], config: LossConfig) -> BatchLoss:
    """The torch backend's loss of one batch (call `.loss.backward()`); the policy module must be in train mode."""
    prompts = [list(s.prompt_ids) for s in samples]
    responses = [list(s.response_ids) for s in samples]
    temperatures = training_temperatures(samples, config)
    distilled = [distills_top_k(s, config) for s in samples]
    exact = config.beta_kl != 0.0 and config.kl_estimator == "exact"
    scored = response_and_top_k_logprobs(
        policy.module,
        prompts,
        responses,
        temperatures,
        [s.teacher_top_ids if d else None for s, d in zip(samples, distilled, strict=True)],
        [s.temperature for s in samples],  # the teacher's temperature
        config.autocast,
        keep_distributions=exact,
    )
    logprobs_B_T, _ = pad_right(scored.sampled)
    ref_logprobs_B_T = exact_kl_B_T = None
    if config.beta_kl != 0.0:
        no_top_k: list[None] = [None] * len(samples)
        with policy.reference() as reference:
            ref = response_and_top_k_logprobs(
                reference, prompts, responses, temperatures, no_top_k, temperatures, config.autocast, exact
            )
        ref_logprobs_B_T, _ = pad_right(ref.sampled)
        if scored.distributions is not None and ref.distributions is not None:
            exact_kl_B_T, _ = pad_right(
                [exact_kl(p, r) for p, r in zip(scored.distributions, ref.distributions, strict=True)]
            )

    def unhinted_base() -> Tensor:
        with policy.reference() as reference:
            unhinted = response_logprobs(
                reference, prompts, responses, [s.temperature for s in samples], config.autocast
            )
        return pad_right(unhinted)[0]

    batch = ScoredBatch(logprobs_B_T, ref_logprobs_B_T, exact_kl_B_T, scored.top_k)
    return assemble_loss(samples, batch, config, unhinted_base)


def training_temperatures(samples: Sequence[TrainingSample], config: LossConfig) -> list[float]:
    """Each sample's temperature for the policy gradient, the PPO ratio and the KL."""
    return [s.temperature if config.train_temperature is None else config.train_temperature for s in samples]


def assemble_loss(
    samples: Sequence[TrainingSample],
    scored: ScoredBatch,
    config: LossConfig,
    unhinted_base: Callable[[], Tensor],
    rewards_B: Tensor | None = None,
) -> BatchLoss:
    """The loss of `samples` from a backend's forwards; every backend's loss is this one.

    `unhinted_base()` scores the frozen base model's logprobs of the response tokens without the
    hint, at each sample's own temperature: called only for `opd_anchor` below 1, when the
    reference forward is not already that. `rewards_B`: the samples' rewards after the batch's
    baselines when the caller took them over a larger batch (else the samples' own, with the
    baselines the config asks for)."""
    collated = collate_samples(
        [list(s.response_ids) for s in samples],
        [list(s.rollout_logprobs) for s in samples],
        [None if s.teacher_logprobs is None else list(s.teacher_logprobs) for s in samples],
        [s.reward for s in samples],
    )
    mask_B_T = collated.mask_B_T
    if rewards_B is None:
        rewards_B = collated.rewards_B
    else:
        config = replace(config, center_rewards=False, prompt_baseline=False)  # taken already
    # recompute: pi_old under the current weights before the update. One optimizer step per batch,
    # so that is exactly this forward's values, detached (slime recomputes in a separate pass only
    # because it takes several steps per batch).
    old_B_T = (
        scored.logprobs_B_T.detach() if config.old_logprobs == "recompute" else collated.rollout_logprobs_B_T
    )
    # The OPD baseline must be at the teacher's (the sample's) temperature: serving's rollout logprobs,
    # mixed with the frozen base's logprobs of the same tokens without the hint when opd_anchor < 1.
    opd_old_B_T = old_B_T if config.train_temperature is None else collated.rollout_logprobs_B_T
    if config.opd_anchor != 1.0 and any(s.teacher_logprobs is not None for s in samples):
        if scored.reference_B_T is not None and config.train_temperature is None:
            base_B_T = (
                scored.reference_B_T
            )  # the KL's reference forward, already at each sample's temperature
        else:
            base_B_T = unhinted_base()
        opd_old_B_T = config.opd_anchor * opd_old_B_T + (1.0 - config.opd_anchor) * base_B_T
    adv_B_T, opd_mean = advantages(
        samples, opd_old_B_T, collated.teacher_logprobs_B_T, rewards_B, mask_B_T, config
    )
    loss, stats = total_loss(
        scored.logprobs_B_T,
        old_B_T,
        adv_B_T,
        mask_B_T,
        scored.reference_B_T,
        exact_kl_B_T=scored.exact_kl_B_T,
        beta_kl=config.beta_kl,
        eps_low=config.eps_low,
        eps_high=config.eps_high,
        reduction=config.loss_reduction,
    )
    if scored.student_top_k is None and any(distills_top_k(s, config) for s in samples):
        raise LogprobInputError("--opd-loss topk: this backend does not score the student's top-K")
    student_top = scored.student_top_k or [None] * len(samples)
    distill_loss, distill_kl = distillation_term(samples, student_top, mask_B_T, config)
    loss = loss + distill_loss
    stats = replace(stats, loss=float(loss.detach()))
    rewards = [s.reward for s in samples if s.reward is not None]
    reward_mean = sum(rewards) / len(rewards) if rewards else float("nan")
    opd_tokens = int(((token_opd_weights(samples, config) != 0)[:, None] & mask_B_T).sum())
    return BatchLoss(loss, stats, reward_mean, opd_mean, opd_tokens, distill_kl)


def distillation_term(
    samples: Sequence[TrainingSample],
    student_top: Sequence[Tensor | None],
    mask_B_T: Tensor,
    config: LossConfig,
) -> tuple[Tensor, float]:
    """(w_opd * KL of the distilled samples, reduced over the batch's valid tokens like the surrogate;
    mean KL per distilled token).

    Each sample has its own K (the pipeline's setting may change), so the KL is taken per sample.
    """
    opd_w_B, _ = method_weights(samples, config)
    weighted_rows: list[Tensor] = []
    kl_values: list[Tensor] = []
    for index, (sample, top_T_K) in enumerate(zip(samples, student_top, strict=True)):
        length = len(sample.response_ids)
        if top_T_K is None or sample.teacher_top_logprobs is None:
            weighted_rows.append(torch.zeros(length))
            continue
        teacher_T_K = torch.tensor(sample.teacher_top_logprobs, dtype=torch.float32, device=top_T_K.device)
        kl_T = topk_reverse_kl(top_T_K[None], teacher_T_K[None], torch.ones(1, length, dtype=torch.bool))[0]
        weighted_rows.append(opd_w_B[index] * kl_T)
        kl_values.append(kl_T.detach())
    if not kl_values:
        return torch.zeros(()), float("nan")
    weighted_B_T, _ = pad_right(weighted_rows)
    return reduce_loss(weighted_B_T, mask_B_T, config.loss_reduction), float(torch.cat(kl_values).mean())
