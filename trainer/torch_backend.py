"""The torch backend of `orl train`: one process, the policy in memory, each step and publish in a thread.

`run_trainer` resumes (`orl.trainer.checkpointing.prepare_resume`), loads the policy and AdamW
(their state too, so a resumed run takes the same steps as an uninterrupted one) and runs the
training loop (`orl.trainer.loop.consume_and_train`) with a `TorchStepRunner`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from orl.compute.machine import CoreBoard, available_cores, resolved_numerics
from orl.connectors.checkpoint_store import Manifest
from orl.connectors.event_log.base import EventLog
from orl.connectors.metrics import Metrics
from orl.connectors.object_store.base import ObjectStore
from orl.trainer.batch_loss import batch_loss, loss_config
from orl.trainer.batching import Batch
from orl.trainer.checkpointing import (
    check_resumable,
    optimizer_state_bytes,
    prepare_resume,
    publish_step,
    restore_optimizer,
)
from orl.trainer.core_sharing import fit_threads_every_layer
from orl.trainer.flush_request import FlushRequest
from orl.trainer.loop import consume_and_train
from orl.trainer.policy_model import LoraSettings, PolicyKind, PolicyModel, load_policy
from orl.trainer.resume import ResumePoint
from orl.trainer.settings import TrainSettings
from orl.trainer.steps import StepResult, TrainingError, step_metrics

log = logging.getLogger(__name__)

OPTIMIZER_STATE = "optimizer.pt"  # the torch backend's file under TRAINER_STATE_DIR


def train_step(
    policy: PolicyModel, optimizer: torch.optim.Optimizer, batch: Batch, settings: TrainSettings
) -> StepResult:
    """Loss, backward, clip, AdamW step on one batch (synchronous: the loop runs it in a thread)."""
    started = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    result = batch_loss(
        policy, batch.samples, loss_config(settings, resolved_numerics(settings.precision).autocast)
    )
    if not math.isfinite(result.stats.loss):
        raise TrainingError(f"non-finite loss {result.stats.loss} on samples {batch.sample_ids}")
    result.loss.backward()
    max_norm = settings.grad_clip if settings.grad_clip > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), max_norm))
    if not math.isfinite(grad_norm):
        raise TrainingError(f"non-finite gradient norm on samples {batch.sample_ids}")
    optimizer.step()
    duration_s = time.perf_counter() - started
    stats = {
        **asdict(result.stats),
        "opd_advantage_mean": result.opd_advantage_mean,
        "distill_kl": result.distill_kl,
        "reward_mean": result.reward_mean,
    }
    return StepResult(step_metrics(batch, stats, grad_norm, duration_s, optimizer.param_groups[0]["lr"]))


def load_resumed_policy(settings: TrainSettings, model_dir: Path, point: ResumePoint) -> PolicyModel:
    check_resumable(settings, point)
    lora = LoraSettings(r=settings.lora_r, alpha=settings.lora_alpha)
    kind: PolicyKind = "full" if settings.kind == "full" else "lora"
    return load_policy(model_dir, kind, lora=lora, init_dir=point.checkpoint_dir)


@dataclass
class TorchStepRunner:
    """The torch backend: one process; each step and publish in a thread (the consumer keeps heartbeating).

    The process is marked busy on the core board while a step computes, so a server on the same
    machine gives it a fair share of the cores; hooks on the policy's layers (`orl.trainer.core_sharing`)
    re-fit the step's threads as the server starts or stops computing."""

    settings: TrainSettings
    store: ObjectStore
    policy: PolicyModel
    optimizer: torch.optim.Optimizer
    work_dir: Path
    board: CoreBoard

    async def train(self, batch: Batch) -> StepResult:
        self.board.busy()
        changes = self.board.thread_changes
        try:
            return await asyncio.to_thread(train_step, self.policy, self.optimizer, batch, self.settings)
        finally:
            self.board.idle()
            log.info(
                "core board: threads re-fitted %d times during the step",
                self.board.thread_changes - changes,
            )

    async def publish(self, version: int, parent_version: int, batch: Batch, step: StepResult) -> Manifest:
        return await asyncio.to_thread(
            publish_step,
            self.store,
            self.settings,
            self.policy,
            version,
            parent_version,
            batch,
            step,
            self.work_dir,
            {OPTIMIZER_STATE: optimizer_state_bytes(self.optimizer)},
        )

    async def restore(self, checkpoint_dir: Path | None) -> None:
        policy = await asyncio.to_thread(
            load_policy,
            self.policy.base_dir,
            self.policy.kind,
            lora=LoraSettings(r=self.settings.lora_r, alpha=self.settings.lora_alpha),
            init_dir=checkpoint_dir,
        )
        optimizer = torch.optim.AdamW(
            policy.trainable_parameters(),
            lr=self.settings.effective_lr(),
            betas=(0.9, 0.999),
            weight_decay=0.0,
        )
        restore_optimizer(optimizer, checkpoint_dir, OPTIMIZER_STATE)
        fit_threads_every_layer(policy.module, self.board)
        self.policy, self.optimizer = policy, optimizer

    async def waiting(self) -> None:
        return None


async def run_trainer(
    settings: TrainSettings,
    log_: EventLog,
    store: ObjectStore,
    model_dir: Path,
    work_dir: Path,
    metrics: Metrics | None = None,
) -> int:
    """Train until `max_steps` (or idle exit); returns the number of steps this call took."""
    flush = FlushRequest()
    flush.listen_for_sigusr1()  # first: before this, SIGUSR1 would end the process
    # Resume: newest complete checkpoint (weights, version, offsets), or the base model at version 0.
    point = await prepare_resume(settings, log_, store, work_dir)
    torch.manual_seed(settings.seed)
    policy = await asyncio.to_thread(load_resumed_policy, settings, model_dir, point)
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=settings.effective_lr(), betas=(0.9, 0.999), weight_decay=0.0
    )
    if point.manifest is not None:  # a resume (not a start from --init-from)
        restore_optimizer(optimizer, point.checkpoint_dir, OPTIMIZER_STATE)
    board = CoreBoard(settings.data_dir / "cores", settings.threads or available_cores())
    fit_threads_every_layer(policy.module, board)
    log.info(
        "trainer computes in %s with %d threads alone, a fair share while other torch processes of %s compute",
        resolved_numerics(settings.precision).precision,
        board.cores,
        settings.data_dir,
    )
    runner = TorchStepRunner(settings, store, policy, optimizer, work_dir, board)
    return await consume_and_train(settings, log_, store, runner, point, metrics or Metrics(), flush)
