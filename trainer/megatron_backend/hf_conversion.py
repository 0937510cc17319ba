"""Pure weight mapping between Hugging Face Llama checkpoints and megatron-core's GPTModel, per TP rank.

`LlamaArch` reads the architecture from a Hugging Face `config.json` dict and refuses what this
mapping does not cover. `hf_to_megatron_shard` turns full HF tensors into one tensor-parallel rank's
GPTModel state dict; `megatron_to_hf` merges every rank's state dict back into full HF tensors (what
`PolicyModel.save` writes for a full checkpoint, so serving loads either backend's output alike).

| Hugging Face (LlamaForCausalLM)            | megatron (GPTModel, local layer spec)        | split over TP ranks |
| ------------------------------------------ | -------------------------------------------- | ------------------- |
| model.embed_tokens.weight [V, h]           | embedding.word_embeddings.weight             | rows (vocab)        |
| layers.i.input_layernorm.weight            | decoder.layers.i.input_layernorm.weight      | replicated          |
| layers.i.self_attn.{q,k,v}_proj.weight     | decoder.layers.i.self_attention.linear_qkv   | query groups        |
| layers.i.self_attn.o_proj.weight [h, n*d]  | decoder.layers.i.self_attention.linear_proj  | columns             |
| layers.i.post_attention_layernorm.weight   | decoder.layers.i.pre_mlp_layernorm.weight    | replicated          |
| layers.i.mlp.{gate,up}_proj.weight [f, h]  | decoder.layers.i.mlp.linear_fc1.weight       | rows                |
| layers.i.mlp.down_proj.weight [h, f]       | decoder.layers.i.mlp.linear_fc2.weight       | columns             |
| model.norm.weight                          | decoder.final_layernorm.weight               | replicated          |
| lm_head.weight [V, h] (untied models only) | output_layer.weight                          | rows (vocab)        |

Fusions: megatron's `linear_qkv` rows are grouped per KV head, `[q heads of group g, k_g, v_g]` for
each group g, and a rank holds a contiguous run of groups; `linear_fc1` holds the rank's gate rows
followed by its up rows (megatron's gated linear unit splits its output in two halves). No q/k row
permutation is needed: HF Llama checkpoints already use the rotate-half RoPE layout that megatron's
non-interleaved rotary embedding applies. Every output tensor owns its storage (safetensors refuses
tensors that share memory). No I/O, no torch.distributed; reads and writes no topics or object keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from orl.schemas.errors import OrlError
from torch import Tensor

_HF = "model.layers.{i}."
_MG = "decoder.layers.{i}."
EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT_LAYER = "output_layer.weight"
FINAL_NORM = "decoder.final_layernorm.weight"


class MegatronBackendError(OrlError):
    """Root of the megatron trainer backend's errors."""


class UnsupportedModelError(MegatronBackendError):
    """The Hugging Face model, or the tensor-parallel size asked for, is outside what the backend maps."""


@dataclass(frozen=True)
class LlamaArch:
    """What the weight mapping and megatron's TransformerConfig need from a Llama `config.json`."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> LlamaArch:
        """Read a Llama config dict; UnsupportedModelError names the first feature not covered."""
        _check_supported(config)
        heads = int(config["num_attention_heads"])
        return cls(
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=int(config["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            ffn_hidden_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(config),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
        )

    def check_tensor_parallel(self, tp_size: int) -> None:
        """UnsupportedModelError unless every split dimension divides evenly over `tp_size` ranks."""
        splits = {
            "attention heads": self.num_heads,
            "key/value heads": self.num_kv_heads,
            "vocabulary": self.vocab_size,
            "intermediate size": self.ffn_hidden_size,
        }
        bad = {name: n for name, n in splits.items() if tp_size < 1 or n % tp_size}
        if bad:
            detail = ", ".join(f"{name} {n}" for name, n in bad.items())
            raise UnsupportedModelError(
                f"tensor parallel size {tp_size} does not divide the model's {detail} "
                f"(pick a size that divides {self.num_heads} heads and {self.num_kv_heads} KV heads)"
            )


def _check_supported(config: Mapping[str, Any]) -> None:
    problems = [
        (config.get("model_type") != "llama", f"model_type {config.get('model_type')!r} (llama only)"),
        (bool(config.get("attention_bias")), "attention biases"),
        (bool(config.get("mlp_bias")), "MLP biases"),
        (config.get("hidden_act", "silu") != "silu", f"activation {config.get('hidden_act')!r}"),
        (_rope_type(config) != "default", f"RoPE scaling {_rope_type(config)!r}"),
    ]
    unsupported = [what for bad, what in problems if bad]
    if unsupported:
        raise UnsupportedModelError(f"the megatron backend cannot map this model: {'; '.join(unsupported)}")


def _rope_parameters(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """transformers >= 5 nests RoPE settings in `rope_parameters`; older configs use `rope_scaling`."""
    nested = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return nested if isinstance(nested, Mapping) else {}


def _rope_type(config: Mapping[str, Any]) -> str:
    params = _rope_parameters(config)
    return str(params.get("rope_type") or params.get("type") or "default")


def _rope_theta(config: Mapping[str, Any]) -> float:
    return float(_rope_parameters(config).get("rope_theta") or config.get("rope_theta") or 10000.0)


def _chunk(tensor: Tensor, dim: int, rank: int, tp_size: int) -> Tensor:
    return tensor.chunk(tp_size, dim=dim)[rank].clone()


def fuse_qkv(q: Tensor, k: Tensor, v: Tensor, arch: LlamaArch, rank: int, tp_size: int) -> Tensor:
    """HF q/k/v projections -> this rank's megatron `linear_qkv` rows, grouped `[q heads, k, v]` per group."""
    hidden = q.shape[1]
    per_group = arch.num_heads // arch.num_kv_heads
    groups = arch.num_kv_heads
    q_G = q.reshape(groups, per_group * arch.head_dim, hidden)
    k_G = k.reshape(groups, arch.head_dim, hidden)
    v_G = v.reshape(groups, arch.head_dim, hidden)
    fused = torch.cat([q_G, k_G, v_G], dim=1)
    return fused.chunk(tp_size, dim=0)[rank].reshape(-1, hidden).clone()


def split_qkv(shards: Sequence[Tensor], arch: LlamaArch) -> tuple[Tensor, Tensor, Tensor]:
    """Every rank's `linear_qkv` rows (rank order) -> the full HF q, k, v projections."""
    hidden = shards[0].shape[1]
    per_group = arch.num_heads // arch.num_kv_heads
    rows_per_group = (per_group + 2) * arch.head_dim
    fused = torch.cat([s.reshape(-1, rows_per_group, hidden) for s in shards], dim=0)
    q, k, v = fused.split([per_group * arch.head_dim, arch.head_dim, arch.head_dim], dim=1)
    return (
        q.reshape(-1, hidden).clone(),
        k.reshape(-1, hidden).clone(),
        v.reshape(-1, hidden).clone(),
    )


def _layer_shard(hf: Mapping[str, Tensor], arch: LlamaArch, i: int, rank: int, tp: int) -> dict[str, Tensor]:
    src, dst = _HF.format(i=i), _MG.format(i=i)
    attn, mlp = src + "self_attn.", src + "mlp."
    gate = _chunk(hf[mlp + "gate_proj.weight"], 0, rank, tp)
    up = _chunk(hf[mlp + "up_proj.weight"], 0, rank, tp)
    return {
        dst + "input_layernorm.weight": hf[src + "input_layernorm.weight"].clone(),
        dst + "self_attention.linear_qkv.weight": fuse_qkv(
            hf[attn + "q_proj.weight"], hf[attn + "k_proj.weight"], hf[attn + "v_proj.weight"], arch, rank, tp
        ),
        dst + "self_attention.linear_proj.weight": _chunk(hf[attn + "o_proj.weight"], 1, rank, tp),
        dst + "pre_mlp_layernorm.weight": hf[src + "post_attention_layernorm.weight"].clone(),
        dst + "mlp.linear_fc1.weight": torch.cat([gate, up], dim=0),
        dst + "mlp.linear_fc2.weight": _chunk(hf[mlp + "down_proj.weight"], 1, rank, tp),
    }


def hf_to_megatron_shard(
    hf: Mapping[str, Tensor], arch: LlamaArch, rank: int, tp_size: int
) -> dict[str, Tensor]:
    """Full HF tensors -> the GPTModel state dict of tensor-parallel rank `rank` (of `tp_size`).

    Reads only the HF names it needs, so `hf` may be a lazy mapping over safetensors files.
    """
    arch.check_tensor_parallel(tp_size)
    shard = {EMBEDDING: _chunk(hf["model.embed_tokens.weight"], 0, rank, tp_size)}
    for i in range(arch.num_layers):
        shard.update(_layer_shard(hf, arch, i, rank, tp_size))
    shard[FINAL_NORM] = hf["model.norm.weight"].clone()
    if not arch.tied_embeddings:
        shard[OUTPUT_LAYER] = _chunk(hf["lm_head.weight"], 0, rank, tp_size)
    return shard


def _layer_to_hf(shards: Sequence[Mapping[str, Tensor]], arch: LlamaArch, i: int) -> dict[str, Tensor]:
    src, dst = _MG.format(i=i), _HF.format(i=i)
    half = arch.ffn_hidden_size // len(shards)
    fc1 = [s[src + "mlp.linear_fc1.weight"] for s in shards]
    q, k, v = split_qkv([s[src + "self_attention.linear_qkv.weight"] for s in shards], arch)
    return {
        dst + "input_layernorm.weight": shards[0][src + "input_layernorm.weight"].clone(),
        dst + "self_attn.q_proj.weight": q,
        dst + "self_attn.k_proj.weight": k,
        dst + "self_attn.v_proj.weight": v,
        dst + "self_attn.o_proj.weight": torch.cat(
            [s[src + "self_attention.linear_proj.weight"] for s in shards], dim=1
        ),
        dst + "post_attention_layernorm.weight": shards[0][src + "pre_mlp_layernorm.weight"].clone(),
        dst + "mlp.gate_proj.weight": torch.cat([w[:half] for w in fc1], dim=0),
        dst + "mlp.up_proj.weight": torch.cat([w[half:] for w in fc1], dim=0),
        dst + "mlp.down_proj.weight": torch.cat([s[src + "mlp.linear_fc2.weight"] for s in shards], dim=1),
    }


def megatron_to_hf(shards: Sequence[Mapping[str, Tensor]], arch: LlamaArch) -> dict[str, Tensor]:
    """Every TP rank's GPTModel state dict, in rank order -> full HF tensors (no lm_head when tied).

    Replicated tensors (norms) are taken from rank 0.
    """
    if not shards:
        raise MegatronBackendError("megatron_to_hf needs the state dict of at least one rank")
    arch.check_tensor_parallel(len(shards))
    hf = {"model.embed_tokens.weight": torch.cat([s[EMBEDDING] for s in shards], dim=0)}
    for i in range(arch.num_layers):
        hf.update(_layer_to_hf(shards, arch, i))
    hf["model.norm.weight"] = shards[0][FINAL_NORM].clone()
    if not arch.tied_embeddings:
        hf["lm_head.weight"] = torch.cat([s[OUTPUT_LAYER] for s in shards], dim=0)
    return hf


def hf_weight_names(arch: LlamaArch) -> list[str]:
    """Every HF tensor name a checkpoint of `arch` holds (what `megatron_to_hf` returns)."""
    names = ["model.embed_tokens.weight"]
    per_layer = [
        "input_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    for i in range(arch.num_layers):
        names.extend(_HF.format(i=i) + suffix for suffix in per_layer)
    names.append("model.norm.weight")
    if not arch.tied_embeddings:
        names.append("lm_head.weight")
    return names
