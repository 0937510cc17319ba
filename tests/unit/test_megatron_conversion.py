"""orl.trainer.megatron_backend.hf_conversion: the HF <-> megatron weight mapping, pure tensors, no megatron.

Also the samples file the megatron worker reads (orl.trainer.megatron_backend.batch_file).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from orl.schemas.errors import ConfigError
from orl.trainer.megatron_backend.batch_file import read_samples, sample_to_json, write_samples
from orl.trainer.megatron_backend.hf_conversion import (
    EMBEDDING,
    OUTPUT_LAYER,
    LlamaArch,
    UnsupportedModelError,
    fuse_qkv,
    hf_to_megatron_shard,
    hf_weight_names,
    megatron_to_hf,
)

SMOLLM2_CONFIG: dict[str, Any] = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}


def tiny_arch(
    heads: int = 9, kv_heads: int = 3, head_dim: int = 4, tied: bool = True, layers: int = 2
) -> LlamaArch:
    return LlamaArch(
        num_layers=layers,
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=12,
        vocab_size=24,
        tied_embeddings=tied,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=64,
    )


def random_hf(arch: LlamaArch, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors of the HF shapes, under HF names."""
    generator = torch.Generator().manual_seed(seed)
    h, d, f = arch.hidden_size, arch.head_dim, arch.ffn_hidden_size
    shapes = {
        "model.embed_tokens.weight": (arch.vocab_size, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (arch.vocab_size, h),
    }
    per_layer = {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (arch.num_heads * d, h),
        "self_attn.k_proj.weight": (arch.num_kv_heads * d, h),
        "self_attn.v_proj.weight": (arch.num_kv_heads * d, h),
        "self_attn.o_proj.weight": (h, arch.num_heads * d),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (f, h),
        "mlp.up_proj.weight": (f, h),
        "mlp.down_proj.weight": (h, f),
    }
    for i in range(arch.num_layers):
        shapes.update({f"model.layers.{i}.{name}": shape for name, shape in per_layer.items()})
    return {
        name: torch.randn(shape, generator=generator)
        for name, shape in shapes.items()
        if name in hf_weight_names(arch)
    }


def round_trip(hf: dict[str, torch.Tensor], arch: LlamaArch, tp: int) -> dict[str, torch.Tensor]:
    return megatron_to_hf([hf_to_megatron_shard(hf, arch, rank, tp) for rank in range(tp)], arch)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "tp", "tied"),
    [(9, 3, 1, True), (9, 3, 3, True), (4, 2, 2, False), (8, 4, 4, True), (4, 4, 2, False)],
)
def test_round_trip_is_exact(heads: int, kv_heads: int, tp: int, tied: bool) -> None:
    arch = tiny_arch(heads, kv_heads, tied=tied)
    hf = random_hf(arch)
    back = round_trip(hf, arch, tp)
    assert sorted(back) == sorted(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name


@settings(max_examples=25, deadline=None)
@given(
    kv_heads=st.sampled_from([1, 2, 3, 4]),
    per_group=st.integers(1, 3),
    tp_index=st.integers(0, 3),
    seed=st.integers(0, 1000),
)
def test_round_trip_for_any_divisible_layout(kv_heads: int, per_group: int, tp_index: int, seed: int) -> None:
    divisors = [t for t in (1, 2, 3, 4) if kv_heads % t == 0]
    tp = divisors[tp_index % len(divisors)]
    arch = tiny_arch(heads=kv_heads * per_group, kv_heads=kv_heads, head_dim=2, layers=1)
    hf = random_hf(arch, seed)
    back = round_trip(hf, arch, tp)
    assert all(torch.equal(back[name], hf[name]) for name in hf)


def test_shards_have_megatron_names_and_shapes() -> None:
    arch = tiny_arch(heads=9, kv_heads=3, tied=False)
    shard = hf_to_megatron_shard(random_hf(arch), arch, rank=1, tp_size=3)
    layer = "decoder.layers.1."
    # 3 query heads + k + v per group, one group per rank.
    assert shard[layer + "self_attention.linear_qkv.weight"].shape == ((3 + 2) * 4, 36)
    assert shard[layer + "self_attention.linear_proj.weight"].shape == (36, 12)
    assert shard[layer + "mlp.linear_fc1.weight"].shape == (2 * 4, 36)  # gate and up halves
    assert shard[layer + "mlp.linear_fc2.weight"].shape == (36, 4)
    assert shard[layer + "input_layernorm.weight"].shape == (36,)
    assert shard[EMBEDDING].shape == shard[OUTPUT_LAYER].shape == (8, 36)
    tied = hf_to_megatron_shard(random_hf(tiny_arch()), tiny_arch(), 0, 3)
    assert OUTPUT_LAYER not in tied


def test_fused_qkv_groups_queries_with_their_key_and_value() -> None:
    """Rows tagged by head: rank r holds groups [q heads of the group, k, v] in group order."""
    arch = tiny_arch(heads=4, kv_heads=2, head_dim=1)
    hidden = arch.hidden_size
    q = torch.tensor([10.0, 11.0, 12.0, 13.0])[:, None].expand(4, hidden)  # q heads 0..3
    k = torch.tensor([20.0, 21.0])[:, None].expand(2, hidden)
    v = torch.tensor([30.0, 31.0])[:, None].expand(2, hidden)
    whole = fuse_qkv(q, k, v, arch, rank=0, tp_size=1)[:, 0].tolist()
    assert whole == [10, 11, 20, 30, 12, 13, 21, 31]
    assert fuse_qkv(q, k, v, arch, rank=1, tp_size=2)[:, 0].tolist() == [12, 13, 21, 31]


def test_fc1_holds_the_ranks_gate_rows_then_its_up_rows() -> None:
    arch = tiny_arch(heads=4, kv_heads=2)
    hf = random_hf(arch)
    shard = hf_to_megatron_shard(hf, arch, rank=1, tp_size=2)
    fc1 = shard["decoder.layers.0.mlp.linear_fc1.weight"]
    assert torch.equal(fc1[:6], hf["model.layers.0.mlp.gate_proj.weight"][6:])
    assert torch.equal(fc1[6:], hf["model.layers.0.mlp.up_proj.weight"][6:])


def test_outputs_own_their_memory() -> None:
    """safetensors refuses tensors that share storage: every converted tensor must be its own."""
    arch = tiny_arch()
    back = round_trip(random_hf(arch), arch, 3)
    pointers = [t.untyped_storage().data_ptr() for t in back.values()]
    assert len(set(pointers)) == len(pointers)


def test_reads_the_smollm2_config() -> None:
    arch = LlamaArch.from_hf_config(SMOLLM2_CONFIG)
    assert (arch.num_layers, arch.hidden_size, arch.num_heads, arch.num_kv_heads) == (30, 576, 9, 3)
    assert (arch.head_dim, arch.ffn_hidden_size, arch.vocab_size) == (64, 1536, 49152)
    assert arch.tied_embeddings and arch.rope_theta == 100000.0 and arch.rms_norm_eps == 1e-5
    arch.check_tensor_parallel(3)
    with pytest.raises(UnsupportedModelError, match="attention heads 9, key/value heads 3"):
        arch.check_tensor_parallel(2)
    legacy = {**SMOLLM2_CONFIG, "rope_parameters": None, "rope_theta": 5e5, "head_dim": None}
    assert LlamaArch.from_hf_config(legacy).rope_theta == 5e5
    assert LlamaArch.from_hf_config(legacy).head_dim == 64


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"model_type": "qwen2"}, "model_type 'qwen2'"),
        ({"attention_bias": True}, "attention biases"),
        ({"hidden_act": "gelu"}, "activation 'gelu'"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "RoPE scaling 'llama3'"),
    ],
)
def test_refuses_what_it_cannot_map(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(UnsupportedModelError, match=reason):
        LlamaArch.from_hf_config({**SMOLLM2_CONFIG, **change})


@pytest.mark.parametrize("tied", [True, False])
def test_hf_names_are_the_ones_transformers_uses(tied: bool) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=24, hidden_size=16, intermediate_size=12, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied,
    )  # fmt: skip
    names = set(LlamaForCausalLM(config).state_dict())
    if tied:
        names.discard("lm_head.weight")  # saved checkpoints of tied models leave it out
    arch = LlamaArch.from_hf_config(config.to_dict())
    assert set(hf_weight_names(arch)) == names


def test_samples_file_round_trip(tmp_path: Path) -> None:
    body = {
        "sample_id": "a",
        "method": "combined",
        "prompt_ids": [1, 2],
        "response_ids": [3, 4],
        "rollout_logprobs": [-0.5, -1.0],
        "temperature": 0.7,
        "reward": -1.0,
        "teacher_logprobs": [-0.25, -0.75],
        "policy_version": 3,
    }
    path = tmp_path / "samples.jsonl"
    path.write_text(json.dumps(body) + "\n\n")
    (sample,) = read_samples(path)
    assert sample_to_json(sample) == body
    write_samples(tmp_path / "again.jsonl", [sample])
    assert read_samples(tmp_path / "again.jsonl") == [sample]


def test_samples_file_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"sample_id": "a"}\n')
    with pytest.raises(ConfigError, match="line 1"):
        read_samples(path)
