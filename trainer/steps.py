"""What a backend's step returns, and what the training loop asks of a backend: the same for every backend.

A `StepRunner` takes and publishes one step: `orl.trainer.torch_backend.TorchStepRunner` in this
process, `orl.trainer.megatron_backend.loop.MegatronStepRunner` across a torchrun job.
`step_metrics` is what the manifest and TrainStepCompleted record about a step. Reads and writes nothing.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from orl.connectors.checkpoint_store import Manifest
from orl.connectors.metrics import Metrics
from orl.schemas.errors import OrlError
from orl.trainer.batching import Batch

log = logging.getLogger(__name__)


class TrainingError(OrlError):
    """A step could not be taken (non-finite loss or gradient): not applied, the worker stops loudly.

    Raised by every backend's step (torch here, `orl.trainer.megatron_backend.step`)."""


@dataclass(frozen=True)
class StepResult:
    metrics: dict[str, Any]  # what the manifest and TrainStepCompleted record about the step


def step_metrics(
    batch: Batch, stats: Mapping[str, float], grad_norm: float, duration_s: float, lr: float
) -> dict[str, Any]:
    """What the manifest and TrainStepCompleted record about a step: the same keys for every backend.

    `stats` holds the whole batch's loss, pg_loss, kl, clip_fraction, advantage_mean,
    opd_advantage_mean, distill_kl (top-K distillation: mean KL(student || teacher) per distilled token, nan
    when none), reward_mean and tokens.
    """
    tokens = int(stats["tokens"])
    return {
        "sample_ids": batch.sample_ids,
        "loss": stats["loss"],
        "pg_loss": stats["pg_loss"],
        "kl": stats["kl"],
        "clip_fraction": stats["clip_fraction"],
        "advantage_mean": stats["advantage_mean"],
        "opd_advantage_mean": stats["opd_advantage_mean"],
        "distill_kl": stats["distill_kl"],
        "reward_mean": stats["reward_mean"],
        "grad_norm": grad_norm,
        "tokens": tokens,
        "duration_s": duration_s,
        "tokens_per_s": tokens / duration_s if duration_s > 0 else 0.0,
        "dropped_stale": batch.skipped.get("stale", 0),
        "mean_staleness": batch.mean_staleness,
        "skipped": batch.skipped,
        "methods": dict(sorted(Counter(s.method for s in batch.samples).items())),
        "lr": lr,
    }


class StepRunner(Protocol):
    """How a backend takes one step and publishes it; `consume_and_train` does everything else."""

    async def train(self, batch: Batch) -> StepResult: ...

    async def publish(
        self, version: int, parent_version: int, batch: Batch, step: StepResult
    ) -> Manifest: ...

    async def restore(self, checkpoint_dir: Path | None) -> None:
        """Continue from a published version's weights and optimizer state (None: the base model)."""

    async def waiting(self) -> None:
        """Called on every loop turn without a batch (megatron: keeps the other ranks' collective alive)."""


def log_step(version: int, batch: Batch, step: StepResult, publish_s: float) -> None:
    m = step.metrics
    log.info(
        "step v%d: loss %.4f (pg %.4f) reward %.3f kl %.4f clip %.3f grad %.3f | %d samples %d tokens "
        "%.2f s %.0f tok/s | staleness %.2f dropped %s | publish %.2f s",
        version,
        m["loss"],
        m["pg_loss"],
        m["reward_mean"],
        m["kl"],
        m["clip_fraction"],
        m["grad_norm"],
        len(batch.samples),
        m["tokens"],
        m["duration_s"],
        m["tokens_per_s"],
        m["mean_staleness"],
        batch.skipped or "none",
        publish_s,
    )


def count_step(metrics: Metrics, version: int, batch: Batch, step: StepResult) -> None:
    for reason, count in batch.skipped.items():
        metrics.count("samples_skipped", count, reason=reason)
    metrics.count("samples_trained", len(batch.samples))
    metrics.count("tokens_trained", step.metrics["tokens"])
    metrics.set("policy_version", version)
    metrics.observe("step_duration_s", step.metrics["duration_s"])
