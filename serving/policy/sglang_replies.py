"""Parsing of SGLang's `/generate` replies: logprob fields (checked, never padded), finish reasons, versions.

SGLang's `meta_info` (python/sglang/srt/managers/tokenizer_manager.py, `detokenize_logprob_tokens` and
`detokenize_top_logprobs_tokens`): `output_token_logprobs` / `input_token_logprobs` are lists of
`[logprob, token_id, text|None]`, one per token; with `top_logprobs_num=K`, `input_top_logprobs` has
one entry per input position from `logprob_start_len` on, each a list of K `[logprob, token_id,
text|None]`, most likely first (None at position 0, which has no context). Pure functions; no I/O.
"""

from __future__ import annotations

from typing import Any

from orl.serving.policy.base import FinishReason, PolicyError


def ids_and_logprobs(entries: Any, field: str) -> tuple[list[int], list[float]]:
    """(ids, logprobs) of a list of `[logprob, token_id, text]` entries."""
    if not isinstance(entries, list):
        raise PolicyError(f"SGLang returned no {field} (is return_logprob supported?)")
    ids, logprobs = [], []
    for entry in entries:
        if not isinstance(entry, list | tuple) or len(entry) < 2 or entry[0] is None:
            raise PolicyError(f"SGLang returned a null or malformed logprob entry in {field}: {entry!r}")
        logprobs.append(float(entry[0]))
        ids.append(int(entry[1]))
    return ids, logprobs


def new_output_entries(meta: dict[str, Any], seen: int) -> list[tuple[int, float]]:
    """Entries of this chunk not seen yet, for cumulative and incremental streams alike."""
    entries = meta.get("output_token_logprobs") or []
    total = int(meta.get("completion_tokens", seen + len(entries)))
    fresh = entries[len(entries) - (total - seen) :] if total > seen else []
    ids, logprobs = ids_and_logprobs(fresh, "output_token_logprobs")
    return list(zip(ids, logprobs, strict=True))


def response_logprobs(entries: Any, response_ids: list[int]) -> list[float]:
    """The response suffix of input_token_logprobs, checked token by token (never padded)."""
    if not isinstance(entries, list) or len(entries) < len(response_ids):
        got = len(entries) if isinstance(entries, list) else 0
        raise PolicyError(f"SGLang returned {got} input logprobs for a {len(response_ids)}-token response")
    ids, logprobs = ids_and_logprobs(entries[len(entries) - len(response_ids) :], "input_token_logprobs")
    if ids != list(response_ids):
        raise PolicyError("SGLang input_token_logprobs do not line up with the response tokens")
    return logprobs


def response_top_logprobs(
    entries: Any, response_length: int, top_k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """([T][K] ids, [T][K] logprobs): the response suffix of input_top_logprobs, K per position.

    A missing or short row is an error, not filled in (OpenClaw-RL filled missing rows with zeros and
    ids range(K), which trains the student towards tokens the teacher never proposed).
    """
    if not isinstance(entries, list) or len(entries) < response_length:
        got = len(entries) if isinstance(entries, list) else 0
        raise PolicyError(
            f"SGLang returned {got} input_top_logprobs rows for a {response_length}-token response "
            "(is top_logprobs_num supported?)"
        )
    top_ids, top_logprobs = [], []
    for position, row in enumerate(entries[len(entries) - response_length :]):
        ids, logprobs = ids_and_logprobs(row, "input_top_logprobs")
        if len(ids) != top_k:
            raise PolicyError(
                f"SGLang returned {len(ids)} top logprobs at response position {position}, asked for {top_k}"
            )
        top_ids.append(ids)
        top_logprobs.append(logprobs)
    return top_ids, top_logprobs


def finish_reason(raw: Any) -> FinishReason:
    kind = raw.get("type") if isinstance(raw, dict) else raw
    if kind in ("stop", "length", "abort"):
        return kind  # type: ignore[no-any-return]
    raise PolicyError(f"SGLang returned an unknown finish_reason {raw!r}")


def served_version(body: dict[str, Any], meta: dict[str, Any], version: int) -> int:
    """An adapter request ran on the adapter it named (SGLang's weight_version is the base's);
    otherwise SGLang's meta_info says which weights ran (requests held during an update get the new)."""
    if body.get("lora_path"):
        return version
    return version_number(meta.get("weight_version"), default=version)


def version_number(raw: Any, default: int) -> int:
    """SGLang weight versions are strings; orl's are integers ("v3" and "3" both mean 3)."""
    text = str(raw).lstrip("v") if raw is not None else ""
    return int(text) if text.isdigit() else default
