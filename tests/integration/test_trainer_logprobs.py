"""orl.trainer.logprobs and orl.trainer.policy_model on the real SmolLM2-135M model (CPU, fp32 weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from orl.connectors.model_files import prepare_base_model
from orl.trainer.logprobs import (
    LogprobInputError,
    collate_optional,
    collate_samples,
    pad_right,
    response_logprobs,
)
from orl.trainer.losses import total_loss
from orl.trainer.policy_model import LoraSettings, PolicyModel, default_lr, load_policy
from safetensors.torch import load_file

from tests.fixtures.model import test_cache_dir as model_cache_dir

pytestmark = [pytest.mark.model, pytest.mark.slow]


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest) -> Path:
    """The shared `base_model_dir` fixture (tests/fixtures/model.py); the same folder if not registered."""
    try:
        return Path(request.getfixturevalue("base_model_dir"))
    except pytest.FixtureLookupError:
        return prepare_base_model(model_cache_dir())


@pytest.fixture(scope="module")
def lora_policy(model_dir: Path) -> PolicyModel:
    return load_policy(model_dir, "lora", lora=LoraSettings(r=4, alpha=8))


@pytest.fixture(scope="module")
def samples(model_dir: Path) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of different lengths and responses given as raw ids (never re-tokenised)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    questions = ["What is 2 + 2?", "Explain photosynthesis for my biology homework, briefly please.", "Hi"]
    prompts: list[list[int]] = []
    for question in questions:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        prompts.append(list(tokenizer.encode(str(text), add_special_tokens=False)))
    responses: list[list[int]] = [
        tokenizer.encode("2 + 2 is 4.", add_special_tokens=False) + [2],
        tokenizer.encode("Plants turn light, water and CO2 into sugar and oxygen.", add_special_tokens=False),
        [28, 9, 1500, 2],  # arbitrary ids: a sequence no tokenizer round trip would produce
    ]
    return prompts, responses


def _manual_logprobs(
    model: torch.nn.Module, prompt: list[int], response: list[int], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0].float()
    scaled = logits[len(prompt) - 1 : len(prompt) + len(response) - 1] / temperature
    return torch.log_softmax(scaled, -1)[torch.arange(len(response)), torch.tensor(response)]


def test_batched_equals_one_by_one(lora_policy: PolicyModel, samples: tuple) -> None:
    prompts, responses = samples
    temps = [0.7, 1.0, 0.6]
    with torch.no_grad():
        # fp32: equal up to float noise. bf16 autocast: padding changes the kernels' accumulation
        # order, which moves single tokens by up to ~0.2 nats (mean ~0.03), as the prototype saw.
        for autocast, atol, rtol, mean_tol in [(False, 1e-4, 0.0, 1e-5), (True, 0.1, 0.1, 0.03)]:
            batched = response_logprobs(lora_policy.module, prompts, responses, temps, autocast=autocast)
            for i in range(len(prompts)):
                single = response_logprobs(
                    lora_policy.module, [prompts[i]], [responses[i]], [temps[i]], autocast
                )[0]
                assert batched[i].shape == (len(responses[i]),)
                assert batched[i].dtype == torch.float32
                assert torch.allclose(batched[i], single, atol=atol, rtol=rtol), (autocast, i)
                relative_error = (batched[i] - single).abs() / (1.0 + single.abs())
                assert float(relative_error.mean()) < mean_tol, (autocast, i)
                assert (batched[i] <= 0).all()


def test_temperature_scaling_matches_manual(lora_policy: PolicyModel, samples: tuple) -> None:
    prompts, responses = samples
    with torch.no_grad():
        for temperature in (0.3, 0.7, 1.0, 1.5):
            got = response_logprobs(lora_policy.module, prompts[:2], responses[:2], [temperature, 1.0], False)
            expected = _manual_logprobs(lora_policy.module, prompts[0], responses[0], temperature)
            assert torch.allclose(got[0], expected, atol=1e-4)
        greedy = response_logprobs(lora_policy.module, prompts[:1], responses[:1], [0.0], False)[0]
        assert torch.allclose(
            greedy, _manual_logprobs(lora_policy.module, prompts[0], responses[0], 1.0), atol=1e-4
        )
        cold = response_logprobs(lora_policy.module, prompts[:1], responses[:1], [0.3], False)[0]
        assert not torch.allclose(cold, greedy, atol=1e-3)  # the temperature really is applied


def test_gradient_follows_the_callers_context(lora_policy: PolicyModel, samples: tuple) -> None:
    prompts, responses = samples
    with_grad = response_logprobs(lora_policy.module, prompts[:1], responses[:1], [1.0])
    assert with_grad[0].requires_grad
    with torch.no_grad():
        assert not response_logprobs(lora_policy.module, prompts[:1], responses[:1], [1.0])[0].requires_grad


def test_bad_inputs_raise_orl_errors(lora_policy: PolicyModel) -> None:
    with pytest.raises(LogprobInputError, match="one of each"):
        response_logprobs(lora_policy.module, [[1, 2]], [[3]], [1.0, 1.0])
    with pytest.raises(LogprobInputError, match="empty prompt"):
        response_logprobs(lora_policy.module, [[]], [[3]], [1.0])
    assert response_logprobs(lora_policy.module, [], [], []) == []


def test_collate_helpers() -> None:
    values, mask = pad_right([torch.tensor([-1.0, -2.0]), [-3.0]])
    assert values.tolist() == [[-1.0, -2.0], [-3.0, 0.0]]
    assert mask.tolist() == [[True, True], [True, False]]
    teacher, present = collate_optional([[-0.5, -0.25], None], width=2)
    assert teacher.tolist() == [[-0.5, -0.25], [0.0, 0.0]]
    assert present.tolist() == [True, False]
    batch = collate_samples([[5, 6, 7], [8]], [[-1.0, -2.0, -3.0], [-4.0]], [None, [-0.5]], [1.0, None])
    assert batch.mask_B_T.tolist() == [[True, True, True], [True, False, False]]
    assert batch.rollout_logprobs_B_T.tolist() == [[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]]
    assert batch.teacher_logprobs_B_T.tolist() == [[0.0, 0.0, 0.0], [-0.5, 0.0, 0.0]]
    assert (batch.has_teacher_B.tolist(), batch.has_reward_B.tolist()) == ([False, True], [True, False])
    assert batch.rewards_B.tolist() == [1.0, 0.0]
    with pytest.raises(LogprobInputError, match="2 teacher logprobs for 3 response tokens"):
        collate_samples([[5, 6, 7]], [[-1.0, -2.0, -3.0]], [[-0.1, -0.2]], [None])


def test_lora_reference_is_the_base_and_training_moves_the_policy(
    lora_policy: PolicyModel, samples: tuple
) -> None:
    """Zero-initialised adapter: policy == reference; one optimizer step on +1 rewards raises the logprobs."""
    prompts, responses = samples
    temps = [1.0] * len(prompts)
    with lora_policy.reference() as ref_model:
        ref_B_T, mask_B_T = pad_right(response_logprobs(ref_model, prompts, responses, temps, False))
    assert lora_policy.module.training  # the reference context restores the mode
    params = lora_policy.trainable_parameters()
    optimizer = torch.optim.AdamW(params, lr=default_lr("lora"), weight_decay=0.0)
    lp_B_T, _ = pad_right(response_logprobs(lora_policy.module, prompts, responses, temps, False))
    assert torch.allclose(lp_B_T, ref_B_T, atol=1e-4)
    loss, stats = total_loss(lp_B_T, lp_B_T.detach(), mask_B_T.float(), mask_B_T, ref_B_T)
    assert stats.kl == pytest.approx(0.0, abs=1e-4)
    assert stats.clip_fraction == 0.0
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        after_B_T, _ = pad_right(response_logprobs(lora_policy.module, prompts, responses, temps, False))
        with lora_policy.reference() as ref_model:
            ref_after_B_T, _ = pad_right(response_logprobs(ref_model, prompts, responses, temps, False))
    assert after_B_T[mask_B_T].mean() > lp_B_T.detach()[mask_B_T].mean()
    assert torch.allclose(ref_after_B_T, ref_B_T, atol=1e-5)  # the reference did not move


def test_lora_save_and_resume(
    lora_policy: PolicyModel, model_dir: Path, samples: tuple, tmp_path: Path
) -> None:
    prompts, responses = samples
    files = lora_policy.save(tmp_path / "adapter")
    assert sorted(p.name for p in files) == ["adapter_config.json", "adapter_model.safetensors"]
    weights = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert any("lora_A" in name for name in weights) and any("down_proj" in name for name in weights)
    resumed = load_policy(model_dir, "lora", init_dir=tmp_path / "adapter")
    with torch.no_grad():
        want = response_logprobs(lora_policy.module, prompts, responses, [1.0] * 3, False)
        got = response_logprobs(resumed.module, prompts, responses, [1.0] * 3, False)
    for a, b in zip(want, got, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert resumed.trainable_parameters()


def test_full_policy_saves_a_loadable_model_folder(model_dir: Path, samples: tuple, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts, responses = samples
    policy = load_policy(model_dir, "full")
    assert default_lr("full") == 1e-5
    assert len(policy.trainable_parameters()) == len(list(policy.module.parameters()))
    with torch.no_grad(), policy.reference() as ref_model:
        assert not any(p.requires_grad for p in ref_model.parameters())
        assert ref_model is not policy.module
    with torch.no_grad():
        for p in policy.trainable_parameters()[:3]:
            p.add_(0.01)  # a stand-in for an optimizer step
    out = tmp_path / "full"
    names = {p.name for p in policy.save(out)}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    assert (out / "chat_template.jinja").exists() == (model_dir / "chat_template.jinja").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        want = response_logprobs(policy.module, prompts[:1], responses[:1], [1.0], False)[0]
        got = response_logprobs(reloaded, prompts[:1], responses[:1], [1.0], False)[0]
        with policy.reference() as ref_model:
            base = response_logprobs(ref_model, prompts[:1], responses[:1], [1.0], False)[0]
    assert torch.allclose(want, got, atol=1e-5)
    assert not torch.allclose(want, base, atol=1e-4)
