"""A prefix cache: values (a prompt's KV) kept per token sequence, found by the longest common prefix.

Pure bookkeeping over token lists and opaque values, so it is tested without a model; the batch
engine (serving/policy/batch_engine.py) keeps each prefilled prompt's KV here and starts a new row
from the longest kept prefix. Agent clients resend the whole conversation every turn, so turn k+1
reuses turn k's prompt up to the point where they differ.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

MIN_PREFIX_TOKENS = 64  # a shorter shared prefix saves less than a separate prefill costs
# An entry a newer one repeats but for its last few tokens is dropped: at worst a retry of the older
# request prefills this many tokens again, and a session keeps one entry rather than one per turn.
SUPERSEDED_TAIL_TOKENS = 256
V = TypeVar("V")


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case for a resent prefix: one C-level comparison
        return n
    return next(i for i in range(n) if a[i] != b[i])


@dataclass
class _Kept(Generic[V]):
    tokens: list[int]
    value: V
    nbytes: int


class PrefixCache(Generic[V]):
    """Values (a prompt's KV) kept per token sequence, found by the longest common token prefix.

    Least recently used entries go first once the kept bytes exceed `budget_bytes`; an entry larger
    than the budget is not kept, nor one that a kept entry starts with. Storing a sequence drops every
    entry it supersedes: one sharing at least `min_tokens` with it and fewer than `superseded_tail`
    tokens after that (a prefix, or the previous turn of a conversation whose trailing message the
    client dropped)."""

    def __init__(
        self,
        budget_bytes: int,
        min_tokens: int = MIN_PREFIX_TOKENS,
        superseded_tail: int = SUPERSEDED_TAIL_TOKENS,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.min_tokens = min_tokens
        self.superseded_tail = superseded_tail
        self._kept: OrderedDict[int, _Kept[V]] = OrderedDict()
        self._next_key = 0
        self.nbytes = 0

    def __len__(self) -> int:
        return len(self._kept)

    def longest_prefix(self, tokens: Sequence[int]) -> tuple[V, int] | None:
        """The kept value sharing the most leading tokens with `tokens` (at least `min_tokens`), and how many."""
        best: tuple[int, int] | None = None
        for key, kept in self._kept.items():
            shared = common_prefix_length(kept.tokens, tokens)
            if shared >= self.min_tokens and (best is None or shared > best[1]):
                best = (key, shared)
        if best is None:
            return None
        self._kept.move_to_end(best[0])
        return self._kept[best[0]].value, best[1]

    def put(self, tokens: Sequence[int], value: V, nbytes: int) -> None:
        """Keep `value` for `tokens`, evicting superseded then least recently used entries."""
        if not self.accepts(len(tokens), nbytes):
            return
        for key, kept in list(self._kept.items()):
            shared = common_prefix_length(kept.tokens, tokens)
            if shared == len(tokens):  # a kept entry already starts with all of `tokens`
                self._kept.move_to_end(key)
                return
            if shared >= self.min_tokens and len(kept.tokens) - shared < self.superseded_tail:
                self._drop(key)
        while self._kept and self.nbytes + nbytes > self.budget_bytes:
            self._drop(next(iter(self._kept)))
        self._kept[self._next_key] = _Kept(list(tokens), value, nbytes)
        self._next_key += 1
        self.nbytes += nbytes

    def accepts(self, length: int, nbytes: int) -> bool:
        """Whether `put` would keep a value of `nbytes` for `length` tokens."""
        return self.min_tokens <= length and nbytes <= self.budget_bytes

    def clear(self) -> None:
        self._kept.clear()
        self.nbytes = 0

    def _drop(self, key: int) -> None:
        self.nbytes -= self._kept.pop(key).nbytes
