"""The training objective: advantages, the PPO clipped surrogate, the KL to the reference and their reduction.

Pure torch functions of `[B, T]` tensors (B samples, T response positions, right-padded): no model,
no I/O, no clock. Reads and writes no topics or object keys. Conventions:

- `mask_B_T` marks the valid response tokens (bool, or 0/1 of any dtype). Padded positions never
  reach the loss, even when they hold NaN or garbage: they are selected away with `torch.where`,
  not multiplied by zero.
- `old_logprobs_B_T` is pi_old, the behaviour policy's per-token logprobs (detached), at each
  sample's own temperature. With one optimizer step per batch (the default loop) ratio == 1 in value
  and the surrogate reduces to the policy gradient; the clip matters once a batch is reused.

Methods (DESIGN.md "Methods"; OpenClaw-RL sections 2.5, 2.6, 3.5, 3.6):

- Binary RL: the decided reward r in {-1, 0, +1} broadcast to every response token (A_t = r), raw,
  no normalisation, as in OpenClaw-RL. `center_rewards` is the optional batch-mean baseline and
  `center_rewards_per_prompt` the optional mean of the batch's answers to the same prompt.
- OPD: A_t = log pi_teacher(a_t | s + hint) - log pi_old(a_t | s).
- Combined: A_t = w_opd * (teacher - old) + w_rl * r, where a sample without teacher logprobs gets
  no OPD term and a sample without a reward gets no RL term (OpenClaw-RL substituted the rollout
  logprobs for a missing teacher, a spurious OPD term of rollout - old, its issue #69).
- Top-K distillation (OpenClaw-RL's --distill-topk, section 3.5): per response token, the teacher's K
  most likely ids and their logprobs plus a tail bin log(1 - sum p) form a K+1-bin distribution; the
  student's logprobs at the same ids (plus its own tail) form another; the term is the reverse
  KL(student || teacher) over those bins, token mean. It replaces the OPD advantage of the samples
  that carry top-K data; the reward term stays a PPO advantage.
"""

from __future__ import annotations

import typing
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from orl.schemas.errors import OrlError
from orl.trainer.settings import LossReduction
from torch import Tensor

DEFAULT_EPS_LOW = 0.2  # OpenClaw-RL --eps-clip
DEFAULT_EPS_HIGH = 0.28  # OpenClaw-RL --eps-clip-high (asymmetric, DAPO-style clip-higher)
DEFAULT_BETA_KL = 0.02  # the paper's value; the original scripts ship 0.0. 0 disables the KL term.
KL_LOG_RATIO_CLAMP = 10.0  # slime clamps the log-ratio to [-10, 10] before exp in low_var_kl
TAIL_LOG_SUM_MAX = -1e-7  # log(sum of the top-K p) is clamped below 0, so log(1 - sum p) stays finite


class LossInputError(OrlError):
    """Tensors handed to a loss function do not fit together (shape, missing reference)."""


@dataclass(frozen=True)
class SurrogateStats:
    """What the clipped surrogate did to the batch (plain floats, for TrainStepCompleted)."""

    pg_loss: float
    clip_fraction: float  # share of valid tokens whose clipped branch won (zero gradient)
    clip_low_fraction: float  # ... of which ratio < 1 - eps_low with A < 0
    clip_high_fraction: float  # ... of which ratio > 1 + eps_high with A > 0
    ratio_mean: float
    ratio_max: float
    tokens: int


@dataclass(frozen=True)
class LossStats:
    """The total loss and its parts, as floats."""

    loss: float
    pg_loss: float
    kl: float  # mean KL(pi || ref) per valid token (k3 estimate or exact); 0.0 when the KL term is disabled
    clip_fraction: float
    advantage_mean: float
    tokens: int


def _check_same_shape(**tensors: Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1 or any(len(s) != 2 for s in shapes.values()):
        raise LossInputError(f"expected [B, T] tensors of one shape, got {shapes}")


def masked_mean(values_B_T: Tensor, mask_B_T: Tensor) -> Tensor:
    """Mean over every valid token of the batch (`total_loss`'s default reduction; 0 when none is valid).

    Token mean, not slime's `sum_of_sample_mean` (mean within each sample, summed over samples):
    every trained token gets the same weight whatever the length of its response, so a long
    response's tokens are not diluted and a short response's (often degenerate) tokens are not
    amplified, and the scale does not grow with the batch size. It is what the learnability
    prototype measured (reference/learnability.md: `(pg + beta*kl).mean()` over all response tokens).
    """
    valid_B_T = mask_B_T.to(torch.bool)
    zeros_B_T = torch.zeros_like(values_B_T)
    total = torch.where(valid_B_T, values_B_T, zeros_B_T).sum()
    return total / valid_B_T.sum().clamp(min=1)


def reduce_loss(values_B_T: Tensor, mask_B_T: Tensor, reduction: str = "token") -> Tensor:
    """The per-token loss reduced to a scalar: "token" is `masked_mean`; "sample" is the mean over
    samples of each sample's mean over its valid tokens (slime's `sum_of_sample_mean` divided by the
    batch size, OpenClaw-RL's reduction). Under "sample" every response weighs the same whatever its
    length: with a low base rate, the many long -1 answers no longer outweigh the few short +1 ones
    token by token. Samples without a valid token are left out; 0 when none is valid."""
    if reduction == "token":
        return masked_mean(values_B_T, mask_B_T)
    if reduction != "sample":
        raise LossInputError(
            f"unknown loss reduction {reduction!r}; expected one of {typing.get_args(LossReduction)}"
        )
    valid_B_T = mask_B_T.to(torch.bool)
    tokens_B = valid_B_T.sum(dim=1)
    sums_B = torch.where(valid_B_T, values_B_T, torch.zeros_like(values_B_T)).sum(dim=1)
    has_B = tokens_B > 0
    means_B = torch.where(has_B, sums_B / tokens_B.clamp(min=1), torch.zeros_like(sums_B))
    return means_B.sum() / has_B.sum().clamp(min=1)


def ppo_clipped_surrogate(
    logprobs_B_T: Tensor,
    old_logprobs_B_T: Tensor,
    advantages_B_T: Tensor,
    mask_B_T: Tensor,
    eps_low: float = DEFAULT_EPS_LOW,
    eps_high: float = DEFAULT_EPS_HIGH,
    reduction: str = "token",
) -> tuple[Tensor, SurrogateStats]:
    """Per token L = max(-rho*A, -clip(rho, 1-eps_low, 1+eps_high)*A), rho = exp(lp - old); reduced
    by `reduce_loss` (token mean by default).

    Gradient flows only through `logprobs_B_T`; old logprobs and advantages are treated as constants.
    Where the clipped branch is strictly larger (rho > 1+eps_high with A > 0, rho < 1-eps_low with
    A < 0) the token's gradient is zero; the other sides pass through unclipped.
    """
    _check_same_shape(logprobs=logprobs_B_T, old=old_logprobs_B_T, adv=advantages_B_T, mask=mask_B_T)
    valid_B_T = mask_B_T.to(torch.bool)
    advantages_B_T = torch.where(valid_B_T, advantages_B_T.detach(), 0.0)
    log_ratio_B_T = torch.where(valid_B_T, logprobs_B_T - old_logprobs_B_T.detach(), 0.0)
    ratio_B_T = torch.exp(log_ratio_B_T)
    unclipped_B_T = -ratio_B_T * advantages_B_T
    clipped_B_T = -torch.clamp(ratio_B_T, 1.0 - eps_low, 1.0 + eps_high) * advantages_B_T
    per_token_B_T = torch.maximum(unclipped_B_T, clipped_B_T)
    loss = reduce_loss(per_token_B_T, valid_B_T, reduction)
    stats = _surrogate_stats(loss, ratio_B_T, unclipped_B_T, clipped_B_T, advantages_B_T, valid_B_T)
    return loss, stats


def _surrogate_stats(
    loss: Tensor,
    ratio_B_T: Tensor,
    unclipped_B_T: Tensor,
    clipped_B_T: Tensor,
    advantages_B_T: Tensor,
    valid_B_T: Tensor,
) -> SurrogateStats:
    with torch.no_grad():
        clipped_won_B_T = (clipped_B_T > unclipped_B_T) & valid_B_T
        low_B_T = clipped_won_B_T & (advantages_B_T < 0)
        high_B_T = clipped_won_B_T & (advantages_B_T > 0)
        tokens = int(valid_B_T.sum())
        ratio_valid = ratio_B_T[valid_B_T]
        return SurrogateStats(
            pg_loss=float(loss.detach()),
            clip_fraction=float(masked_mean(clipped_won_B_T.float(), valid_B_T)),
            clip_low_fraction=float(masked_mean(low_B_T.float(), valid_B_T)),
            clip_high_fraction=float(masked_mean(high_B_T.float(), valid_B_T)),
            ratio_mean=float(ratio_valid.mean()) if tokens else 1.0,
            ratio_max=float(ratio_valid.max()) if tokens else 1.0,
            tokens=tokens,
        )


def k3_kl(logprobs_B_T: Tensor, ref_logprobs_B_T: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || ref): exp(d) - d - 1 with d = ref - lp clamped to [-10, 10].

    Non-negative, zero where the two agree, unbiased for KL(pi || ref) when tokens are drawn from pi,
    and lower-variance than -d (Schulman's k3; slime's `low_var_kl`). Gradient flows through
    `logprobs_B_T` only.
    """
    log_ratio_B_T = (ref_logprobs_B_T.detach() - logprobs_B_T).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return torch.exp(log_ratio_B_T) - log_ratio_B_T - 1.0


def exact_kl(logprobs_T_V: Tensor, ref_logprobs_T_V: Tensor) -> Tensor:
    """Per-position KL(pi || ref) over the whole vocabulary: sum_v pi_v * (log pi_v - log ref_v), `[T]`.

    Both are log-distributions `[T, V]` (log-softmax rows, `orl.trainer.logprobs.ScoredResponses`). Unlike
    k3, which sees only the sampled token, it also charges probability the policy moved onto tokens it
    did not sample, the way Binary RL's pushes on -1 answers spread mass into token salad
    (docs/demo/ablations.md). Gradient flows through `logprobs_T_V` only.
    """
    if logprobs_T_V.shape != ref_logprobs_T_V.shape or logprobs_T_V.dim() != 2:
        raise LossInputError(
            f"expected two [T, V] log-distributions of one shape, got {tuple(logprobs_T_V.shape)} "
            f"and {tuple(ref_logprobs_T_V.shape)}"
        )
    return (logprobs_T_V.exp() * (logprobs_T_V - ref_logprobs_T_V.detach())).sum(dim=-1)


def binary_advantages(rewards_B: Tensor, mask_B_T: Tensor) -> Tensor:
    """The sample's reward broadcast to each of its valid response tokens (0 on padding)."""
    if rewards_B.dim() != 1 or rewards_B.shape[0] != mask_B_T.shape[0]:
        raise LossInputError(f"rewards {tuple(rewards_B.shape)} do not match mask {tuple(mask_B_T.shape)}")
    valid_B_T = mask_B_T.to(torch.bool)
    broadcast_B_T = rewards_B.to(torch.float32)[:, None].expand(valid_B_T.shape)
    return torch.where(valid_B_T, broadcast_B_T, 0.0)


def opd_advantages(teacher_logprobs_B_T: Tensor, old_logprobs_B_T: Tensor, clip: float = 0.0) -> Tensor:
    """A_t = teacher - old: positive where the hinted teacher is more confident in the sampled token.

    `clip` > 0 clamps each token's advantage to [-clip, clip] (0: unclipped, as in OpenClaw-RL). The
    difference is unbounded: where the teacher rules a sampled token out (the stop token after a
    short off-topic answer, under a hint that asks for the question) it reaches -10 nats or more,
    against the reward's +-1 per token (docs/demo/ablations.md)."""
    _check_same_shape(teacher=teacher_logprobs_B_T, old=old_logprobs_B_T)
    if clip < 0:
        raise LossInputError(f"the OPD advantage clip must be >= 0, not {clip}")
    difference_B_T = (teacher_logprobs_B_T - old_logprobs_B_T).detach()
    return difference_B_T.clamp(-clip, clip) if clip > 0 else difference_B_T


def center_rewards(rewards_B: Tensor, has_reward_B: Tensor | None = None) -> Tensor:
    """Optional baseline: subtract the batch mean of the rewards that exist (off by default).

    OpenClaw-RL trains on the raw reward. With a low base rate almost every sample gets -1, which
    pushes down whatever was sampled; the prototype saw that shortcut turn into short off-topic
    answers before recovering. Centring makes the batch's advantages sum to zero (a single-sample
    GRPO baseline across the batch). Samples without a reward are left untouched (and get no RL
    term in `combined_advantages`). A batch whose rewards are all equal gets no RL signal.
    """
    has_B = torch.ones_like(rewards_B, dtype=torch.bool) if has_reward_B is None else has_reward_B.bool()
    count = has_B.sum()
    if int(count) == 0:
        return rewards_B.clone()
    mean = torch.where(has_B, rewards_B, 0.0).sum() / count
    return torch.where(has_B, rewards_B - mean, rewards_B)


def center_rewards_per_prompt(
    rewards_B: Tensor, has_reward_B: Tensor, prompt_keys: Sequence[Hashable]
) -> Tensor:
    """Subtract, within each group of rewarded samples that answer the same prompt, the group's mean.

    A per-prompt baseline (GRPO's group mean, without its std): two answers to one question that
    both got -1 get no RL push, one +1 and one -1 get +1 and -1. A sample alone with its prompt keeps
    its raw reward. Samples without a reward are left untouched."""
    groups: dict[Hashable, list[int]] = {}
    for index, key in enumerate(prompt_keys):
        if bool(has_reward_B[index]):
            groups.setdefault(key, []).append(index)
    centred = rewards_B.clone()
    for members in groups.values():
        if len(members) >= 2:
            centred[members] = rewards_B[members] - rewards_B[members].mean()
    return centred


def combined_advantages(
    teacher_logprobs_B_T: Tensor | None,
    old_logprobs_B_T: Tensor,
    rewards_B: Tensor | None,
    *,
    mask_B_T: Tensor | None = None,
    has_teacher_B: Tensor | None = None,
    has_reward_B: Tensor | None = None,
    w_opd: float = 1.0,
    w_rl: float = 1.0,
) -> Tensor:
    """A_t = w_opd * (teacher - old) [samples with a teacher] + w_rl * r [samples with a reward].

    `None` for teacher or rewards means no sample has one; `has_teacher_B` / `has_reward_B` say it
    per sample (default: every sample has it when the tensor is given). Rows without a teacher or
    reward may hold anything (zeros, NaN): they are selected away. The result is 0 on padding.
    """
    valid_B_T = torch.ones_like(old_logprobs_B_T, dtype=torch.bool) if mask_B_T is None else mask_B_T.bool()
    advantages_B_T = torch.zeros_like(old_logprobs_B_T, dtype=torch.float32)
    if teacher_logprobs_B_T is not None:
        has_B = _presence(has_teacher_B, old_logprobs_B_T.shape[0])
        opd_B_T = opd_advantages(teacher_logprobs_B_T, old_logprobs_B_T).float()
        advantages_B_T = advantages_B_T + torch.where(has_B[:, None] & valid_B_T, w_opd * opd_B_T, 0.0)
    if rewards_B is not None:
        has_B = _presence(has_reward_B, old_logprobs_B_T.shape[0])
        rl_B_T = binary_advantages(torch.where(has_B, rewards_B.float(), 0.0), valid_B_T)
        advantages_B_T = advantages_B_T + w_rl * rl_B_T
    return torch.where(valid_B_T, advantages_B_T, 0.0)


def _presence(has_B: Tensor | None, batch_size: int) -> Tensor:
    if has_B is None:
        return torch.ones(batch_size, dtype=torch.bool)
    if tuple(has_B.shape) != (batch_size,):
        raise LossInputError(f"presence mask {tuple(has_B.shape)} does not match batch size {batch_size}")
    return has_B.to(torch.bool)


def with_tail_bin(top_logprobs_B_T_K: Tensor) -> Tensor:
    """[B, T, K+1]: the top-K logprobs plus a tail bin log(1 - sum_k p_k) holding the rest of the mass.

    The log of the top-K mass is clamped to at most TAIL_LOG_SUM_MAX (OpenClaw-RL's -1e-7), so a top-K
    that holds all the mass (or more, by rounding) gets a tiny finite tail, never log of 0 or less.
    """
    log_mass_B_T = torch.logsumexp(top_logprobs_B_T_K, dim=-1).clamp(max=TAIL_LOG_SUM_MAX)
    tail_B_T = torch.log(-torch.expm1(log_mass_B_T))  # log(1 - exp(log_mass)), stable near 0
    return torch.cat([top_logprobs_B_T_K, tail_B_T[..., None]], dim=-1)


def topk_reverse_kl(student_top_B_T_K: Tensor, teacher_top_B_T_K: Tensor, mask_B_T: Tensor) -> Tensor:
    """Per token KL(student || teacher) = sum_bins p_s (log p_s - log p_t) over the K+1 bins; 0 on padding.

    Both inputs are logprobs at the teacher's top-K ids (the student's gathered from its own
    distribution at the same temperature). Gradient flows through the student only. Padded positions
    may hold anything: they are replaced before any exp or log, so no NaN reaches the gradient.
    """
    if student_top_B_T_K.shape != teacher_top_B_T_K.shape or student_top_B_T_K.dim() != 3:
        raise LossInputError(
            f"expected [B, T, K] student and teacher top-K logprobs of one shape, got "
            f"{tuple(student_top_B_T_K.shape)} and {tuple(teacher_top_B_T_K.shape)}"
        )
    if tuple(mask_B_T.shape) != tuple(student_top_B_T_K.shape[:2]):
        raise LossInputError(
            f"mask {tuple(mask_B_T.shape)} does not match [B, T] of {tuple(student_top_B_T_K.shape)}"
        )
    valid_B_T_1 = mask_B_T.to(torch.bool)[..., None]
    filler = -torch.log(torch.tensor(float(student_top_B_T_K.shape[-1]) + 1.0))  # any valid distribution
    student_B_T_J = with_tail_bin(torch.where(valid_B_T_1, student_top_B_T_K.float(), filler))
    teacher_B_T_J = with_tail_bin(torch.where(valid_B_T_1, teacher_top_B_T_K.detach().float(), filler))
    kl_B_T = (student_B_T_J.exp() * (student_B_T_J - teacher_B_T_J)).sum(dim=-1)
    return torch.where(valid_B_T_1[..., 0], kl_B_T, 0.0)


def total_loss(
    logprobs_B_T: Tensor,
    old_logprobs_B_T: Tensor,
    advantages_B_T: Tensor,
    mask_B_T: Tensor,
    ref_logprobs_B_T: Tensor | None = None,
    *,
    exact_kl_B_T: Tensor | None = None,
    beta_kl: float = DEFAULT_BETA_KL,
    eps_low: float = DEFAULT_EPS_LOW,
    eps_high: float = DEFAULT_EPS_HIGH,
    reduction: str = "token",
) -> tuple[Tensor, LossStats]:
    """loss = clipped surrogate + beta_kl * KL to the reference, each reduced by `reduce_loss`.

    The KL per token is the k3 estimate from `ref_logprobs_B_T`, or, when `exact_kl_B_T` is given (per
    position, from `exact_kl`, right-padded), that exact value instead. The default reduction is the
    token mean (`masked_mean`, see there for why); "sample" is slime's. `beta_kl == 0` disables the KL
    term and neither is needed then.
    """
    pg_loss, pg_stats = ppo_clipped_surrogate(
        logprobs_B_T,
        old_logprobs_B_T,
        advantages_B_T,
        mask_B_T,
        eps_low=eps_low,
        eps_high=eps_high,
        reduction=reduction,
    )
    kl = torch.zeros((), dtype=pg_loss.dtype)
    if beta_kl != 0.0 and exact_kl_B_T is not None:
        _check_same_shape(logprobs=logprobs_B_T, exact_kl=exact_kl_B_T)
        kl = reduce_loss(exact_kl_B_T, mask_B_T.to(torch.bool), reduction)
    elif beta_kl != 0.0:
        if ref_logprobs_B_T is None:
            raise LossInputError(f"beta_kl={beta_kl} needs reference logprobs (pass them, or beta_kl=0)")
        _check_same_shape(logprobs=logprobs_B_T, ref=ref_logprobs_B_T)
        valid_B_T = mask_B_T.to(torch.bool)
        # Zero both sides on padding first: a NaN there would otherwise leak into the gradient
        # through exp's backward (0 * exp(NaN) = NaN), even though the value is masked away.
        safe_lp_B_T = torch.where(valid_B_T, logprobs_B_T, 0.0)
        safe_ref_B_T = torch.where(valid_B_T, ref_logprobs_B_T, 0.0)
        kl = reduce_loss(k3_kl(safe_lp_B_T, safe_ref_B_T), valid_B_T, reduction)
    loss = pg_loss + beta_kl * kl
    stats = LossStats(
        loss=float(loss.detach()),
        pg_loss=pg_stats.pg_loss,
        kl=float(kl.detach()),
        clip_fraction=pg_stats.clip_fraction,
        advantage_mean=float(masked_mean(advantages_B_T.detach().float(), mask_B_T)),
        tokens=pg_stats.tokens,
    )
    return loss, stats
