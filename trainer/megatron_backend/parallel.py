"""Process groups of a torchrun job: tensor x data parallel, and the reductions a step needs across them.

`init_parallel` starts torch.distributed from torchrun's environment (NCCL on CUDA, gloo on CPU),
splits the world into tensor-parallel groups of `tp_size` consecutive ranks (megatron's default
order) and data-parallel groups across them, and seeds megatron's RNG tracker. The helpers below
sum over the data-parallel group (loss statistics, gradients) and compute the global gradient norm
over the model-parallel shards (a replicated tensor, e.g. a norm weight, counted once).
`broadcast_json` sends rank 0's commands to every rank as UTF-8 JSON in a uint8 tensor (no pickle).
Reads and writes no topics or object keys.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from orl.schemas.errors import ConfigError
from torch import Tensor, nn

DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ParallelContext:
    """Where this process sits in the job."""

    device: torch.device
    rank: int
    world_size: int
    tp_rank: int
    tp_size: int
    dp_rank: int
    dp_size: int

    @property
    def is_writer(self) -> bool:
        """The one process that writes files, reports and checkpoints (global rank 0)."""
        return self.rank == 0


def _device(device: str, local_rank: int) -> torch.device:
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible (CPU runs are for tests only)")
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if device == "cpu":
        # megatron allocates its working buffers on torch.cuda.current_device(): a CPU run needs it
        # to say "cpu", which only the test-only patches of tests/support/megatron_cpu.py make it do.
        try:
            current: object = torch.cuda.current_device()
        except (AssertionError, RuntimeError):
            current = None
        if str(current) != "cpu":
            raise ConfigError(
                "--device cpu needs the test-only CPU patches of megatron-core "
                "(tests/support/megatron_cpu.py); train on CUDA devices"
            )
        return torch.device("cpu")
    raise ConfigError(f"--device must be cuda or cpu, not {device!r}")


def init_parallel(
    device: str, tp_size: int, local_rank: int, seed: int, timeout_s: float = DEFAULT_TIMEOUT_S
) -> ParallelContext:
    """Join the torchrun job (env:// rendezvous), build megatron's TP/DP groups, seed the RNGs.

    `timeout_s` bounds every collective: a rank waiting longer (a peer died, or hangs) fails loudly.
    """
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    where = _device(device, local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if where.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s)
        )
    world = dist.get_world_size()
    if tp_size < 1 or world % tp_size:
        raise ConfigError(f"--tensor-parallel {tp_size} must divide the {world} torchrun processes")
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=tp_size, create_gloo_process_groups=False
    )
    torch.manual_seed(seed)
    model_parallel_cuda_manual_seed(seed)
    return ParallelContext(
        device=where,
        rank=dist.get_rank(),
        world_size=world,
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        tp_size=tp_size,
        dp_rank=parallel_state.get_data_parallel_rank(),
        dp_size=parallel_state.get_data_parallel_world_size(),
    )


def shutdown_parallel() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_json(message: Any, parallel: ParallelContext) -> Any:
    """Rank 0's `message` (JSON-serialisable) on every rank; other ranks pass None. A collective."""
    size = torch.zeros(1, dtype=torch.long, device=parallel.device)
    payload = torch.empty(0, dtype=torch.uint8)
    if parallel.rank == 0:
        raw = bytearray(json.dumps(message, separators=(",", ":")).encode())
        payload = torch.frombuffer(raw, dtype=torch.uint8).to(parallel.device)
        size[0] = payload.numel()
    dist.broadcast(size, src=0)
    if parallel.rank != 0:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=parallel.device)
    dist.broadcast(payload, src=0)
    return json.loads(payload.cpu().numpy().tobytes())


def gather_bytes(data: bytes, parallel: ParallelContext) -> list[bytes] | None:
    """Every rank's `data`, in rank order, on rank 0 (None elsewhere). A collective."""
    size = torch.tensor([len(data)], dtype=torch.long, device=parallel.device)
    sizes = [torch.zeros(1, dtype=torch.long, device=parallel.device) for _ in range(parallel.world_size)]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    payload = torch.zeros(longest, dtype=torch.uint8, device=parallel.device)
    if data:
        payload[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    gathered = [torch.empty_like(payload) for _ in range(parallel.world_size)] if parallel.rank == 0 else None
    dist.gather(payload, gathered, dst=0)
    if gathered is None:
        return None
    return [g[: int(s.item())].cpu().numpy().tobytes() for g, s in zip(gathered, sizes, strict=True)]


def tp_group() -> dist.ProcessGroup:
    from megatron.core import parallel_state

    group: dist.ProcessGroup = parallel_state.get_tensor_model_parallel_group()
    return group


def dp_group() -> dist.ProcessGroup:
    from megatron.core import parallel_state

    group: dist.ProcessGroup = parallel_state.get_data_parallel_group()
    return group


def dp_sum(values: Tensor, parallel: ParallelContext) -> Tensor:
    """Sum a tensor over the data-parallel group (in place; returned for chaining)."""
    if parallel.dp_size > 1:
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=dp_group())
    return values


def sync_gradients(params: Sequence[nn.Parameter], parallel: ParallelContext) -> None:
    """Sum every gradient over the data-parallel group (each rank's loss is pre-weighted by its tokens)."""
    grads = [p.grad for p in params if p.grad is not None]
    if parallel.dp_size == 1 or not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=dp_group())
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def global_grad_norm(params: Sequence[nn.Parameter], parallel: ParallelContext) -> float:
    """L2 norm of the whole model's gradient: shards summed over TP, replicated tensors counted once."""
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    squares = torch.zeros((), dtype=torch.float64, device=parallel.device)
    for param in params:
        if param.grad is not None and param_is_not_tensor_parallel_duplicate(param):
            squares += param.grad.detach().double().pow(2).sum()
    if parallel.tp_size > 1:
        dist.all_reduce(squares, op=dist.ReduceOp.SUM, group=tp_group())
    return math.sqrt(float(squares))


def clip_gradients(params: Sequence[nn.Parameter], max_norm: float, parallel: ParallelContext) -> float:
    """Scale gradients as `torch.nn.utils.clip_grad_norm_` does, over the global norm; returns that norm."""
    norm = global_grad_norm(params, parallel)
    if math.isfinite(norm) and math.isfinite(max_norm):
        coefficient = min(max_norm / (norm + 1e-6), 1.0)
        for param in params:
            if param.grad is not None:
                param.grad.mul_(coefficient)
    return norm
