"""Batched decoding for the in-process transformers backend (runs on its worker thread only).

`ActiveBatch` holds the rows decoding together on one model: a shared KV cache with every row
left-padded (padding is always a prefix, so a row's attention mask is 0...0 1...1), the next token
of each row, and each row's position. New rows are prefilled on their own and merged into the
running batch at a step boundary (continuous batching); finished rows leave at once, and leading
columns that became pure padding are trimmed. The transformer body runs under bf16 autocast; the
LM head runs in fp32 so logprobs are not rounded to bf16.

Prefix cache: after a prompt is prefilled its KV is kept in `PrefixCache` (an LRU bounded by bytes,
emptied when the batch adopts another model). A new row whose prompt shares at least
`prefix_cache.MIN_PREFIX_TOKENS` leading tokens with a kept prompt starts from that KV and prefills only the rest,
on its own (its prefix cannot be left-padded into a group), then joins the batch like any row. Agent
clients resend the whole conversation every turn, so turn k+1 reuses turn k's prompt up to the point
where they differ. Holding the tensors is safe: DynamicCache replaces its layers' tensors (torch.cat,
indexing, slicing) and never writes into them.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from orl.serving.policy.base import (
    MAIN_RUN,
    FinishReason,
    Generation,
    GenerationStream,
    SamplingParams,
    TokenStep,
)
from orl.serving.policy.detokenizer import IncrementalDecoder
from orl.serving.policy.output_constraint import OutputConstraint
from orl.serving.policy.prefix_cache import PrefixCache
from transformers import DynamicCache


@dataclass(eq=False)  # rows are compared by identity
class Row:
    """One request being generated."""

    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int
    stream: GenerationStream
    decoder: IncrementalDecoder
    submitted_at: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    version: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    generator: torch.Generator = field(default_factory=torch.Generator)
    constraint: OutputConstraint | None = None  # response_format json: the grammar masks each step
    run: str = MAIN_RUN  # the run whose policy decodes it (set when it is queued)

    def __post_init__(self) -> None:
        seed = self.params.seed if self.params.seed is not None else random.getrandbits(63)
        self.generator.manual_seed(seed)


def forward_context(autocast_dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CPU for the transformer body (or nothing when dtype is None)."""
    if autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=autocast_dtype)


def hidden_states(model: Any, autocast_dtype: torch.dtype | None, **inputs: Any) -> torch.Tensor:
    """Final hidden states [B, T, H] of the transformer body."""
    with forward_context(autocast_dtype):
        out = model.model(**inputs)
    return out.last_hidden_state


def lm_logits(model: Any, hidden_B_T_H: torch.Tensor) -> torch.Tensor:
    """fp32 logits [B, T, V]: the head runs outside autocast so logprobs keep fp32 precision."""
    return model.lm_head(hidden_B_T_H.float()).float()


def sample_token(
    logits_V: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[int, float]:
    """Sample one token; return it with its logprob under softmax(logits / T), before top-p."""
    if params.temperature == 0:
        logp_V = torch.log_softmax(logits_V, dim=-1)
        token = int(torch.argmax(logits_V))
        return token, float(logp_V[token])
    logp_V = torch.log_softmax(logits_V / params.temperature, dim=-1)
    probs_V = logp_V.exp()
    if params.top_p < 1.0:
        probs_V = top_p_filter(probs_V, params.top_p)
    token = int(torch.multinomial(probs_V, 1, generator=generator))
    return token, float(logp_V[token])


def top_p_filter(probs_V: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest set whose probability reaches top_p (always keep one)."""
    sorted_p, order = torch.sort(probs_V, descending=True)
    before = torch.cumsum(sorted_p, dim=-1) - sorted_p
    sorted_p = torch.where(before < top_p, sorted_p, torch.zeros_like(sorted_p))
    return torch.zeros_like(probs_V).scatter(-1, order, sorted_p)


def _left_pad(x: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim=dim)


KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [1, heads, T, head_dim]


class ActiveBatch:
    """The rows decoding together on one model, with their shared KV cache."""

    def __init__(self, autocast_dtype: torch.dtype | None, pad_id: int, prefix_cache_bytes: int = 0) -> None:
        self.autocast_dtype = autocast_dtype
        self.pad_id = pad_id
        self.prefixes: PrefixCache[KV] = PrefixCache(prefix_cache_bytes)
        self.prefill_tokens: Counter[str] = Counter()  # "computed" and "reused" prompt tokens
        self.model: Any = None
        self.version = 0
        self.rows: list[Row] = []
        self._cache: DynamicCache | None = None
        self._mask_B_T = torch.zeros(0, 0, dtype=torch.long)
        self._next_B = torch.zeros(0, dtype=torch.long)
        self._pos_B = torch.zeros(0, dtype=torch.long)

    def admit(self, rows: list[Row], model: Any, version: int) -> None:
        """Prefill `rows` and merge them in; an empty batch adopts `model` (a swap point)."""
        if not self.rows:
            if model is not self.model:
                self.prefixes.clear()  # KV computed by other weights
            self.model, self.version = model, version
        if model is not self.model:
            raise RuntimeError("rows may only join a batch running the same model")
        fresh: list[Row] = []
        for row in rows:
            row.version = self.version
            # at least the last prompt token is computed: its logits give the first new token
            found = self.prefixes.longest_prefix(row.prompt_ids[:-1]) if self.prefixes.budget_bytes else None
            if found is None:
                fresh.append(row)
            else:
                self._join([row], *self._prefill_after(row, *found))
        if fresh:
            self._join(fresh, *self._prefill(fresh))
        self._drop_finished()

    def step(self) -> None:
        """Decode one token for every row."""
        self._drop_cancelled()
        if not self.rows:
            return
        ones = torch.ones(len(self.rows), 1, dtype=torch.long)
        self._mask_B_T = torch.cat([self._mask_B_T, ones], dim=1)
        hidden = hidden_states(
            self.model,
            self.autocast_dtype,
            input_ids=self._next_B[:, None],
            attention_mask=self._mask_B_T,
            position_ids=self._pos_B[:, None],
            past_key_values=self._cache,
            use_cache=True,
        )
        logits_B_V = lm_logits(self.model, hidden[:, -1, :])
        self._pos_B = self._pos_B + 1
        self._next_B = torch.tensor([self._take(r, logits_B_V[i]) for i, r in enumerate(self.rows)])
        self._drop_finished()

    def fail_all(self, error: BaseException) -> None:
        """Deliver `error` to every row and empty the batch (after an unexpected failure)."""
        for row in self.rows:
            row.stream.publish_threadsafe(error)
        self._select([])

    def _join(
        self, rows: list[Row], cache: DynamicCache, mask: torch.Tensor, first_logits: torch.Tensor
    ) -> None:
        """Keep the prompts' KV, take each row's first token and merge the rows into the batch."""
        self._keep_prefixes(rows, cache, mask)
        firsts = [self._take(row, first_logits[i]) for i, row in enumerate(rows)]
        pos = mask.sum(dim=1)
        self._merge(rows, cache, mask, torch.tensor(firsts, dtype=torch.long), pos)

    def _keep_prefixes(self, rows: list[Row], cache: DynamicCache, mask: torch.Tensor) -> None:
        if not self.prefixes.budget_bytes:
            return
        width = mask.shape[1]
        for i, row in enumerate(rows):
            pad = width - len(row.prompt_ids)
            kv = [
                (layer.keys[i : i + 1, :, pad:], layer.values[i : i + 1, :, pad:])
                for layer in _kv_layers(cache)
            ]
            nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
            if not self.prefixes.accepts(len(row.prompt_ids), nbytes):
                continue
            if len(rows) > 1 or pad:  # a view would pin the whole group's tensors: keep a copy
                kv = [(k.clone(), v.clone()) for k, v in kv]
            self.prefixes.put(row.prompt_ids, kv, nbytes)

    def _prefill_after(
        self, row: Row, kv: KV, reused: int
    ) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """Prefill `row` alone on the kept KV of its first `reused` prompt tokens."""
        past = [(k[:, :, :reused], v[:, :, :reused]) for k, v in kv]
        cache = DynamicCache(past, config=self.model.config)  # copies on the first update (torch.cat)
        total = len(row.prompt_ids)
        hidden = hidden_states(
            self.model,
            self.autocast_dtype,
            input_ids=torch.tensor([row.prompt_ids[reused:]], dtype=torch.long),
            attention_mask=torch.ones(1, total, dtype=torch.long),
            position_ids=torch.arange(reused, total)[None, :],
            past_key_values=cache,
            use_cache=True,
        )
        self.prefill_tokens.update(computed=total - reused, reused=reused)
        return cache, torch.ones(1, total, dtype=torch.long), lm_logits(self.model, hidden[:, -1, :])

    def _prefill(self, rows: list[Row]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        longest = max(len(r.prompt_ids) for r in rows)
        ids = [[self.pad_id] * (longest - len(r.prompt_ids)) + r.prompt_ids for r in rows]
        mask = [[0] * (longest - len(r.prompt_ids)) + [1] * len(r.prompt_ids) for r in rows]
        mask_B_T = torch.tensor(mask, dtype=torch.long)
        cache = DynamicCache(config=self.model.config)
        hidden = hidden_states(
            self.model,
            self.autocast_dtype,
            input_ids=torch.tensor(ids, dtype=torch.long),
            attention_mask=mask_B_T,
            position_ids=(mask_B_T.cumsum(dim=1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
        )
        self.prefill_tokens.update(computed=sum(len(r.prompt_ids) for r in rows))
        return cache, mask_B_T, lm_logits(self.model, hidden[:, -1, :])

    def _merge(
        self, rows: list[Row], cache: DynamicCache, mask: torch.Tensor, nxt: torch.Tensor, pos: torch.Tensor
    ) -> None:
        if self._cache is None or not self.rows:
            self._cache, self._mask_B_T, self._next_B, self._pos_B = cache, mask, nxt, pos
            self.rows = list(rows)
            return
        length = max(self._mask_B_T.shape[1], mask.shape[1])
        for old, new in zip(_kv_layers(self._cache), _kv_layers(cache), strict=True):
            old.keys = torch.cat([_left_pad(old.keys, length, 2), _left_pad(new.keys, length, 2)])
            old.values = torch.cat([_left_pad(old.values, length, 2), _left_pad(new.values, length, 2)])
        self._mask_B_T = torch.cat([_left_pad(self._mask_B_T, length, 1), _left_pad(mask, length, 1)])
        self._next_B = torch.cat([self._next_B, nxt])
        self._pos_B = torch.cat([self._pos_B, pos])
        self.rows.extend(rows)

    def _take(self, row: Row, logits_V: torch.Tensor) -> int:
        if row.constraint is not None:  # sampled, and its logprob taken, from the masked distribution
            logits_V = row.constraint.masked(logits_V)
        token, logprob = sample_token(logits_V, row.params, row.generator)
        row.token_ids.append(token)
        row.logprobs.append(logprob)
        delta = row.decoder.add(token)
        if row.constraint is not None:
            row.constraint.advance(token)
        if row.decoder.stopped or (row.constraint is not None and row.constraint.finished):
            row.finish_reason = "stop"
        elif len(row.token_ids) >= row.max_new_tokens:
            row.finish_reason = "length"
            delta += row.decoder.finish()
        row.stream.publish_threadsafe(TokenStep(token, logprob, delta))
        return token

    def _drop_cancelled(self) -> None:
        for row in self.rows:
            if row.cancelled.is_set() and row.finish_reason is None:
                row.finish_reason = "abort"
        self._drop_finished()

    def _drop_finished(self) -> None:
        keep = [i for i, r in enumerate(self.rows) if r.finish_reason is None]
        if len(keep) == len(self.rows):
            return
        for row in self.rows:
            if row.finish_reason is not None:
                row.stream.publish_threadsafe(_finished(row))
        self._select(keep)

    def _select(self, keep: list[int]) -> None:
        if not keep:
            self.rows, self._cache = [], None
            self._mask_B_T = torch.zeros(0, 0, dtype=torch.long)
            return
        index = torch.tensor(keep, dtype=torch.long)
        self.rows = [self.rows[i] for i in keep]
        self._next_B, self._pos_B = self._next_B[index], self._pos_B[index]
        self._mask_B_T = self._mask_B_T[index]
        assert self._cache is not None
        self._cache.batch_select_indices(index)
        self._trim_padding()

    def _trim_padding(self) -> None:
        """Drop leading columns that are padding in every remaining row."""
        used = self._mask_B_T.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else 0
        if start == 0 or self._cache is None:
            return
        self._mask_B_T = self._mask_B_T[:, start:]
        for layer in _kv_layers(self._cache):
            layer.keys = layer.keys[:, :, start:, :]
            layer.values = layer.values[:, :, start:, :]


def _kv_layers(cache: DynamicCache) -> list[Any]:
    """The per-layer key/value holders (DynamicLayer: `.keys` / `.values`, [B, heads, T, head_dim])."""
    return list(cache.layers)


def _finished(row: Row) -> Generation:
    assert row.finish_reason is not None
    return Generation(
        prompt_token_ids=list(row.prompt_ids),
        token_ids=list(row.token_ids),
        logprobs=list(row.logprobs),
        text=row.decoder.text,
        finish_reason=row.finish_reason,
        policy_version=row.version,
        latency_ms=(time.monotonic() - row.submitted_at) * 1000.0,
        policy_run=row.run,
    )
