"""One optimizer step of the megatron backend: the torch backend's loss, over TP x DP ranks.

The objective is not re-implemented: `orl.trainer.batch_loss.assemble_loss` (every backend's loss
assembly) is fed with logprobs from `orl.trainer.megatron_backend.logprobs`.
What the parallel layout adds, and why the result equals the torch backend's on the whole batch:

- Data parallel: DP rank r scores samples r, r + D, r + 2D, ... of the batch. The torch loss is a
  mean over every valid token of the batch, so rank r back-propagates its own token mean times
  n_r / N (its share of the batch's N tokens) and the gradients are summed over the DP group; the
  statistics are combined with the same weights. A partial batch smaller than D leaves some
  replicas without a sample: they contribute zero gradients (and still join every reduction).
- Reward centring (an option) subtracts the mean over the whole batch, so it is applied to the
  batch's rewards before the split, never per rank.
- Gradient clipping uses the global norm over all shards (`orl.trainer.megatron_backend.parallel`).
- The loss itself runs on CPU: the `[B, T]` logprobs come back from the device with their graph
  (a few KB), and the pure loss functions build their per-sample weights as CPU tensors.

Reads and writes no topics or object keys.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from orl.trainer.batch_loss import LossConfig, ScoredBatch, assemble_loss, rewards_after_baselines
from orl.trainer.batching import Batch, TrainingSample
from orl.trainer.logprobs import pad_right
from orl.trainer.losses import LossStats
from orl.trainer.megatron_backend.hf_conversion import MegatronBackendError
from orl.trainer.megatron_backend.logprobs import (
    exact_kl_tp,
    scaled_response_logits_tp,
    vocab_parallel_logprobs,
)
from orl.trainer.megatron_backend.model import MegatronPolicy
from orl.trainer.megatron_backend.parallel import ParallelContext, clip_gradients, dp_sum, sync_gradients
from orl.trainer.steps import TrainingError, step_metrics
from torch import Tensor

_LOSS_STATS = ("loss", "pg_loss", "kl")  # reduced like the loss (per token or per sample)
_TOKEN_STATS = ("clip_fraction", "advantage_mean")  # always token means


@dataclass(frozen=True)
class ShardLoss:
    """This rank's part of a batch: its weighted loss (with gradient) and the batch's statistics."""

    loss: Tensor  # this rank's token mean times its share of the batch's tokens
    stats: dict[str, float]  # whole-batch values, identical on every rank
    logprobs: list[Tensor]  # detached, per local sample (for reports)


def local_indices(batch_size: int, parallel: ParallelContext) -> list[int]:
    """The batch positions this rank's data-parallel replica scores."""
    return list(range(parallel.dp_rank, batch_size, parallel.dp_size))


def _centred_rewards(samples: Sequence[TrainingSample], config: LossConfig) -> Tensor:
    """The batch's rewards after the baselines the settings ask for, over the whole batch."""
    rewards_B = torch.tensor([0.0 if s.reward is None else float(s.reward) for s in samples])
    return rewards_after_baselines(samples, rewards_B, config)


def _scored(
    policy: MegatronPolicy, samples: Sequence[TrainingSample], reference: bool, config: LossConfig
) -> tuple[Tensor, Tensor | None]:
    """(logprobs `[B, T]` on the CPU, this rank's logits slice `[N, V/tp]` / T at the batch's N response
    positions when the exact KL needs it, else None). Each sample at its own temperature, or all at
    `train_temperature` (as `orl.trainer.batch_loss`)."""
    prompts = [list(s.prompt_ids) for s in samples]
    responses = [list(s.response_ids) for s in samples]
    temps = [s.temperature if config.train_temperature is None else config.train_temperature for s in samples]
    device, autocast = policy.parallel.device, config.autocast
    if reference:
        with policy.reference() as module:
            logits_N_Vp, targets_N = scaled_response_logits_tp(
                module, prompts, responses, temps, device, autocast
            )
    else:
        logits_N_Vp, targets_N = scaled_response_logits_tp(
            policy.module, prompts, responses, temps, device, autocast
        )
    logprobs_N = vocab_parallel_logprobs(logits_N_Vp, targets_N)
    values_B_T, _ = pad_right(list(logprobs_N.cpu().split([len(r) for r in responses])))
    exact = config.beta_kl != 0.0 and config.kl_estimator == "exact"
    return values_B_T, logits_N_Vp if exact else None


def _batch_stats(
    local: dict[str, float], units: tuple[int, int], opd: tuple[float, int], parallel: ParallelContext
) -> dict[str, float]:
    """Weighted sums over DP ranks -> whole-batch statistics (as the torch backend reports them).

    `units`: this rank's (tokens, loss units): the loss units are its tokens under the token-mean
    reduction and its samples under the sample-mean one."""
    tokens, loss_units = units
    values = [local[name] * loss_units for name in _LOSS_STATS] + [
        local[name] * tokens for name in _TOKEN_STATS
    ]
    values += [float(loss_units), float(tokens), opd[0], float(opd[1])]
    summed = dp_sum(torch.tensor(values, dtype=torch.float64, device=parallel.device), parallel).tolist()
    named = len(_LOSS_STATS) + len(_TOKEN_STATS)
    total_units, total_tokens, opd_sum, opd_count = summed[named:]
    stats = {name: summed[i] / max(total_units, 1.0) for i, name in enumerate(_LOSS_STATS)}
    for i, name in enumerate(_TOKEN_STATS, start=len(_LOSS_STATS)):
        stats[name] = summed[i] / max(total_tokens, 1.0)
    stats["tokens"] = total_tokens
    stats["opd_advantage_mean"] = opd_sum / opd_count if opd_count else float("nan")
    stats["distill_kl"] = float("nan")  # top-K distillation is torch-backend only (orl.trainer.settings)
    return stats


def _local_loss(
    policy: MegatronPolicy, local: Sequence[TrainingSample], rewards_B: Tensor, config: LossConfig
) -> tuple[Tensor, LossStats, tuple[float, int], Tensor]:
    """The shared loss on this rank's samples: (loss, stats, (OPD advantage sum, count), logprobs)."""
    logprobs_B_T, logits_N_Vp = _scored(policy, local, reference=False, config=config)
    ref_B_T = exact_kl_B_T = None
    if config.beta_kl != 0.0:
        ref_B_T, ref_logits_N_Vp = _scored(policy, local, reference=True, config=config)
        if logits_N_Vp is not None and ref_logits_N_Vp is not None:
            kl_N = exact_kl_tp(logits_N_Vp, ref_logits_N_Vp).cpu()
            exact_kl_B_T, _ = pad_right(list(kl_N.split([len(s.response_ids) for s in local])))

    def unhinted_base() -> Tensor:  # the frozen base at each sample's own temperature, logprobs only
        at_sample_temperature = replace(config, train_temperature=None, beta_kl=0.0)
        return _scored(policy, local, reference=True, config=at_sample_temperature)[0]

    # the batch's baselines are in rewards_B already (taken over the whole batch, not this rank's share)
    scored = ScoredBatch(logprobs_B_T, ref_B_T, exact_kl_B_T, student_top_k=None)
    result = assemble_loss(local, scored, config, unhinted_base, rewards_B)
    opd = (result.opd_advantage_mean * result.opd_tokens if result.opd_tokens else 0.0, result.opd_tokens)
    return result.loss, result.stats, opd, logprobs_B_T


def _empty_local_loss(policy: MegatronPolicy) -> tuple[Tensor, LossStats, tuple[float, int], Tensor]:
    """A replica without samples (a partial batch smaller than DP): zero loss, zero gradient everywhere.

    Every parameter still gets a (zero) gradient, so the DP gradient sum sees the same tensors on
    every rank.
    """
    zero = torch.stack([p.sum() for p in policy.trainable_parameters()]).sum().cpu() * 0.0
    stats = LossStats(loss=0.0, pg_loss=0.0, kl=0.0, clip_fraction=0.0, advantage_mean=0.0, tokens=0)
    return zero.cpu(), stats, (0.0, 0), torch.zeros((0, 0))


def shard_loss(policy: MegatronPolicy, samples: Sequence[TrainingSample], config: LossConfig) -> ShardLoss:
    """This rank's share of the torch backend's `batch_loss` on `samples` (the whole batch)."""
    parallel = policy.parallel
    if not samples:
        raise MegatronBackendError("an empty batch has no loss")
    mine = local_indices(len(samples), parallel)
    local = [samples[i] for i in mine]
    if local:
        rewards_B = _centred_rewards(samples, config)[mine]
        loss, stats, opd, logprobs_B_T = _local_loss(policy, local, rewards_B, config)
    else:
        loss, stats, opd, logprobs_B_T = _empty_local_loss(policy)
    # The DP gradient sum must equal the whole batch's reduction: weigh this rank's mean by its share
    # of the batch's tokens (token mean) or of its samples (sample mean).
    loss_units = len(local) if config.loss_reduction == "sample" else stats.tokens
    batch = _batch_stats(asdict(stats), (stats.tokens, loss_units), opd, parallel)
    total_units = len(samples) if config.loss_reduction == "sample" else batch["tokens"]
    share = loss_units / total_units if total_units else 0.0
    rewards = [s.reward for s in samples if s.reward is not None]
    batch["reward_mean"] = sum(rewards) / len(rewards) if rewards else float("nan")
    rows = [logprobs_B_T[i, : len(s.response_ids)].detach() for i, s in enumerate(local)]
    return ShardLoss(loss * share, batch, rows)


@dataclass(frozen=True)
class StepResult:
    metrics: dict[str, Any]  # what a manifest and TrainStepCompleted record about the step
    logprobs: list[Tensor]  # this rank's samples' logprobs before the update (batch order of `mine`)


def train_step(
    policy: MegatronPolicy,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    config: LossConfig,
    grad_clip: float,
) -> StepResult:
    """Loss, backward, DP gradient sum, global-norm clip, optimizer step; every rank calls it.

    The metrics are `orl.trainer.steps.step_metrics`' (the torch backend's keys) plus the layout.
    """
    started = time.perf_counter()
    samples = batch.samples
    optimizer.zero_grad(set_to_none=True)
    result = shard_loss(policy, samples, config)
    if not math.isfinite(result.stats["loss"]):
        raise TrainingError(f"non-finite loss {result.stats['loss']} on samples {batch.sample_ids}")
    result.loss.backward()
    params = policy.trainable_parameters()
    sync_gradients(params, policy.parallel)
    grad_norm = clip_gradients(params, grad_clip if grad_clip > 0 else math.inf, policy.parallel)
    if not math.isfinite(grad_norm):
        raise TrainingError(f"non-finite gradient norm on samples {batch.sample_ids}")
    optimizer.step()
    duration_s = time.perf_counter() - started
    metrics = {
        **step_metrics(batch, result.stats, grad_norm, duration_s, optimizer.param_groups[0]["lr"]),
        "backend": "megatron",
        "tensor_parallel": policy.parallel.tp_size,
        "data_parallel": policy.parallel.dp_size,
    }
    return StepResult(metrics, result.logprobs)
