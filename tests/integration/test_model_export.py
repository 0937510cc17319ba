"""`orl model export` on the real model and object store: a published version leaves orl as a model.

The base model (version 0) exported as GGUF must be the shipped GGUF without its quantization: the
same hyperparameters, vocabulary, merges, special tokens and chat template, and every tensor equal
to the shipped one dequantized. That pins the tensor names and the rotary row order to what
llama.cpp's own converter wrote. A published LoRA version (an adapter on every linear layer, with
random weights) exported as a Hugging Face folder must give exactly the logits of the policy the
server builds from that checkpoint, and exported as GGUF, read back by transformers' GGUF loader (an
independent reader that undoes the row order), the same logits again.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from orl.connectors.checkpoint_store import publish_checkpoint
from orl.connectors.model_files import checkpoint_model, find_smollm2_gguf
from orl.connectors.object_store.local_store import LocalObjectStore
from transformers import AutoModelForCausalLM, AutoTokenizer

from orl.cli import main
from tests.fixtures.model import test_cache_dir

pytestmark = [pytest.mark.model]

# the shipped file's provenance and quantization, which an fp32 export does not repeat
NOT_COMPARED = {"general.file_type", "general.quantization_version", "tokenizer.ggml.add_space_prefix"}
PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def export(tmp_path: Path, *args: str) -> int:
    where = ["--data-dir", str(tmp_path / "data"), "--model-cache-dir", str(test_cache_dir())]
    return main(["model", "export", *where, *args])


def fields(reader: gguf.GGUFReader) -> dict[str, object]:
    return {
        name: field.contents()
        for name, field in reader.fields.items()
        if not name.startswith(("GGUF.", "general.")) or name == "general.architecture"
    }


def logits(model: torch.nn.Module, tokenizer_dir: Path) -> torch.Tensor:
    ids = AutoTokenizer.from_pretrained(tokenizer_dir)(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(ids).logits[0]


def test_the_base_model_exported_as_gguf_is_the_shipped_gguf_without_its_quantization(
    tmp_path: Path, base_model_dir: Path
) -> None:
    out = tmp_path / "base.gguf"
    assert export(tmp_path, "--version", "0", "--format", "gguf", "--out", str(out)) == 0
    shipped, exported = gguf.GGUFReader(find_smollm2_gguf()), gguf.GGUFReader(out)
    expected = {k: v for k, v in fields(shipped).items() if k not in NOT_COMPARED}
    assert {k: v for k, v in fields(exported).items() if k not in NOT_COMPARED} == expected
    assert exported.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    ours = {t.name: t for t in exported.tensors}
    assert sorted(ours) == sorted(t.name for t in shipped.tensors)
    for tensor in shipped.tensors:
        assert list(ours[tensor.name].shape) == list(tensor.shape), tensor.name
        dequantized = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1)
        assert np.array_equal(np.asarray(ours[tensor.name].data).reshape(-1), dequantized), tensor.name


def publish_lora_version(tmp_path: Path, base_model_dir: Path) -> Path:
    """v1 of run "live": a LoRA adapter on every linear layer with random weights, as the trainer publishes one."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    model = get_peft_model(base, config)
    with torch.no_grad():  # small enough that the model still answers in words
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.mul_(0.05)
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    publish_checkpoint(
        LocalObjectStore(tmp_path / "data" / "objects"), "live", 1, adapter, parent_version=0, kind="lora",
        base_model="smollm2-135m", consumed_offsets=[], sample_ids=[], metrics={},
    )  # fmt: skip
    return adapter


def test_a_lora_version_exports_as_the_policy_the_server_builds_in_both_formats(
    tmp_path: Path, base_model_dir: Path
) -> None:
    adapter = publish_lora_version(tmp_path, base_model_dir)
    base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32).eval()
    base_logits = logits(base, base_model_dir)
    served = logits(checkpoint_model(base, adapter, "lora"), base_model_dir)
    assert not torch.allclose(served, base_logits, atol=1e-2)  # the adapter changes the model

    assert export(tmp_path, "--format", "hf") == 0  # default: the newest published version, v1
    folder = tmp_path / "data" / "exports" / "live-v1"
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= {
        p.name for p in folder.iterdir()
    }
    exported = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert torch.equal(logits(exported, folder), served)

    assert export(tmp_path, "--version", "1", "--format", "gguf") == 0
    out = tmp_path / "data" / "exports" / "live-v1.gguf"
    read_back = AutoModelForCausalLM.from_pretrained(out.parent, gguf_file=out.name, dtype=torch.float32)
    torch.testing.assert_close(logits(read_back.eval(), folder), served, rtol=0, atol=1e-4)


def test_export_refuses_a_version_that_was_never_published_and_an_existing_output(
    tmp_path: Path, base_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert export(tmp_path, "--version", "3") == 1
    assert "run 'live' has no published version 3 (none is published yet)" in capsys.readouterr().err
    (tmp_path / "taken").mkdir()
    assert export(tmp_path, "--version", "0", "--out", str(tmp_path / "taken")) == 1
    assert f"{tmp_path / 'taken'} exists; remove it or choose another --out" in capsys.readouterr().err


QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "Write one sentence about the sea.",
    "How do I convert 3/4 to a percentage?",
    "Why do leaves change colour in autumn?",
    "Give me a tip for learning to cook.",
]
MAX_TOKENS = 32


async def orl_greedy(base_model_dir: Path, adapter: Path) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy answer ids) of each question, from orl's server backend serving v1 in fp32."""
    from orl.serving.policy.base import SamplingParams
    from orl.serving.policy.transformers_backend import TransformersBackend

    backend = TransformersBackend(base_model_dir, autocast_dtype=None)
    await backend.start()
    try:
        await backend.load_checkpoint(adapter, 1, "lora")
        answers = []
        for question in QUESTIONS:
            prompt = backend.chat_template.render([{"role": "user", "content": question}])
            generation = await backend.generate(
                prompt, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
            )
            answers.append((prompt, generation.token_ids))
        return answers
    finally:
        await backend.close()


async def test_llama_cpp_answers_an_exported_gguf_with_orls_greedy_tokens(
    tmp_path: Path, base_model_dir: Path
) -> None:
    import llama_cpp  # built from source by scripts/install.sh --dev

    adapter = publish_lora_version(tmp_path, base_model_dir)
    assert export(tmp_path, "--format", "gguf") == 0
    llm = llama_cpp.Llama(
        model_path=str(tmp_path / "data" / "exports" / "live-v1.gguf"), n_ctx=512, n_threads=2, verbose=False
    )
    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    for prompt, answer in await orl_greedy(base_model_dir, adapter):
        text = tokenizer.decode(prompt)
        assert llm.tokenize(text.encode(), add_bos=False, special=True) == prompt  # the same tokenizer
        theirs: list[int] = []
        for token in llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True):
            theirs.append(token)
            if token == llm.token_eos() or len(theirs) == MAX_TOKENS:
                break
        assert theirs == answer, (text, tokenizer.decode(theirs), tokenizer.decode(answer))
