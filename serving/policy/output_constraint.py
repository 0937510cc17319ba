"""Constrained decoding for `response_format` json_object and json_schema, with llguidance.

A request's response_format (as recorded: `SamplingParams.constraint`, its JSON text) becomes an
llguidance grammar; each decode step masks the logits to the tokens the grammar allows, the token is
sampled from that masked distribution (so its recorded logprob is the one it was sampled with), and
the matcher consumes it. The reply ends when the model ends its turn where the grammar allows it, or
when the grammar admits no further token. SGLang gets the same schema as its `json_schema` sampling
parameter (serving/policy/sglang_backend.py). Reads and writes nothing.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import llguidance
import llguidance.torch
import torch
from orl.schemas.errors import OrlError

if TYPE_CHECKING:
    from orl.serving.policy.chat_template import ChatTemplate


class ConstraintError(OrlError):
    """A response_format orl cannot enforce (a malformed or unsupported JSON schema)."""


def json_schema_of(constraint: str) -> dict[str, Any]:
    """The JSON schema a recorded constraint holds the output to (json_object: any object)."""
    response_format = json.loads(constraint)
    if response_format["type"] == "json_object":
        return {"type": "object"}
    schema: dict[str, Any] = response_format["json_schema"].get("schema") or {}
    return schema


@functools.lru_cache(maxsize=256)
def grammar_of(constraint: str) -> str:
    """The llguidance grammar of a recorded constraint; ConstraintError when it has none. Cached:
    the request parser compiles it to refuse a bad schema, the backend then builds its matcher
    from the same canonical text."""
    schema = json_schema_of(constraint)
    try:
        # compact JSON: with free whitespace a small model fills strings' gaps with newlines for ever
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
    except (ValueError, TypeError) as error:
        raise ConstraintError(f"the JSON schema cannot be enforced: {error}") from error
    problem = llguidance.LLMatcher.validate_grammar(grammar)  # "" when valid
    if problem:
        raise ConstraintError(f"the JSON schema cannot be enforced: {problem}")
    return grammar


class ExactTokens:
    """The vocabulary as llguidance's TokenizerWrapper reads it: each id's exact bytes, from orl's
    own table (ChatTemplate.token_bytes). llguidance's own reading of a Hugging Face tokenizer
    misses byte-level BPE when the decoder is a sequence, as in a tokenizer converted from GGUF
    (it then took "Ċ" for two letters where the model writes a newline)."""

    def __init__(self, template: ChatTemplate, eos_ids: frozenset[int]) -> None:
        tokenizer = template.tokenizer
        self.eos_token_id = min(eos_ids)
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [template.token_bytes(token_id) for token_id in range(len(tokenizer))]
        self.special_token_ids = sorted(set(tokenizer.all_special_ids) | eos_ids)
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])


class ConstraintCompiler:
    """Builds a matcher per constrained request over one model's vocabulary (read once, lazily)."""

    def __init__(self, template: ChatTemplate, eos_ids: frozenset[int]) -> None:
        self._template, self._eos_ids = template, eos_ids
        self._tokenizer: llguidance.LLTokenizer | None = None

    def constraint(self, constraint: str) -> OutputConstraint:
        if self._tokenizer is None:
            wrapper = llguidance.TokenizerWrapper(ExactTokens(self._template, self._eos_ids))
            self._tokenizer = llguidance.LLTokenizer(wrapper, eos_token=sorted(self._eos_ids))
        matcher = llguidance.LLMatcher(self._tokenizer, grammar_of(constraint))
        if matcher.is_error():
            raise ConstraintError(f"the JSON schema cannot be enforced: {matcher.get_error()}")
        return OutputConstraint(matcher, self._tokenizer.vocab_size)


class OutputConstraint:
    """One request's grammar state: masks each step's logits and consumes the sampled token."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)

    def masked(self, logits_V: torch.Tensor) -> torch.Tensor:
        """The logits with every token the grammar forbids at -inf (a copy); ids past the
        tokenizer's vocabulary (a padded embedding) are forbidden too."""
        llguidance.torch.fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        logits_1_V = logits_V[None].clone()
        logits_1_V[:, self._vocab_size :] = float("-inf")
        llguidance.torch.apply_token_bitmask_inplace(logits_1_V[:, : self._vocab_size], self._bitmask)
        return logits_1_V[0]

    def advance(self, token_id: int) -> None:
        if not self._matcher.consume_token(token_id):
            raise ConstraintError(f"token {token_id} broke the grammar: {self._matcher.get_error()}")

    @property
    def finished(self) -> bool:
        """The grammar admits no further token: the reply is complete."""
        return bool(self._matcher.is_stopped())
