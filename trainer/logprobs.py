"""Per-token logprobs of the exact sampled response ids, and the collation into `[B, T]` tensors.

The response ids come from the ResponseGenerated / SampleReady events and are scored as they are:
never re-tokenised from text (an OpenClaw-RL defect), never padded with fake values. Each sample is
scored at the temperature it was sampled with (logits / T; OpenClaw-RL used one global temperature),
and T == 0 (greedy) is scored at T = 1, since a greedy sample has no finite tempered distribution.
The forward may run under bf16 autocast; the log-softmax is always taken in fp32. For top-K
distillation, `response_and_top_k_logprobs` also gathers the student's logprobs at the teacher's
top-K ids from the same forward (the model runs once), and for the exact KL it can keep each
position's whole log-distribution over the vocabulary.
Reads and writes no topics or object keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from orl.rules.sampling import effective_temperature
from orl.schemas.errors import OrlError
from torch import Tensor, nn

# Any id works: right padding sits after every real token, so a causal model never attends to it.
_PAD_ID = 0


class LogprobInputError(OrlError):
    """Prompt, response and temperature lists that cannot be scored together."""


def _check_inputs(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    temperatures: Sequence[float],
) -> None:
    if not len(prompt_ids) == len(response_ids) == len(temperatures):
        raise LogprobInputError(
            f"{len(prompt_ids)} prompts, {len(response_ids)} responses and {len(temperatures)} "
            "temperatures: one of each per sample"
        )
    for index, (prompt, temperature) in enumerate(zip(prompt_ids, temperatures, strict=True)):
        if not prompt:
            raise LogprobInputError(f"sample {index}: empty prompt (the first response token needs context)")
        if temperature < 0:
            raise LogprobInputError(f"sample {index}: negative temperature {temperature}")


def _right_padded_inputs(
    prompt_ids: Sequence[Sequence[int]], response_ids: Sequence[Sequence[int]], device: torch.device
) -> tuple[Tensor, Tensor]:
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids, strict=True)]
    input_ids_B_L = torch.full((len(lengths), max(lengths)), _PAD_ID, dtype=torch.long)
    attention_B_L = torch.zeros_like(input_ids_B_L)
    for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        input_ids_B_L[row, : lengths[row]] = torch.tensor(list(prompt) + list(response), dtype=torch.long)
        attention_B_L[row, : lengths[row]] = 1
    return input_ids_B_L.to(device), attention_B_L.to(device)


def _model_device(model: nn.Module) -> torch.device:
    first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def response_logprobs(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    temperatures: Sequence[float],
    autocast: bool = False,
) -> list[Tensor]:
    """log p(response_t | prompt, response_<t) / T for each sample: one fp32 `[len(response)]` each.

    One batched forward with right padding and an attention mask; only the response suffix is
    scored. Gradients follow the caller's context: wrap in `torch.no_grad()` for old / reference /
    teacher logprobs, leave enabled for the policy's. `autocast` runs the forward in bf16 (the
    prototype's setting: about 0.05 nats of noise, well under the learning signal); use it only where the
    hardware runs bf16 natively (`orl.compute.machine.choose_numerics`).
    """
    no_top_k: list[None] = [None] * len(prompt_ids)
    scored = response_and_top_k_logprobs(
        model, prompt_ids, response_ids, temperatures, no_top_k, temperatures, autocast
    )
    return scored.sampled


@dataclass(frozen=True)
class ScoredResponses:
    """What one forward over a batch of responses gives (one entry per sample)."""

    sampled: list[Tensor]  # [len(response)] logprobs of the sampled ids, at the sample's temperature
    top_k: list[Tensor | None]  # [len(response), K] logprobs at the given top-K ids, or None
    distributions: list[Tensor] | None  # [len(response), V] log-softmax over the vocabulary, if kept


def response_and_top_k_logprobs(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    temperatures: Sequence[float],
    top_k_ids: Sequence[Sequence[Sequence[int]] | None],
    top_k_temperatures: Sequence[float],
    autocast: bool = False,
    keep_distributions: bool = False,
) -> ScoredResponses:
    """`response_logprobs` and, from the same forward, each sample's logprobs at its given top-K ids.

    `top_k_ids[b]` is `[len(response_b)][K_b]` (the teacher's most likely ids per position) or None;
    the gathered logprobs are `[len(response_b), K_b]` fp32 under softmax(logits / top_k_temperatures[b])
    (the teacher's temperature: the sample's own, even when the sampled tokens are scored at another).
    `keep_distributions` also returns each position's whole log-distribution at the sample's
    temperature (`[len(response), V]` fp32: about 50 MB per 256-token response of a 49k vocabulary),
    for the exact KL to the reference (`orl.trainer.losses.exact_kl`).
    """
    _check_inputs(prompt_ids, response_ids, temperatures)
    if not len(top_k_ids) == len(top_k_temperatures) == len(prompt_ids):
        raise LogprobInputError("top-K ids and temperatures: one of each per sample")
    sampled: list[Tensor] = []
    gathered: list[Tensor | None] = []
    distributions: list[Tensor] = []
    rows = _response_logits(model, prompt_ids, response_ids, temperatures, autocast)
    for row, (logits_T_V, targets_T) in enumerate(rows):
        logp_T_V = torch.log_softmax(logits_T_V / effective_temperature(temperatures[row]), dim=-1)
        sampled.append(logp_T_V.gather(-1, targets_T[:, None]).squeeze(-1))
        if keep_distributions:
            distributions.append(logp_T_V)
        ids = top_k_ids[row]
        if ids is None:
            gathered.append(None)
            continue
        ids_T_K = _top_k_index(ids, len(response_ids[row]), logits_T_V.shape[-1], row).to(logits_T_V.device)
        if top_k_temperatures[row] != temperatures[row]:
            logp_T_V = torch.log_softmax(logits_T_V / effective_temperature(top_k_temperatures[row]), dim=-1)
        gathered.append(logp_T_V.gather(-1, ids_T_K))
    return ScoredResponses(sampled, gathered, distributions if keep_distributions else None)


def _top_k_index(ids: Sequence[Sequence[int]], length: int, vocab_size: int, row: int) -> Tensor:
    widths = {len(position) for position in ids}
    if len(ids) != length or len(widths) != 1 or 0 in widths:
        raise LogprobInputError(f"sample {row}: top-K ids must be [{length}][K] with one K >= 1")
    ids_T_K = torch.tensor([list(position) for position in ids], dtype=torch.long)
    if int(ids_T_K.min()) < 0 or int(ids_T_K.max()) >= vocab_size:
        raise LogprobInputError(f"sample {row}: top-K ids outside the model's vocabulary [0, {vocab_size})")
    return ids_T_K


def _response_logits(
    model: nn.Module,
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    temperatures: Sequence[float],
    autocast: bool,
) -> list[tuple[Tensor, Tensor]]:
    """Per sample (fp32 logits `[len(response), V]` that predict each response token, its ids), one forward."""
    _check_inputs(prompt_ids, response_ids, temperatures)
    if not prompt_ids:
        return []
    device = _model_device(model)
    input_ids_B_L, attention_B_L = _right_padded_inputs(prompt_ids, response_ids, device)
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if autocast else nullcontext()
    with amp:
        logits_B_L_V = model(input_ids=input_ids_B_L, attention_mask=attention_B_L).logits
    rows = []
    for row, (prompt, response) in enumerate(zip(prompt_ids, response_ids, strict=True)):
        start = len(prompt) - 1  # logits at position i predict token i + 1
        logits_T_V = logits_B_L_V[row, start : start + len(response)].float()
        rows.append((logits_T_V, input_ids_B_L[row, start + 1 : start + 1 + len(response)]))
    return rows


def pad_right(rows: Sequence[Tensor | Sequence[float]], pad_value: float = 0.0) -> tuple[Tensor, Tensor]:
    """Stack ragged per-sample rows into (values_B_T fp32, mask_B_T bool), padding on the right.

    Keeps the autograd graph of tensor rows, so the policy's logprobs can be collated before the loss.
    """
    if not rows:
        return torch.zeros((0, 0)), torch.zeros((0, 0), dtype=torch.bool)
    tensors = [r if isinstance(r, Tensor) else torch.tensor(list(r), dtype=torch.float32) for r in rows]
    width = max(int(t.shape[0]) for t in tensors)
    padded = [
        torch.cat([t.float(), torch.full((width - t.shape[0],), pad_value, device=t.device)]) for t in tensors
    ]
    values_B_T = torch.stack(padded)
    mask_B_T = torch.zeros(values_B_T.shape, dtype=torch.bool, device=values_B_T.device)
    for row, t in enumerate(tensors):
        mask_B_T[row, : t.shape[0]] = True
    return values_B_T, mask_B_T


def collate_optional(
    rows: Sequence[Sequence[float] | None], width: int, pad_value: float = 0.0
) -> tuple[Tensor, Tensor]:
    """(values_B_T, present_B) for a per-sample field that may be missing (teacher logprobs).

    Missing rows are all `pad_value` and `present_B` is False for them; every present row must
    already have its response's length (the caller checks it against the response ids).
    """
    values_B_T = torch.full((len(rows), width), pad_value, dtype=torch.float32)
    present_B = torch.zeros(len(rows), dtype=torch.bool)
    for index, row in enumerate(rows):
        if row is None:
            continue
        if len(row) > width:
            raise LogprobInputError(f"sample {index}: {len(row)} values do not fit width {width}")
        values_B_T[index, : len(row)] = torch.tensor(list(row), dtype=torch.float32)
        present_B[index] = True
    return values_B_T, present_B


@dataclass(frozen=True)
class CollatedBatch:
    """The per-sample fields of a training batch as right-padded tensors for `orl.trainer.losses`."""

    mask_B_T: Tensor  # bool: valid response tokens
    rollout_logprobs_B_T: Tensor  # as recorded by serving (0 on padding)
    teacher_logprobs_B_T: Tensor  # 0 where missing or padded
    has_teacher_B: Tensor  # bool
    rewards_B: Tensor  # 0 where missing
    has_reward_B: Tensor  # bool


def collate_samples(
    response_ids: Sequence[Sequence[int]],
    rollout_logprobs: Sequence[Sequence[float]],
    teacher_logprobs: Sequence[Sequence[float] | None],
    rewards: Sequence[float | None],
) -> CollatedBatch:
    """Pad a batch's per-token fields to `[B, T]`, refusing any row whose length is not its response's.

    A length mismatch is an error, never zero-padded (OpenClaw-RL's padding gave padded tokens a
    spurious OPD advantage of -old_logprob).
    """
    if not len(response_ids) == len(rollout_logprobs) == len(teacher_logprobs) == len(rewards):
        raise LogprobInputError(
            "response ids, rollout logprobs, teacher logprobs and rewards: one of each per sample"
        )
    for index, response in enumerate(response_ids):
        for name, row in (("rollout", rollout_logprobs[index]), ("teacher", teacher_logprobs[index])):
            if row is not None and len(row) != len(response):
                raise LogprobInputError(
                    f"sample {index}: {len(row)} {name} logprobs for {len(response)} response tokens"
                )
    lengths = [len(r) for r in response_ids]
    width = max(lengths, default=0)
    mask_B_T = torch.tensor([[t < n for t in range(width)] for n in lengths], dtype=torch.bool)
    rollout_B_T, _ = collate_optional(rollout_logprobs, width)
    teacher_B_T, has_teacher_B = collate_optional(teacher_logprobs, width)
    return CollatedBatch(
        mask_B_T=mask_B_T.reshape(len(lengths), width),
        rollout_logprobs_B_T=rollout_B_T,
        teacher_logprobs_B_T=teacher_B_T,
        has_teacher_B=has_teacher_B,
        rewards_B=torch.tensor([0.0 if r is None else float(r) for r in rewards], dtype=torch.float32),
        has_reward_B=torch.tensor([r is not None for r in rewards], dtype=torch.bool),
    )
