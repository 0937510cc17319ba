"""SGLangBackend against a loopback fake SGLang server (tests/fixtures/fake_sglang.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schemas.errors import ServiceUnavailable
from serving.policy.base import CheckpointError, PolicyError, SamplingParams
from serving.policy.sglang_backend import SGLangBackend
from tests.fixtures.fake_sglang import (
    EOS_ID,
    FakeSGLang,
    free_port,
    input_logprob,
    next_token,
    output_logprob,
)


def _expected_ids(last: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        last = next_token(last)
        out.append(last)
        if last == EOS_ID:
            break
    return out


@pytest.fixture
async def backend(fake_sglang: FakeSGLang, tiny_tokenizer_dir: Path):
    b = SGLangBackend(
        fake_sglang.url, model_name="fake", tokenizer_dir=tiny_tokenizer_dir, api_key="test-key"
    )
    await b.start()
    yield b
    await b.close()


async def test_generate_returns_exact_ids_logprobs_and_sampling_fields(
    backend: SGLangBackend, fake_sglang: FakeSGLang
):
    prompt = [1, 5, 6]
    gen = await backend.generate(prompt, SamplingParams(temperature=0.7, top_p=0.9, max_tokens=4, seed=11))
    assert gen.token_ids == _expected_ids(6, 4)
    assert gen.logprobs == [output_logprob(i) for i in range(4)]
    assert gen.finish_reason == "length"
    assert gen.policy_version == 0
    assert gen.prompt_token_ids == prompt
    sent = fake_sglang.generate_requests[-1]
    assert sent["input_ids"] == prompt and sent["return_logprob"] is True
    assert sent["sampling_params"] == {
        "temperature": 0.7,
        "top_p": 0.9,
        "max_new_tokens": 4,
        "stop": [],
        "sampling_seed": 11,
    }


async def test_stream_yields_tokens_then_generation(backend: SGLangBackend):
    stream = backend.generate_stream([1, 6], SamplingParams(max_tokens=5))
    steps = [step async for step in stream]
    gen = stream.generation
    assert [s.token_id for s in steps] == gen.token_ids == _expected_ids(6, 5)
    assert [s.logprob for s in steps] == gen.logprobs
    assert "".join(s.text for s in steps) == gen.text
    assert gen.finish_reason == "length"


async def test_stop_string_ends_with_stop_reason(backend: SGLangBackend):
    ids = _expected_ids(6, 6)
    stop_word = f"t{ids[2]}"
    stream = backend.generate_stream([1, 6], SamplingParams(max_tokens=20, stop=(stop_word,)))
    steps = [s async for s in stream]
    assert stream.generation.finish_reason == "stop"
    assert stop_word not in stream.generation.text
    assert "".join(s.text for s in steps) == stream.generation.text


async def test_score_returns_response_suffix_logprobs(backend: SGLangBackend, fake_sglang: FakeSGLang):
    prompt, response = [1, 5, 6, 7], [9, 10, 11]
    got = await backend.score(prompt, response, temperature=0.7)
    full = prompt + response
    assert got == [input_logprob(full[p - 1], full[p]) for p in range(len(prompt), len(full))]
    sent = fake_sglang.generate_requests[-1]
    assert sent["sampling_params"]["max_new_tokens"] == 0
    assert sent["sampling_params"]["temperature"] == 0.7
    assert sent["logprob_start_len"] == len(prompt) - 1


async def test_full_update_sends_version_and_never_aborts(backend: SGLangBackend, fake_sglang: FakeSGLang):
    await backend.load_checkpoint(Path("/ckpt/run/3"), 3, "full")
    name, body = fake_sglang.calls[-1]
    assert name == "update_weights_from_disk"
    assert body == {"model_path": "/ckpt/run/3", "weight_version": "3", "abort_all_requests": False}
    assert backend.policy_version == 3
    gen = await backend.generate([1, 5], SamplingParams(max_tokens=2))
    assert gen.policy_version == 3


async def test_lora_adapters_get_immutable_per_version_names(backend: SGLangBackend, fake_sglang: FakeSGLang):
    await backend.load_checkpoint(Path("/ckpt/run/1"), 1, "lora")
    await backend.load_checkpoint(Path("/ckpt/run/2"), 2, "lora")
    loads = [body for name, body in fake_sglang.calls if name == "load_lora_adapter"]
    assert loads == [
        {"lora_name": "v1", "lora_path": "/ckpt/run/1"},
        {"lora_name": "v2", "lora_path": "/ckpt/run/2"},
    ]
    await backend.generate([1, 5], SamplingParams(max_tokens=2))
    assert fake_sglang.generate_requests[-1]["lora_path"] == "v2"
    await backend.score([1, 5], [6], use_base=True)
    assert "lora_path" not in fake_sglang.generate_requests[-1]
    with pytest.raises(CheckpointError):
        await backend.load_checkpoint(Path("/ckpt/run/2b"), 2, "lora")
    assert backend.policy_version == 2


async def test_end_of_turn_token_is_kept_with_stop_reason(backend: SGLangBackend):
    gen = await backend.generate([1, 5], SamplingParams(max_tokens=10))
    assert gen.token_ids == _expected_ids(5, 10) and gen.token_ids[-1] == EOS_ID
    assert gen.finish_reason == "stop"


async def test_bad_request_is_a_policy_error(backend: SGLangBackend):
    with pytest.raises(PolicyError):
        await backend.generate([], SamplingParams(max_tokens=2))


async def test_server_down_is_service_unavailable_quickly(tiny_tokenizer_dir: Path):
    url = f"http://127.0.0.1:{free_port()}"
    b = SGLangBackend(url, model_name="fake", tokenizer_dir=tiny_tokenizer_dir, connect_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(ServiceUnavailable, match="127.0.0.1"):
        await b.start()
    assert time.monotonic() - started < 3.0
    await b.close()


async def test_wrong_api_key_is_refused(fake_sglang: FakeSGLang, tiny_tokenizer_dir: Path):
    b = SGLangBackend(fake_sglang.url, model_name="fake", tokenizer_dir=tiny_tokenizer_dir, api_key="wrong")
    with pytest.raises(PolicyError, match="401"):
        await b.start()
    await b.close()
