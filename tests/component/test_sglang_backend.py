"""SGLangBackend against a loopback fake SGLang server (tests/fixtures/fake_sglang.py)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from orl.schemas.errors import CheckpointError, ServiceUnavailable
from orl.serving.policy.base import PolicyError, SamplingParams
from orl.serving.policy.sglang_backend import SGLangBackend

from tests.fixtures.fake_sglang import (
    EOS_ID,
    FakeSGLang,
    folder_digest,
    free_port,
    input_logprob,
    input_top_logprobs,
    next_token,
    output_logprob,
    serve_in_thread,
    write_checkpoint_folder,
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


def _suffix_logprobs(prompt: list[int], response: list[int], temperature: float = 1.0) -> list[float]:
    full = prompt + response
    return [input_logprob(full[p - 1], full[p], temperature) for p in range(len(prompt), len(full))]


async def test_score_returns_response_suffix_logprobs(backend: SGLangBackend, fake_sglang: FakeSGLang):
    prompt, response = [1, 5, 6, 7], [9, 10, 11]
    assert await backend.score(prompt, response) == _suffix_logprobs(prompt, response)
    sent = fake_sglang.generate_requests[-1]
    assert sent["sampling_params"] == {"max_new_tokens": 0, "temperature": 1.0}
    assert sent["logprob_start_len"] == len(prompt) - 1
    assert "input_logprob_temperature" not in sent  # stock SGLang: nothing it does not know


async def test_score_at_a_temperature_is_refused_when_sglang_ignores_it(backend: SGLangBackend):
    # Stock SGLang computes input logprobs at T = 1 whatever sampling_params.temperature says: orl
    # must not record them as logprobs at T = 0.7.
    with pytest.raises(PolicyError, match="input_logprob_temperature"):
        await backend.score([1, 5, 6, 7], [9, 10, 11], temperature=0.7)


async def test_score_at_a_temperature_uses_input_logprob_temperature(
    backend: SGLangBackend, fake_sglang: FakeSGLang
):
    fake_sglang.supports_input_logprob_temperature = True
    prompt, response = [1, 5, 6, 7], [9, 10, 11]
    assert await backend.score(prompt, response, temperature=0.7) == _suffix_logprobs(prompt, response, 0.7)
    assert fake_sglang.generate_requests[-1]["input_logprob_temperature"] == 0.7
    assert await backend.score(prompt, response, temperature=0.0) == _suffix_logprobs(prompt, response)


async def test_score_top_k_sends_top_logprobs_num_and_reads_the_response_suffix(
    backend: SGLangBackend, fake_sglang: FakeSGLang
):
    fake_sglang.supports_input_logprob_temperature = True
    prompt, response = [1, 5, 6, 7], [9, 10, 11]
    scores = await backend.score_top_k(prompt, response, 0.7, 4)
    sent = fake_sglang.generate_requests[-1]
    assert sent["top_logprobs_num"] == 4 and sent["return_logprob"] is True
    assert sent["logprob_start_len"] == len(prompt) - 1
    assert scores.logprobs == _suffix_logprobs(prompt, response, 0.7)
    full = prompt + response
    expected = [input_top_logprobs(full[p - 1], 4, 0.7) for p in range(len(prompt), len(full))]
    assert scores.top_ids == [[token for _, token in row] for row in expected]
    assert scores.top_logprobs == [[lp for lp, _ in row] for row in expected]


@pytest.mark.parametrize("top_k", [0, 101])
async def test_score_top_k_out_of_range_is_refused_before_any_call(
    backend: SGLangBackend, fake_sglang: FakeSGLang, top_k: int
):
    with pytest.raises(PolicyError, match="top_k"):
        await backend.score_top_k([1, 5], [6], 1.0, top_k)
    assert fake_sglang.generate_requests == []


async def test_full_update_sends_version_and_never_aborts(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    folder = write_checkpoint_folder(tmp_path / "3", "full")
    await backend.load_checkpoint(folder, 3, "full")
    name, body = fake_sglang.calls[-1]
    assert name == "update_weights_from_disk"
    assert body == {"model_path": str(folder), "weight_version": "3", "abort_all_requests": False}
    assert fake_sglang.history[-1].folder == folder_digest(folder)
    assert backend.policy_version == 3
    gen = await backend.generate([1, 5], SamplingParams(max_tokens=2))
    assert gen.policy_version == 3


async def test_generation_held_during_a_full_update_reports_the_new_version(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    fake_sglang.update_delay_s = 0.5
    swap = asyncio.create_task(backend.load_checkpoint(write_checkpoint_folder(tmp_path, "full"), 1, "full"))
    await asyncio.sleep(0.2)  # the update is under way: SGLang holds new requests until it is done
    gen = await backend.generate([1, 5], SamplingParams(max_tokens=2))
    await swap
    assert gen.policy_version == 1  # SGLang's meta_info.weight_version, not the version at send time


async def test_lora_adapters_get_immutable_per_version_names(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    v1 = write_checkpoint_folder(tmp_path / "1", "lora")
    v2 = write_checkpoint_folder(tmp_path / "2", "lora")
    await backend.load_checkpoint(v1, 1, "lora")
    await backend.load_checkpoint(v2, 2, "lora")
    loads = [body for name, body in fake_sglang.calls if name == "load_lora_adapter"]
    assert [body["lora_path"] for body in loads] == [str(v1), str(v2)]
    names = [body["lora_name"] for body in loads]
    assert re.fullmatch(r"v1-[0-9a-f]+", names[0]) and names[1] == "v2-" + names[0].split("-")[1]
    gen = await backend.generate([1, 5], SamplingParams(max_tokens=2))
    assert fake_sglang.generate_requests[-1]["lora_path"] == names[1] and gen.policy_version == 2
    await backend.score([1, 5], [6], use_base=True)
    assert "lora_path" not in fake_sglang.generate_requests[-1]
    with pytest.raises(CheckpointError, match="immutable"):
        await backend.load_checkpoint(write_checkpoint_folder(tmp_path / "2b", "lora"), 2, "lora")
    assert backend.policy_version == 2


async def test_a_tenant_run_is_an_adapter_of_its_own_passed_with_its_requests(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    await backend.load_checkpoint(write_checkpoint_folder(tmp_path / "main-1", "lora"), 1, "lora")
    params = SamplingParams(max_tokens=2)
    before = await backend.generate([1, 5], params, "live.alice")  # alice has no version: the main policy's
    main_adapter = fake_sglang.generate_requests[-1]["lora_path"]
    assert (before.policy_run, before.policy_version) == ("", 1) and main_adapter.startswith("v1-")

    await backend.load_checkpoint(
        write_checkpoint_folder(tmp_path / "alice-3", "lora"), 3, "lora", "live.alice"
    )
    assert backend.version_of("live.alice") == 3 and backend.policy_version == 1
    alice = await backend.generate_stream([1, 5], params, "live.alice").result()
    alice_adapter = fake_sglang.generate_requests[-1]["lora_path"]
    assert re.fullmatch(r"live\.alice-v3-[0-9a-f]+", alice_adapter)
    assert (alice.policy_run, alice.policy_version) == ("live.alice", 3)
    main = await backend.generate([1, 5], params)
    assert fake_sglang.generate_requests[-1]["lora_path"] == main_adapter and main.policy_version == 1
    with pytest.raises(CheckpointError, match="LoRA adapter over the served base"):
        await backend.load_checkpoint(
            write_checkpoint_folder(tmp_path / "alice-4", "full"), 4, "full", "live.alice"
        )

    # a full update of the main policy changes the base every adapter was trained on: alice's goes too
    await backend.load_checkpoint(write_checkpoint_folder(tmp_path / "main-2", "full"), 2, "full")
    assert backend.version_of("live.alice") is None
    assert ("unload_lora_adapter", {"lora_name": alice_adapter}) in fake_sglang.calls
    after = await backend.generate([1, 5], params, "live.alice")
    assert (after.policy_run, after.policy_version) == ("", 2)
    assert "lora_path" not in fake_sglang.generate_requests[-1]


async def test_an_adapter_request_reports_the_adapter_version_not_the_base_weights(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    await backend.load_checkpoint(write_checkpoint_folder(tmp_path / "1", "full"), 1, "full")
    await backend.load_checkpoint(write_checkpoint_folder(tmp_path / "2", "lora"), 2, "lora")
    assert fake_sglang.weight_version == "1"  # loading an adapter does not change SGLang's weight version
    assert (await backend.generate([1, 5], SamplingParams(max_tokens=2))).policy_version == 2
    stream = backend.generate_stream([1, 5], SamplingParams(max_tokens=2))
    assert (await stream.result()).policy_version == 2


async def test_a_second_backend_on_the_same_server_loads_its_own_adapter(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tiny_tokenizer_dir: Path, tmp_path: Path
):
    # A restarted orl server (SGLang still running, still holding the old process's adapters) or a
    # second replica must not be refused because an adapter called "v1" is already loaded.
    v1 = write_checkpoint_folder(tmp_path / "1", "lora")
    await backend.load_checkpoint(v1, 1, "lora")
    other = SGLangBackend(
        fake_sglang.url, model_name="fake", tokenizer_dir=tiny_tokenizer_dir, api_key="test-key"
    )
    await other.start()
    await other.load_checkpoint(v1, 1, "lora")
    await other.close()
    assert len(fake_sglang.loras) == 2 and other.policy_version == 1


async def test_rollback_to_an_adapter_serves_it_again(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    v1 = write_checkpoint_folder(tmp_path / "1", "lora")
    await backend.load_checkpoint(v1, 1, "lora")
    await backend.load_checkpoint(write_checkpoint_folder(tmp_path / "2", "lora"), 2, "lora")
    await backend.load_checkpoint(v1, 1, "lora")  # what /admin/rollback asks for
    gen = await backend.generate([1, 5], SamplingParams(max_tokens=2))
    assert gen.policy_version == 1 and fake_sglang.generate_requests[-1]["lora_path"].startswith("v1-")


async def test_old_adapters_are_unloaded_best_effort(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    for version in (1, 2, 3):
        await backend.load_checkpoint(
            write_checkpoint_folder(tmp_path / str(version), "lora"), version, "lora"
        )
    oldest = next(name for name in fake_sglang.loras if name.startswith("v1-"))
    del fake_sglang.loras[oldest]  # SGLang dropped it on its own (LRU eviction, --max-loaded-loras)
    await backend.load_checkpoint(write_checkpoint_folder(tmp_path / "4", "lora"), 4, "lora")
    assert backend.policy_version == 4
    assert sorted(name.split("-")[0] for name in fake_sglang.loras) == ["v2", "v3", "v4"]
    assert ("unload_lora_adapter", {"lora_name": oldest}) in fake_sglang.calls


async def test_a_missing_checkpoint_folder_is_a_checkpoint_error(backend: SGLangBackend, tmp_path: Path):
    with pytest.raises(CheckpointError, match="400"):
        await backend.load_checkpoint(tmp_path / "absent", 1, "lora")
    assert backend.policy_version == 0


async def test_an_unreachable_server_during_a_swap_is_service_unavailable_not_a_refusal(
    tiny_tokenizer_dir: Path, tmp_path: Path
):
    fake = FakeSGLang()
    port = free_port()
    server, thread = serve_in_thread(fake.app(), port)
    b = SGLangBackend(f"http://127.0.0.1:{port}", model_name="fake", tokenizer_dir=tiny_tokenizer_dir)
    await b.start()
    server.should_exit = True
    thread.join(timeout=10)
    with pytest.raises(ServiceUnavailable, match="unreachable"):  # the follower retries the swap later
        await b.load_checkpoint(write_checkpoint_folder(tmp_path, "lora"), 1, "lora")
    assert b.policy_version == 0
    await b.close()


async def test_an_error_inside_the_stream_is_a_policy_error(
    backend: SGLangBackend, fake_sglang: FakeSGLang, tmp_path: Path
):
    await backend.load_checkpoint(write_checkpoint_folder(tmp_path, "lora"), 1, "lora")
    fake_sglang.loras.clear()  # SGLang restarted: the adapter is gone
    with pytest.raises(PolicyError, match="not loaded"):
        await backend.generate_stream([1, 5], SamplingParams(max_tokens=2)).result()


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
