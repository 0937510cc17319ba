"""TransformersBackend on the real SmolLM2-135M: sampling, logprobs, batching, stops, scoring, hot swap."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.serving.policy.base import Generation, SamplingParams
from orl.serving.policy.transformers_backend import TransformersBackend

pytestmark = [pytest.mark.model, pytest.mark.slow]

QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "Write one sentence about the sea.",
    "How do I convert 3/4 to a percentage?",
]


@pytest.fixture
async def backend(base_model_dir: Path):
    b = TransformersBackend(base_model_dir, max_batch_size=8)
    await b.start()
    yield b
    await b.close()


@pytest.fixture(scope="module")
def reference_model(base_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32).eval()


def prompt(b: TransformersBackend, question: str) -> list[int]:
    return b.chat_template.render([{"role": "user", "content": question}])


def recompute(model: Any, gen: Generation, temperature: float) -> list[float]:
    """fp32 logprobs of the generated tokens from one full forward pass (what the trainer does)."""
    ids = torch.tensor([gen.prompt_token_ids + gen.token_ids])
    with torch.inference_mode():
        logits = model(ids).logits[0, len(gen.prompt_token_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(gen.token_ids)[:, None])[:, 0].tolist()


def diffs(a: list[float], b: list[float]) -> tuple[float, float]:
    d = [abs(x - y) for x, y in zip(a, b, strict=True)]
    return sum(d) / len(d), max(d)


async def test_seeded_generation_is_reproducible(backend: TransformersBackend):
    params = SamplingParams(temperature=0.7, max_tokens=12, seed=1234)
    first = await backend.generate(prompt(backend, QUESTIONS[1]), params)
    second = await backend.generate(prompt(backend, QUESTIONS[1]), params)
    assert first.token_ids == second.token_ids and first.text == second.text
    assert len(first.logprobs) == len(first.token_ids) and first.policy_version == 0


# (mean, worst) absolute logprob difference allowed between server and trainer under each numerics
AGREEMENT = {"fp32": (1e-3, 1e-2), "bf16": (0.05, 0.4)}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
async def test_server_and_trainer_logprobs_agree(base_model_dir: Path, reference_model: Any, precision: str):
    """The server's sampled logprobs and scores against the trainer's recomputation, in the same numerics.

    bf16 runs here even on a CPU that emulates it (slowly): a machine with native bf16 picks it."""
    from orl.compute.machine import choose_numerics
    from orl.trainer.logprobs import response_logprobs

    numerics = choose_numerics(precision)
    b = TransformersBackend(base_model_dir, autocast_dtype=numerics.autocast_dtype)
    await b.start()
    try:
        gen = await b.generate(
            prompt(b, QUESTIONS[2]), SamplingParams(temperature=0.7, max_tokens=16, seed=7)
        )
        scored = await b.score(gen.prompt_token_ids, gen.token_ids, temperature=0.7)
    finally:
        await b.close()
    with torch.no_grad():
        trainer = response_logprobs(
            reference_model, [gen.prompt_token_ids], [gen.token_ids], [0.7], autocast=numerics.autocast
        )[0].tolist()
    mean_limit, worst_limit = AGREEMENT[precision]
    for served in (gen.logprobs, scored):
        mean, worst = diffs(served, trainer)
        assert mean < mean_limit and worst < worst_limit, (precision, mean, worst)
    mean, worst = diffs(gen.logprobs, recompute(reference_model, gen, 0.7))  # and the plain fp32 forward
    assert mean < mean_limit and worst < worst_limit, (precision, mean, worst)


async def test_the_backend_marks_itself_busy_on_the_core_board_while_it_computes(
    base_model_dir: Path, tmp_path: Path
):
    from orl.compute.machine import CoreBoard

    board_dir = tmp_path / "cores"
    b = TransformersBackend(base_model_dir, core_board=CoreBoard(board_dir, 2))
    await b.start()
    try:
        stream = b.generate_stream(prompt(b, QUESTIONS[2]), SamplingParams(max_tokens=24, seed=1))
        seen_busy = False
        async for _ in stream:
            seen_busy = seen_busy or any(board_dir.iterdir())
        assert seen_busy
        deadline = asyncio.get_running_loop().time() + 5
        while any(board_dir.iterdir()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        assert not any(board_dir.iterdir())  # idle again once the batch drained
    finally:
        await b.close()


async def test_concurrent_requests_are_batched(backend: TransformersBackend):
    params = SamplingParams(temperature=0.7, max_tokens=12, seed=3)
    gens = await asyncio.gather(*[backend.generate(prompt(backend, q), params) for q in QUESTIONS])
    assert all(g.token_ids and g.finish_reason in ("stop", "length") for g in gens)
    assert backend.max_batch_size_seen > 1


async def test_fp32_batched_logprobs_equal_scores_exactly(base_model_dir: Path):
    """Without autocast, continuous batching (rows joining mid-flight, left padding) is exact."""
    b = TransformersBackend(base_model_dir, autocast_dtype=None)
    await b.start()
    try:
        params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=10, seed=5)
        first = asyncio.ensure_future(b.generate(prompt(b, QUESTIONS[3]), params))
        await asyncio.sleep(0.3)  # let it start so the others join a running batch
        rest = [b.generate(prompt(b, q), params) for q in QUESTIONS[:3]]
        gens = [await first, *await asyncio.gather(*rest)]
        for g in gens:
            scored = await b.score(g.prompt_token_ids, g.token_ids, temperature=0.8)
            assert diffs(scored, g.logprobs)[1] < 2e-3
        assert b.max_batch_size_seen > 1
    finally:
        await b.close()


async def test_stop_strings_max_tokens_and_end_of_turn(backend: TransformersBackend):
    ids = prompt(backend, QUESTIONS[2])
    free = await backend.generate(ids, SamplingParams(temperature=0, max_tokens=12))
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    word = free.text.split()[3]
    stopped = backend.generate_stream(ids, SamplingParams(temperature=0, max_tokens=12, stop=(word,)))
    streamed = "".join([step.text async for step in stopped])
    gen = stopped.generation
    assert gen.finish_reason == "stop" and word not in gen.text
    assert gen.text == free.text[: free.text.index(word)] == streamed
    short = await backend.generate(
        prompt(backend, "What is the capital of France? Answer with one word."),
        SamplingParams(temperature=0, max_tokens=30),
    )
    assert short.finish_reason == "stop" and short.token_ids[-1] == 2 and "<|im_end|>" not in short.text


async def test_closed_stream_stops_decoding(backend: TransformersBackend):
    stream = backend.generate_stream(prompt(backend, QUESTIONS[2]), SamplingParams(max_tokens=200))
    await stream.__anext__()
    await stream.aclose()
    after = await backend.generate(prompt(backend, QUESTIONS[0]), SamplingParams(temperature=0, max_tokens=4))
    assert after.token_ids
    assert sum(backend.batch_size_counts.values()) < 50  # the abandoned request did not run to 200


def save_perturbed(base_model_dir: Path, out: Path) -> Path:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    with torch.no_grad():
        weight = model.model.layers[3].mlp.down_proj.weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * 0.05)
    model.save_pretrained(out)
    return out


def save_lora(base_model_dir: Path, out: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(out))
    return out


async def test_hot_swap_full_checkpoint_between_requests(
    backend: TransformersBackend, base_model_dir: Path, tmp_path: Path
):
    ckpt = await asyncio.to_thread(save_perturbed, base_model_dir, tmp_path / "v1")
    ids = prompt(backend, QUESTIONS[0])
    response = (await backend.generate(ids, SamplingParams(temperature=0, max_tokens=8))).token_ids
    before = await backend.score(ids, response)
    running = backend.generate_stream(
        prompt(backend, QUESTIONS[2]), SamplingParams(temperature=0.7, max_tokens=24)
    )
    await running.__anext__()  # the old request is decoding
    await backend.load_checkpoint(ckpt, 1, "full")
    old = await running.result()
    # the request running during the swap completes (not aborted), on the weights it started with
    assert old.policy_version == 0 and old.finish_reason in ("length", "stop") and old.token_ids
    assert backend.policy_version == 1
    new = await backend.generate(ids, SamplingParams(temperature=0, max_tokens=4))
    assert new.policy_version == 1
    after = await backend.score(ids, response)
    assert diffs(before, after)[1] > 1e-3
    assert diffs(before, await backend.score(ids, response, use_base=True))[1] < 1e-4


async def test_hot_swap_lora_adapter_keeps_base_for_reference(
    backend: TransformersBackend, base_model_dir: Path, tmp_path: Path
):
    adapter = await asyncio.to_thread(save_lora, base_model_dir, tmp_path / "lora2")
    ids = prompt(backend, QUESTIONS[1])
    response = (await backend.generate(ids, SamplingParams(temperature=0, max_tokens=8))).token_ids
    before = await backend.score(ids, response)
    await backend.load_checkpoint(adapter, 2, "lora")
    assert backend.policy_version == 2
    assert diffs(before, await backend.score(ids, response))[1] > 1e-3
    assert diffs(before, await backend.score(ids, response, use_base=True))[1] < 1e-4


async def test_a_tenant_run_answers_its_own_requests_beside_the_main_policy(
    backend: TransformersBackend, base_model_dir: Path, tmp_path: Path
):
    adapter = await asyncio.to_thread(save_lora, base_model_dir, tmp_path / "alice-v1")
    ids = prompt(backend, QUESTIONS[3])
    greedy = SamplingParams(temperature=0, max_tokens=12)
    base = await backend.generate(ids, greedy, "live.alice")  # none of alice's versions yet: the main policy
    assert (base.policy_run, base.policy_version) == ("", 0)
    assert backend.version_of("live.alice") is None

    await backend.load_checkpoint(adapter, 1, "lora", "live.alice")
    assert backend.version_of("live.alice") == 1 and backend.policy_version == 0  # the main run is untouched
    main, alice, bob = await asyncio.gather(  # decoding at once, on two policies
        backend.generate(ids, greedy),
        backend.generate(ids, greedy, "live.alice"),
        backend.generate(ids, greedy, "live.bob"),  # bob has no run loaded: the main policy
    )
    assert (main.policy_run, alice.policy_run, bob.policy_run) == ("", "live.alice", "")
    assert alice.policy_version == 1 and main.policy_version == bob.policy_version == 0
    assert main.token_ids == bob.token_ids == base.token_ids
    assert diffs(main.logprobs, base.logprobs)[1] < 1e-4  # main and bob batched together, alice apart
    # alice's answer is her adapter's: its logprobs are what the merged adapter gives, not the base's
    merged = await asyncio.to_thread(merged_lora, base_model_dir, adapter)
    mean, worst = diffs(alice.logprobs, recompute(merged, alice, 1.0))
    assert worst < 1e-3, (mean, worst)
    assert (
        diffs(await backend.score(ids, alice.token_ids), recompute(merged, alice, 1.0))[1] > 1e-3
    )  # score is main's


def merged_lora(base_model_dir: Path, adapter: Path) -> Any:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval()


def fp32_weights_under_autocast(
    model: Any, prompt_ids: list[int], response: list[int], temp: float
) -> list[float]:
    """The response's logprobs from fp32 weights under bf16 autocast (what the server ran before it cast them)."""
    from orl.serving.policy.batch_engine import hidden_states, lm_logits

    ids = torch.tensor([prompt_ids + response])
    with torch.inference_mode():
        hidden = hidden_states(model, torch.bfloat16, input_ids=ids, use_cache=False)
        h = hidden[0, len(prompt_ids) - 1 : -1]
        logp = torch.log_softmax(lm_logits(model, h) / temp, dim=-1)
    return logp.gather(1, torch.tensor(response)[:, None])[:, 0].tolist()


async def test_bf16_served_weights_give_the_logprobs_of_fp32_weights_under_autocast(
    base_model_dir: Path, reference_model: Any, tmp_path: Path
):
    """Under bf16 autocast the server holds its Linear weights in bf16: the numbers must not change, for the base,
    for score(use_base=True) after a swap, and for swapped-in full and LoRA checkpoints."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ckpt = await asyncio.to_thread(save_perturbed, base_model_dir, tmp_path / "v1")
    adapter = await asyncio.to_thread(save_lora, base_model_dir, tmp_path / "lora")
    b = TransformersBackend(base_model_dir, autocast_dtype=torch.bfloat16)
    await b.start()
    try:
        ids = prompt(b, QUESTIONS[3])
        gen = await b.generate(ids, SamplingParams(temperature=0.7, max_tokens=12, seed=5))
        expected_base = fp32_weights_under_autocast(reference_model, ids, gen.token_ids, 0.7)
        assert await b.score(ids, gen.token_ids, temperature=0.7) == expected_base
        await b.load_checkpoint(ckpt, 1, "full")
        assert await b.score(ids, gen.token_ids, temperature=0.7, use_base=True) == expected_base
        perturbed = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
        expected_new = fp32_weights_under_autocast(perturbed, ids, gen.token_ids, 0.7)
        assert await b.score(ids, gen.token_ids, temperature=0.7) == expected_new
        assert expected_new != expected_base
        # a LoRA adapter merges into the fp32 master, not into the served bf16 copy
        await b.load_checkpoint(adapter, 2, "lora")
        fresh_base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
        merged = PeftModel.from_pretrained(fresh_base, str(adapter)).merge_and_unload()
        assert await b.score(ids, gen.token_ids, temperature=0.7) == fp32_weights_under_autocast(
            merged.eval(), ids, gen.token_ids, 0.7
        )
    finally:
        await b.close()


def test_chat_template_renders_tool_turns_as_text(base_model_dir: Path):
    from orl.serving.policy.chat_template import ChatTemplate

    template = ChatTemplate.from_dir(base_model_dir)
    tools = [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object"}}}]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "List files."}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "run_shell", "arguments": '{"cmd": "ls"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt b.txt"},
    ]
    text = template.render_text(messages, tools)
    assert text.startswith("<|im_start|>system\n") and "run_shell" in text.split("<|im_end|>")[0]
    assert '<tool_call>\n{"name": "run_shell", "arguments": {"cmd": "ls"}}\n</tool_call>' in text
    assert "<|im_start|>user\n<tool_response" in text and "a.txt b.txt" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert template.decode(template.render(messages, tools), skip_special_tokens=False) == text


def test_incremental_decoder_never_splits_characters(base_model_dir: Path):
    from orl.serving.policy.chat_template import ChatTemplate
    from orl.serving.policy.detokenizer import IncrementalDecoder

    template = ChatTemplate.from_dir(base_model_dir)
    text = "Héllo 🌍 wörld, 世界! done."
    ids = template.tokenizer(text, add_special_tokens=False)["input_ids"]
    decoder = IncrementalDecoder(template.decode, stop=("done",), eos_ids=template.eos_token_ids)
    deltas = [decoder.add(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == decoder.text == text[: text.index("done")]
    assert decoder.stopped
