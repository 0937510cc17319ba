"""The transformers backend's prefix cache on the real SmolLM2-135M: same outputs, fewer prefilled tokens.

A conversation is resent the way OpenClaw resends it (system prompt, history, and a trailing
internal-context message the next request drops), once with the prefix cache and once without.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.serving.policy.base import Generation, SamplingParams
from orl.serving.policy.prefix_cache import common_prefix_length
from orl.serving.policy.transformers_backend import TransformersBackend

from tests.integration.test_transformers_backend import AGREEMENT, diffs, save_perturbed
from tests.unit.openclaw_requests import TOOLS, internal_context, user

pytestmark = [pytest.mark.model, pytest.mark.slow]

SYSTEM_LINE = "You are a personal assistant running inside OpenClaw. Be brief. "  # 13 tokens
# OpenClaw's system prompts are long (about 300 tokens here); bf16 on a CPU without bf16 units is
# emulated and some 28x slower (it took 123 s of CI at 24 lines), so its case checks agreement on 8.
SYSTEM_LINES = {"fp32": 24, "bf16": 8}
SYSTEM = SYSTEM_LINE * SYSTEM_LINES["fp32"]
QUESTIONS = ["List the files in my project.", "Which one is the largest?", "Delete it."]


async def resent_conversation(
    b: TransformersBackend, params: SamplingParams, system: str
) -> list[Generation]:
    """Three turns; each request repeats the history but not the previous internal-context message."""
    history: list[dict[str, Any]] = [{"role": "system", "content": system}]
    gens = []
    for turn, question in enumerate(QUESTIONS):
        history.append(user(question))
        ids = b.chat_template.render([*history, internal_context(turn)], TOOLS)
        gen = await b.generate(ids, params)
        gens.append(gen)
        history.append({"role": "assistant", "content": gen.text})
    return gens


async def run_conversation(
    model_dir: Path, cache_bytes: int, params: SamplingParams, autocast: torch.dtype | None, system: str
) -> tuple[list[Generation], dict[str, int]]:
    b = TransformersBackend(model_dir, autocast_dtype=autocast, prefix_cache_bytes=cache_bytes)
    await b.start()
    try:
        return await resent_conversation(b, params, system), b.prefill_token_counts
    finally:
        await b.close()


@pytest.mark.parametrize(("precision", "temperature"), [("fp32", 0.0), ("fp32", 0.7), ("bf16", 0.7)])
async def test_cached_and_uncached_conversations_agree(
    base_model_dir: Path, precision: str, temperature: float
):
    from orl.compute.machine import choose_numerics

    autocast = choose_numerics(precision).autocast_dtype
    params = SamplingParams(temperature=temperature, max_tokens=12, seed=11)
    system = SYSTEM_LINE * SYSTEM_LINES[precision]
    cached, counts = await run_conversation(base_model_dir, 1 << 30, params, autocast, system)
    plain, plain_counts = await run_conversation(base_model_dir, 0, params, autocast, system)

    mean_limit, worst_limit = AGREEMENT[precision]
    for with_cache, without in zip(cached, plain, strict=True):
        assert with_cache.prompt_token_ids == without.prompt_token_ids
        assert with_cache.token_ids == without.token_ids
        mean, worst = diffs(with_cache.logprobs, without.logprobs)
        assert mean < mean_limit and worst < worst_limit, (precision, mean, worst)
    # turns 2 and 3 computed only what follows the part they share with the turn before
    prompts = [g.prompt_token_ids for g in cached]
    shared = [common_prefix_length(a, b) for a, b in zip(prompts, prompts[1:], strict=False)]
    assert min(shared) > 13 * SYSTEM_LINES[precision]  # at least the system prompt
    assert counts == {"computed": sum(len(p) for p in prompts) - sum(shared), "reused": sum(shared)}
    assert plain_counts == {"computed": sum(len(p) for p in prompts), "reused": 0}


def fresh_kv(model: Any, ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return [(layer.keys, layer.values) for layer in cache.layers]


async def test_kept_kv_is_not_written_by_later_decoding(base_model_dir: Path):
    """The kept tensors still hold the prompt's KV after rows decoded, merged, left and were trimmed."""
    from transformers import AutoModelForCausalLM

    b = TransformersBackend(base_model_dir, autocast_dtype=None, max_batch_size=4)
    await b.start()
    try:
        await resent_conversation(b, SamplingParams(temperature=0.7, max_tokens=6, seed=2), SYSTEM)
        last = b.chat_template.render([{"role": "system", "content": SYSTEM}, user("And then?")], TOOLS)
        short = b.chat_template.render([user("Hi")])
        params = SamplingParams(temperature=0.7, max_tokens=10, seed=3)
        await asyncio.gather(b.generate(last, params), b.generate(short, params), b.generate(last, params))
        assert b.prefix_cache_size[0] >= 1
        found = b._batches()[0].prefixes.longest_prefix(last)
    finally:
        await b.close()
    assert found is not None and found[1] == len(last)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32).eval()
    for (kept_k, kept_v), (k, v) in zip(found[0], fresh_kv(model, last), strict=True):
        assert kept_k.shape == k.shape
        torch.testing.assert_close(kept_k, k, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(kept_v, v, atol=1e-4, rtol=1e-4)


async def test_a_model_swap_empties_the_prefix_cache(base_model_dir: Path, tmp_path: Path):
    ckpt = await asyncio.to_thread(save_perturbed, base_model_dir, tmp_path / "v1")
    b = TransformersBackend(base_model_dir, autocast_dtype=None)
    await b.start()
    try:
        ids = b.chat_template.render([{"role": "system", "content": SYSTEM}, user("Hello")], TOOLS)
        params = SamplingParams(temperature=0, max_tokens=3)
        await b.generate(ids, params)
        await b.generate(ids, params)  # the same prompt again: all but its last token reused
        assert b.prefill_token_counts == {"computed": len(ids) + 1, "reused": len(ids) - 1}
        entries, nbytes = b.prefix_cache_size
        assert entries == 1 and nbytes == len(ids) * 30 * 2 * 3 * 64 * 4  # 45 KiB per token
        await b.load_checkpoint(ckpt, 1, "full")
        assert b.prefix_cache_size == (0, 0)
        gen = await b.generate(ids, params)
        assert gen.policy_version == 1
        assert b.prefill_token_counts == {"computed": 2 * len(ids) + 1, "reused": len(ids) - 1}
    finally:
        await b.close()
