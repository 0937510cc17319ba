"""Export the trained GPTModel as a full Hugging Face checkpoint folder and publish it.

The tensor-parallel shards of data-parallel replica 0 are gathered on global rank 0, merged back to
Hugging Face names (`orl.trainer.megatron_backend.hf_conversion.megatron_to_hf`) and written as the same
folder `PolicyModel.save` writes for `kind="full"`: `model.safetensors` (fp32, no `lm_head.weight`
when the embeddings are tied) plus the base folder's config, generation config, tokenizer and chat
template. `GatheredCheckpoint` is that folder-to-be on rank 0, in the shape `orl.trainer.checkpointing.publish_step`
saves (what `orl train --backend megatron` publishes per step); `publish_export` (the samples-file
worker) hands the folder to `orl.connectors.checkpoint_store.publish_checkpoint` directly. Either way
every file goes first and the manifest last, so serving's checkpoint follower verifies and loads it
like a torch-backend checkpoint. Writes `checkpoints/<run>/<version>/` in the object store.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from orl.connectors.checkpoint_store import Manifest, publish_checkpoint
from orl.connectors.object_store.base import ObjectStore
from orl.trainer.megatron_backend.hf_conversion import LlamaArch, megatron_to_hf
from orl.trainer.megatron_backend.model import MegatronPolicy, weights_state
from orl.trainer.megatron_backend.parallel import tp_group
from orl.trainer.policy_model import _copy_non_weight_files
from torch import Tensor

WEIGHTS_FILE = "model.safetensors"


def gather_shards(policy: MegatronPolicy) -> list[dict[str, Tensor]] | None:
    """Every TP rank's state dict (on CPU, rank order) on global rank 0; None elsewhere.

    Only data-parallel replica 0 takes part (the replicas hold identical weights); every rank of
    that replica must call it.
    """
    parallel = policy.parallel
    if parallel.dp_rank != 0:
        return None
    local = weights_state(policy.module)
    if parallel.tp_size == 1:
        return [{k: v.detach().cpu().clone() for k, v in local.items()}]
    shards: list[dict[str, Tensor]] = [{} for _ in range(parallel.tp_size)]
    for name, tensor in local.items():
        parts = [torch.empty_like(tensor) for _ in range(parallel.tp_size)]
        dist.all_gather(parts, tensor.detach().contiguous(), group=tp_group())
        if parallel.is_writer:
            for rank, part in enumerate(parts):
                shards[rank][name] = part.cpu()
    return shards if parallel.is_writer else None


def write_hf_folder(hf_weights: Mapping[str, Tensor], base_dir: Path, out_dir: Path) -> list[Path]:
    """`model.safetensors` plus every non-weight file of the base folder; returns the files, sorted."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    contiguous = {name: t.contiguous() for name, t in hf_weights.items()}
    save_file(contiguous, str(out_dir / WEIGHTS_FILE), metadata={"format": "pt"})
    _copy_non_weight_files(Path(base_dir), out_dir)
    return sorted(p for p in out_dir.rglob("*") if p.is_file())


@dataclass(frozen=True)
class GatheredCheckpoint:
    """Every TP shard of the current weights, on rank 0: saves as a full Hugging Face folder."""

    shards: list[dict[str, Tensor]]
    arch: LlamaArch
    base_dir: Path
    kind: str = "full"

    def save(self, out_dir: Path) -> list[Path]:
        return write_hf_folder(megatron_to_hf(self.shards, self.arch), self.base_dir, out_dir)


def gather_checkpoint(policy: MegatronPolicy) -> GatheredCheckpoint | None:
    """The current weights, gathered on rank 0 (None elsewhere); every rank must call it."""
    shards = gather_shards(policy)
    return None if shards is None else GatheredCheckpoint(shards, policy.arch, policy.base_dir)


def export_hf_checkpoint(policy: MegatronPolicy, out_dir: Path) -> list[Path]:
    """Write the full HF checkpoint of the current weights on rank 0 (returns its files; [] elsewhere)."""
    checkpoint = gather_checkpoint(policy)
    return [] if checkpoint is None else checkpoint.save(out_dir)


def publish_export(
    policy: MegatronPolicy,
    store: ObjectStore,
    run_id: str,
    version: int,
    work_dir: Path,
    *,
    base_model: str,
    sample_ids: Sequence[str],
    metrics: Mapping[str, Any],
) -> Manifest | None:
    """Export and publish as `checkpoints/<run_id>/<version>/` (manifest last); the Manifest on rank 0.

    Every rank calls it (the gather is collective); ranks other than 0 return None after the barrier,
    so no rank moves on before the checkpoint is complete.
    """
    manifest = None
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"v{version:08d}-", dir=work_dir) as tmp:
        if export_hf_checkpoint(policy, Path(tmp)):
            manifest = publish_checkpoint(
                store,
                run_id,
                version,
                Path(tmp),
                parent_version=version - 1,  # 0 is the base model
                kind="full",
                base_model=base_model,
                consumed_offsets=[],
                sample_ids=list(sample_ids),
                metrics=dict(metrics),
            )
    dist.barrier()
    return manifest
