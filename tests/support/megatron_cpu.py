"""TEST ONLY: the two patches that let megatron-core 0.16 run on a CPU-only torch (gloo, no CUDA).

megatron-core is written for CUDA devices. Its local (non-Transformer-Engine) layers compute on
whatever device their tensors live on, except in two places, patched here and nowhere else. The
trainer's GPU code path never imports this module; `python -m tests.support.megatron_cpu` is a
drop-in replacement for `python -m orl.trainer.megatron_backend.worker` that applies the patches first
(the tests launch it under torchrun with `--device cpu`).

1. `torch.cuda.current_device` returns "cpu". megatron allocates working buffers with
   `device=torch.cuda.current_device()` (the attention-score buffer of its global memory buffer,
   all-gather outputs) and moves the RoPE frequencies there on the first forward
   (`RotaryEmbedding.get_emb`). On a CPU build of torch the real function raises "Torch not compiled
   with CUDA enabled"; returning "cpu" puts those tensors beside the CPU weights.
2. The RNG tracker becomes megatron's own no-op tracker (the one it installs for inference:
   `initialize_rng_tracker(inference_rng_tracker=True)`). The training tracker forks the CUDA
   generator's state around every attention dropout call (`get_cuda_rng_tracker().fork()`), which
   needs a CUDA generator. The backend trains with dropout 0 (like the torch backend's Llama), so
   the forked stream is never drawn from and a no-op fork changes no number. The worker's
   `model_parallel_cuda_manual_seed` keeps an already-installed tracker, and the CUDA seed it sets
   on a CPU build is only queued, so the worker's code path stays the GPU one.
"""

from __future__ import annotations

import sys

import torch


def _cpu_current_device() -> str:
    return "cpu"


def apply_cpu_patches() -> None:
    """Install both patches in this process (idempotent); call before building any megatron model."""
    from megatron.core.tensor_parallel.random import initialize_rng_tracker

    torch.cuda.current_device = _cpu_current_device  # type: ignore[assignment]  # patch 1
    initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)  # patch 2


def main() -> int:
    """The megatron worker's entry point with the CPU patches applied (for torchrun in tests)."""
    apply_cpu_patches()
    from orl.trainer.megatron_backend.worker import main as worker_main

    return worker_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
