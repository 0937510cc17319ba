"""How `orl train --backend megatron` is started: one process per GPU by torchrun, and what torchrun tells it.

The command (single node, 8 GPUs, tensor parallel 2 -> data parallel 4):

    torchrun --standalone --nproc-per-node=8 --no-python \\
        orl train --backend megatron --kind full --tensor-parallel 2 [any other orl train flag]

Several nodes: the same `orl train` flags on every node, with torchrun's rendezvous instead of
`--standalone` (`--nnodes=2 --node-rank=R --rdzv-backend=c10d --rdzv-endpoint=HOST:PORT`).
torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, GROUP_RANK (the node), MASTER_ADDR and MASTER_PORT in
each process; `torchrun_job` reads them once at start-up (they are the launcher's contract, not orl
settings) and refuses to start without them, printing the command above. Imports no megatron.
Reads and writes no topics or object keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orl.schemas.errors import ConfigError

TORCHRUN_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunJob:
    """This process's place in the torchrun job."""

    rank: int
    local_rank: int
    world_size: int
    node_rank: int


def torchrun_command(tensor_parallel: int) -> str:
    """The single-node command line, for messages and docs."""
    return (
        "torchrun --standalone --nproc-per-node=<GPUs on this node> --no-python "
        f"orl train --backend megatron --kind full --tensor-parallel {tensor_parallel} [your other flags]"
    )


def torchrun_job(environ: Mapping[str, str], tensor_parallel: int) -> TorchrunJob:
    """The job from torchrun's variables; ConfigError with the torchrun command when they are missing."""
    missing = [name for name in TORCHRUN_VARIABLES if not environ.get(name)]
    if missing:
        raise ConfigError(
            "--backend megatron runs one process per GPU started by torchrun, and this process has no "
            f"torchrun environment ({', '.join(missing)} unset). Start it as:\n"
            f"  {torchrun_command(tensor_parallel)}\n"
            "(the GPU count must be a multiple of --tensor-parallel; data parallel = GPUs / tensor "
            "parallel; several nodes: docs/scale-out.md)"
        )
    try:
        return TorchrunJob(
            rank=int(environ["RANK"]),
            local_rank=int(environ["LOCAL_RANK"]),
            world_size=int(environ["WORLD_SIZE"]),
            node_rank=int(environ.get("GROUP_RANK") or 0),
        )
    except ValueError as error:
        raise ConfigError(f"torchrun's RANK / LOCAL_RANK / WORLD_SIZE are not numbers: {error}") from error
