"""megatron-core's GPTModel built from a Hugging Face Llama folder: config, construction, weights.

Reads `config.json` and the `*.safetensors` weights of a local Hugging Face model folder (the base
model `orl.connectors.model_files.resolve_model` gives). Each tensor-parallel rank reads only the
tensors it needs through a lazy safetensors mapping and slices its shard with
`orl.trainer.megatron_backend.hf_conversion`. The model is built with megatron's local layer spec (plain
torch modules, no Transformer Engine), dropout 0 (as the torch backend's Llama), fp32 master weights;
the frozen reference for the KL term is a second GPTModel with the base weights. The policy starts
from the base weights or, on resume, from a checkpoint folder's.
Needs `megatron.core.parallel_state` initialised (`orl.trainer.megatron_backend.parallel`).
Reads and writes no topics or object keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from orl.trainer.megatron_backend.hf_conversion import LlamaArch, MegatronBackendError, hf_to_megatron_shard
from orl.trainer.megatron_backend.parallel import ParallelContext
from torch import Tensor, nn

_EXTRA_STATE = "_extra_state"


class SafetensorsFolder(Mapping[str, Tensor]):
    """Lazy read-only view of every tensor in a folder's `*.safetensors` files (one tensor per read)."""

    def __init__(self, model_dir: Path) -> None:
        from safetensors import safe_open

        files = sorted(Path(model_dir).glob("*.safetensors"))
        if not files:
            raise MegatronBackendError(f"{model_dir} holds no .safetensors weights")
        self._stack = ExitStack()
        self._where: dict[str, Any] = {}
        for path in files:
            handle = self._stack.enter_context(safe_open(str(path), framework="pt"))
            self._where.update(dict.fromkeys(handle.keys(), handle))

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._where:
            raise KeyError(f"no tensor {name!r} in the model folder")
        tensor: Tensor = self._where[name].get_tensor(name)
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def close(self) -> None:
        self._stack.close()


def read_arch(model_dir: Path) -> LlamaArch:
    """The architecture from `<model_dir>/config.json`."""
    config_path = Path(model_dir) / "config.json"
    if not config_path.is_file():
        raise MegatronBackendError(f"{model_dir} is not a Hugging Face model folder (no config.json)")
    return LlamaArch.from_hf_config(json.loads(config_path.read_text()))


def transformer_config(arch: LlamaArch, tp_size: int) -> Any:
    """megatron's TransformerConfig for `arch`: RMSNorm, SwiGLU, GQA, no biases, no dropout, fp32."""
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        ffn_hidden_size=arch.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=arch.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        attention_softmax_in_fp32=True,
        tensor_model_parallel_size=tp_size,
        params_dtype=torch.float32,
        use_cpu_initialization=True,  # weights are loaded right after; no device-side random init
        perform_initialization=False,
        # The fused kernels need CUDA extensions; the plain torch paths compute the same functions.
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def build_gpt_model(arch: LlamaArch, tp_size: int) -> nn.Module:
    """An uninitialised GPTModel of `arch` for this rank (load weights with `load_shard`)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    arch.check_tensor_parallel(tp_size)
    model: nn.Module = GPTModel(
        config=transformer_config(arch, tp_size),
        transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
        vocab_size=arch.vocab_size,
        max_sequence_length=arch.max_position_embeddings,
        parallel_output=True,  # logits stay vocab-sharded: orl.trainer.megatron_backend.logprobs reduces them
        share_embeddings_and_output_weights=arch.tied_embeddings,
        position_embedding_type="rope",
        rotary_base=arch.rope_theta,  # a float base, as transformers uses it
    )
    _mark_tensor_parallel(model)
    return model


def _mark_tensor_parallel(model: nn.Module) -> None:
    """Tag each sharded weight as megatron's own random init would have (`tensor_model_parallel`).

    With `perform_initialization=False` megatron 0.16 skips that tagging, and the tag is how the
    global gradient norm tells a shard (summed over TP ranks) from a replicated tensor (counted once).
    """
    from megatron.core.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        set_tensor_model_parallel_attributes,
    )

    split_dims = ((ColumnParallelLinear, 0), (RowParallelLinear, 1), (VocabParallelEmbedding, 0))
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, nn.Parameter) or hasattr(weight, "tensor_model_parallel"):
            continue
        for cls, dim in split_dims:
            if isinstance(module, cls):
                set_tensor_model_parallel_attributes(weight, True, dim, 1)


def load_shard(model: nn.Module, shard: Mapping[str, Tensor]) -> None:
    """Copy a converted state dict into `model`; every parameter must be covered, nothing extra."""
    expected = {k for k in model.state_dict() if not k.endswith(_EXTRA_STATE)}
    missing, unexpected = sorted(expected - set(shard)), sorted(set(shard) - expected)
    if missing or unexpected:
        raise MegatronBackendError(
            f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    result = model.load_state_dict(dict(shard), strict=False)
    if result.unexpected_keys:
        raise MegatronBackendError(f"unexpected weights {result.unexpected_keys[:5]}")


def weights_state(model: nn.Module) -> dict[str, Tensor]:
    """The rank's parameters by GPTModel name (megatron's `_extra_state` entries left out)."""
    return {k: v for k, v in model.state_dict().items() if not k.endswith(_EXTRA_STATE)}


@dataclass
class MegatronPolicy:
    """The trainable GPTModel shard of this rank plus its frozen base reference (None: no KL term)."""

    module: nn.Module
    reference_module: nn.Module | None
    arch: LlamaArch
    base_dir: Path
    parallel: ParallelContext

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    @contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The frozen base model, in eval mode, inside `no_grad`."""
        if self.reference_module is None:
            raise MegatronBackendError("this policy was loaded without a reference (beta_kl == 0)")
        with torch.no_grad():
            yield self.reference_module


def _frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def _read_shard(folder: Path, arch: LlamaArch, parallel: ParallelContext) -> dict[str, Tensor]:
    """This rank's GPTModel state dict from a Hugging Face folder's safetensors."""
    weights = SafetensorsFolder(folder)
    try:
        return hf_to_megatron_shard(weights, arch, parallel.tp_rank, parallel.tp_size)
    finally:
        weights.close()


def load_megatron_policy(
    model_dir: Path, parallel: ParallelContext, with_reference: bool, init_dir: Path | None = None
) -> MegatronPolicy:
    """Build this rank's policy (and reference) from the HF folder, on `parallel.device`.

    `init_dir` resumes from a full checkpoint folder (this backend's or the torch backend's: both are
    Hugging Face folders of the same model); the reference stays the base model either way.
    """
    arch = read_arch(model_dir)
    base_shard = _read_shard(model_dir, arch, parallel) if with_reference or init_dir is None else None
    if init_dir is not None:
        if read_arch(init_dir) != arch:
            raise MegatronBackendError(
                f"checkpoint {init_dir} is not a checkpoint of the base model {model_dir}"
            )
        shard = _read_shard(init_dir, arch, parallel)
    else:
        assert base_shard is not None
        shard = base_shard
    policy = build_gpt_model(arch, parallel.tp_size)
    load_shard(policy, shard)
    reference = None
    if with_reference:
        assert base_shard is not None
        reference = build_gpt_model(arch, parallel.tp_size)
        load_shard(reference, base_shard)
        reference = _frozen(reference.to(parallel.device))
    policy = policy.to(parallel.device).train()
    return MegatronPolicy(policy, reference, arch, Path(model_dir), parallel)
