"""Per-token logprobs of the exact sampled response ids from a tensor-parallel GPTModel.

The megatron twin of `orl.trainer.logprobs.response_logprobs`, with the same contract: the sampled ids
scored as they are, each sample at its own temperature (T == 0 scored at 1), one batched forward
over right-padded rows, fp32 log-softmax, gradients following the caller's context. The difference:
each tensor-parallel rank holds only its slice of the vocabulary, so the log-softmax and the pick of
the target's logit are reduced across ranks by megatron's vocab-parallel cross entropy (logprob =
-cross entropy); the full `[tokens, vocab]` logits are never gathered on one rank. The exact KL to
the reference (`--kl-estimator exact`) is summed the same way: each rank over its slice, then
across the tensor-parallel group (`exact_kl_tp`).
Reads and writes no topics or object keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
from orl.rules.sampling import effective_temperature
from orl.trainer.logprobs import LogprobInputError
from torch import Tensor, nn

_PAD_ID = 0  # right padding sits after every real token: a causal model never attends to it


def _check_inputs(
    prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], temperatures: Sequence[float]
) -> None:
    if not len(prompt_ids) == len(response_ids) == len(temperatures):
        raise LogprobInputError("prompts, responses and temperatures: one of each per sample")
    for index, (prompt, temperature) in enumerate(zip(prompt_ids, temperatures, strict=True)):
        if not prompt:
            raise LogprobInputError(f"sample {index}: empty prompt (the first response token needs context)")
        if temperature < 0:
            raise LogprobInputError(f"sample {index}: negative temperature {temperature}")


def causal_mask(length: int, device: torch.device) -> Tensor:
    """`[1, 1, L, L]` bool, True where a query must not see a key (megatron's mask convention).

    Passed explicitly: megatron's default causal mask is built on a hard-coded CUDA device.
    """
    return torch.triu(torch.ones(length, length, dtype=torch.bool, device=device), diagonal=1)[None, None]


def _padded_ids(
    prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], device: torch.device
) -> Tensor:
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
    ids_B_L = torch.full((len(lengths), max(lengths)), _PAD_ID, dtype=torch.long)
    for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        ids_B_L[row, : lengths[row]] = torch.tensor(list(prompt) + list(response), dtype=torch.long)
    return ids_B_L.to(device)


def _response_positions(
    prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], temperatures: Sequence[float]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(row_N, position_N, target_N, temperature_N) of every response token; logits at i predict i + 1."""
    rows: list[int] = []
    positions: list[int] = []
    targets: list[int] = []
    temps: list[float] = []
    for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        start = len(prompt) - 1
        rows.extend([row] * len(response))
        positions.extend(range(start, start + len(response)))
        targets.extend(response)
        temps.extend([effective_temperature(temperatures[row])] * len(response))
    return (
        torch.tensor(rows, dtype=torch.long),
        torch.tensor(positions, dtype=torch.long),
        torch.tensor(targets, dtype=torch.long),
        torch.tensor(temps, dtype=torch.float32),
    )


def vocab_parallel_logprobs(logits_N_Vp: Tensor, targets_N: Tensor) -> Tensor:
    """log softmax(logits)[target] when each TP rank holds a vocabulary slice `[N, V/tp]` of the logits."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    # It works in place on its input: hand it a tensor no one else reads.
    return -vocab_parallel_cross_entropy(logits_N_Vp.float().clone(), targets_N)


def vocab_parallel_log_softmax(logits_N_Vp: Tensor) -> Tensor:
    """log softmax over the whole vocabulary, of this rank's slice `[N, V/tp]` (differentiable).

    The normaliser is summed across the tensor-parallel group by an all-reduce whose backward is an
    all-reduce too: every rank's log-probabilities use it, so its gradient is the sum of what each
    rank's slice sends back (megatron's `reduce_from_tensor_model_parallel_region`, identity backward,
    would keep only this rank's part)."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from torch.distributed.nn.functional import all_reduce

    logits_N_Vp = logits_N_Vp.float()
    max_N_1 = logits_N_Vp.detach().max(dim=-1, keepdim=True).values
    parallel = parallel_state.get_tensor_model_parallel_world_size() > 1
    if parallel:
        dist.all_reduce(max_N_1, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    shifted_N_Vp = logits_N_Vp - max_N_1
    sum_exp_N_1 = shifted_N_Vp.exp().sum(dim=-1, keepdim=True)
    if parallel:
        sum_exp_N_1 = all_reduce(sum_exp_N_1, group=parallel_state.get_tensor_model_parallel_group())
    return shifted_N_Vp - sum_exp_N_1.log()


def exact_kl_tp(logits_N_Vp: Tensor, ref_logits_N_Vp: Tensor) -> Tensor:
    """KL(pi || ref) over the whole vocabulary at each of the N positions `[N]`, from both models'
    vocabulary slices (`orl.trainer.losses.exact_kl`'s twin); gradient through `logits_N_Vp` only. The
    slices' sums are added with megatron's reduce (identity backward): the KL is the same on every
    rank and used the same way after it."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    logp_N_Vp = vocab_parallel_log_softmax(logits_N_Vp)
    ref_logp_N_Vp = vocab_parallel_log_softmax(ref_logits_N_Vp.detach())
    local_N = (logp_N_Vp.exp() * (logp_N_Vp - ref_logp_N_Vp)).sum(dim=-1)
    return reduce_from_tensor_model_parallel_region(local_N)


def scaled_response_logits_tp(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    temperatures: Sequence[float],
    device: torch.device,
    autocast: bool = False,
) -> tuple[Tensor, Tensor]:
    """(fp32 logits / T `[N, V/tp]` at the N response positions of the batch, in order; their target ids `[N]`).

    Every rank of a tensor-parallel group must call it with the same samples (the forward is a
    collective). `autocast` runs the forward in bf16 with fp32 master weights.
    """
    _check_inputs(prompt_ids, response_ids, temperatures)
    ids_B_L = _padded_ids(prompt_ids, response_ids, device)
    positions_B_L = torch.arange(ids_B_L.shape[1], device=device)[None].expand_as(ids_B_L)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with amp:
        logits_B_L_Vp = model(ids_B_L, positions_B_L, causal_mask(ids_B_L.shape[1], device))
    rows_N, pos_N, targets_N, temps_N = (
        t.to(device) for t in _response_positions(prompt_ids, response_ids, temperatures)
    )
    return logits_B_L_Vp[rows_N, pos_N].float() / temps_N[:, None], targets_N
