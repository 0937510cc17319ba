"""Write a Hugging Face llama-architecture model folder as one GGUF file that llama.cpp and Ollama load.

Reads the folder's config.json, model.safetensors (or its sharded index), tokenizer.json,
tokenizer_config.json and chat template; writes `<out>` (under a temporary name first, renamed when
complete). The `gguf` package (llama.cpp's own) does the file format; this module maps the model onto
it: the hyperparameters, the byte-level BPE vocabulary, and each tensor under its GGUF name. Two
facts of the format matter: llama.cpp's rotary embedding pairs neighbouring rows of the query and key
projections where transformers pairs row i with row i + head_dim/2, so those two weights are
reordered per head (`rope_rows_for_gguf`); and a tied output head is not written (llama.cpp reuses
the token embedding). Norms stay F32 in either tensor type, as llama.cpp's converter writes them.

Only what orl can check is supported: `LlamaForCausalLM` (SmolLM2, Llama) with default rotary
embeddings and a byte-level BPE tokenizer; anything else is refused with a ConfigError.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
from orl.connectors.model_files import find_smollm2_gguf
from orl.schemas.errors import ConfigError

log = logging.getLogger(__name__)

TensorType = Literal["f32", "f16"]
_ARCHITECTURE = "LlamaForCausalLM"


def shipped_pre_tokenizer() -> str:
    """llama.cpp's name for the shipped SmolLM2's pre-tokenizer, as its GGUF records it ("smollm")."""
    import gguf

    field = gguf.GGUFReader(find_smollm2_gguf()).fields["tokenizer.ggml.pre"]
    return str(field.contents())


def rope_rows_for_gguf(weight: np.ndarray, heads: int) -> np.ndarray:
    """A query or key projection's rows (heads x head_dim, in transformers' rotate-half order) in the
    order llama.cpp's rotary embedding reads: within each head, rows i and i + head_dim/2 side by side."""
    rows = weight.shape[0]
    halves = weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
    return halves.swapaxes(1, 2).reshape(weight.shape)


def write_gguf(
    model_dir: Path, out: Path, *, pre_tokenizer: str, tensor_type: TensorType = "f32", name: str = ""
) -> Path:
    """Write the model in `model_dir` as the GGUF file `out` and return it. `pre_tokenizer` is
    llama.cpp's name for the tokenizer's pre-tokenizer (tokenizer.ggml.pre, e.g. "smollm")."""
    import gguf

    config = _llama_config(model_dir)
    tokens, token_types = _vocabulary(model_dir, int(config["vocab_size"]))
    tmp = out.with_name(f".{out.name}.partial")
    writer = gguf.GGUFWriter(str(tmp), "llama")
    try:
        _add_hyperparameters(writer, config, name or model_dir.name, tensor_type)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre_tokenizer)
        writer.add_token_list(tokens)
        writer.add_token_types(token_types)
        special = gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=len(tokens))
        special.add_special_token["bos"] = _tokenizer_adds_bos(model_dir)
        special.add_to_gguf(writer, quiet=True)
        count = 0
        for gguf_name, array in _gguf_tensors(model_dir, config, tensor_type):
            writer.add_tensor(gguf_name, array)
            count += 1
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, out)
    log.info("wrote %s: %d tensors, %s", out, count, tensor_type)
    return out


def _llama_config(model_dir: Path) -> dict[str, Any]:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    config: dict[str, Any] = json.loads(config_path.read_text())
    if config.get("architectures") != [_ARCHITECTURE]:
        raise ConfigError(
            f"GGUF export supports {_ARCHITECTURE} models (SmolLM2, Llama), not {config.get('architectures')}; "
            "export --format hf and convert that folder with llama.cpp's convert_hf_to_gguf.py"
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise ConfigError(f"GGUF export supports default rotary embeddings, not {rope.get('rope_type')!r}")
    return config


def _add_hyperparameters(writer: Any, config: dict[str, Any], name: str, tensor_type: TensorType) -> None:
    import gguf

    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    rope = config.get("rope_parameters") or {}
    writer.add_name(name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(hidden)
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    writer.add_vocab_size(int(config["vocab_size"]))
    if head_dim != hidden // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    file_type = gguf.LlamaFileType.ALL_F32 if tensor_type == "f32" else gguf.LlamaFileType.MOSTLY_F16
    writer.add_file_type(file_type)


def _vocabulary(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """Every token's text by id and its GGUF type (control for special added tokens, user-defined for
    other added tokens and padding up to the model's vocabulary size, normal otherwise)."""
    import gguf

    tokenizer_path = model_dir / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise ConfigError(f"{model_dir} has no tokenizer.json (GGUF export needs the fast tokenizer's file)")
    tokenizer = json.loads(tokenizer_path.read_text())
    model = tokenizer["model"]
    byte_level = tokenizer.get("pre_tokenizer") or {}
    if model.get("type") != "BPE" or byte_level.get("type") != "ByteLevel":
        raise ConfigError(f"GGUF export supports byte-level BPE tokenizers; {tokenizer_path} is not one")
    by_id: dict[int, tuple[str, int]] = {
        i: (text, gguf.TokenType.NORMAL) for text, i in model["vocab"].items()
    }
    for added in tokenizer.get("added_tokens", []):
        kind = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        by_id[int(added["id"])] = (added["content"], kind)
    if max(by_id) >= vocab_size:
        raise ConfigError(
            f"{tokenizer_path} has token id {max(by_id)}, beyond the model's {vocab_size} tokens"
        )
    tokens, types = [], []
    for i in range(vocab_size):
        text, token_type = by_id.get(i, (f"[PAD{i}]", gguf.TokenType.USER_DEFINED))
        tokens.append(text)
        types.append(int(token_type))
    return tokens, types


def _tokenizer_adds_bos(model_dir: Path) -> bool:
    """Whether the folder's tokenizer starts an encoded text with its BOS token (llama.cpp must do the same)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ids = tokenizer("a")["input_ids"]
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def _gguf_tensors(
    model_dir: Path, config: dict[str, Any], tensor_type: TensorType
) -> Iterator[tuple[str, np.ndarray]]:
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, int(config["num_hidden_layers"]))
    heads, kv_heads = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    for hf_name, tensor in _safetensors(model_dir):
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ConfigError(f"{model_dir}: no GGUF name for tensor {hf_name!r}")
        array = tensor.float().numpy()
        if hf_name.endswith("self_attn.q_proj.weight"):
            array = rope_rows_for_gguf(array, heads)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            array = rope_rows_for_gguf(array, kv_heads)
        if tensor_type == "f16" and array.ndim > 1:
            array = array.astype(np.float16)
        yield gguf_name, np.ascontiguousarray(array)


def _safetensors(model_dir: Path) -> Iterator[tuple[str, Any]]:
    """(name, torch tensor) of every weight, from model.safetensors or the shards its index lists."""
    from safetensors import safe_open

    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (model_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ConfigError(f"{model_dir} has no model.safetensors")
    for file in files:
        with safe_open(str(model_dir / file), framework="pt") as weights:
            for hf_name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
                yield hf_name, weights.get_tensor(hf_name)
