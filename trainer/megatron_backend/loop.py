"""`orl train --backend megatron`: the training loop every backend shares, with every step taken by a torchrun job.

Rank 0 owns the event log and the object store. It finds the resume point
(`orl.trainer.checkpointing.prepare_resume`: topics, the newest verified checkpoint, its events re-emitted if
missing) and runs `orl.trainer.loop.consume_and_train`, the loop every backend shares: the same SampleStream
and SampleBatcher (skip reasons, staleness, the partial-batch rule), the same publish protocol
(`orl.trainer.checkpointing.publish_step`: files, then the manifest with the consumed offsets), the same step
events and metrics. Its `MegatronStepRunner` drives the other ranks through a command channel
(`parallel.broadcast_json`: JSON in a uint8 tensor, never pickle):

- `resume` (once): the version to start from. Rank 0 downloaded and verified that checkpoint; ranks
  on its node read the same folder, and on every other node the local rank 0 downloads and verifies
  the same manifest. Every rank then loads its shard (version 0: the base model). `error` instead
  when rank 0 could not resume: every rank stops with its message.
- `step`: the batch's samples. Every rank takes the step (`orl.trainer.megatron_backend.step`) and joins
  the gather of the tensor-parallel shards to rank 0, which writes and publishes the checkpoint.
- `wait`: sent every KEEPALIVE_S (at most a quarter of the timeout) while no batch is ready, so no
  rank waits in one collective long enough to hit the process-group timeout, however long the
  samples take to come.
- `stop`: rank 0's loop ended (max_steps or the idle exit); every rank returns.

Reads `<ns>.samples` and `checkpoints/<run>/` (rank 0; the resumed version on other nodes); writes
`checkpoints/<run>/<version>/`, `<ns>.train_steps` and `<ns>.checkpoints` (rank 0 only). Each rank's
AdamW state goes into the checkpoint too (`trainer_state/optimizer-tp<i>-of-<t>-dp<j>-of-<d>.pt`,
gathered to rank 0 after the weights); a resume with the same parallel layout loads it and continues
exactly, as the torch backend does, and one with another layout starts the moments from zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from orl.compute.machine import resolved_numerics
from orl.connectors.checkpoint_store import Manifest, download_and_verify
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.metrics import Metrics
from orl.connectors.model_files import resolve_model
from orl.connectors.object_store.base import ObjectStore
from orl.connectors.object_store.factory import open_object_store
from orl.trainer.batch_loss import LossConfig, loss_config
from orl.trainer.batching import Batch
from orl.trainer.checkpointing import (
    check_resumable,
    optimizer_state_bytes,
    prepare_resume,
    publish_step,
    restore_optimizer,
)
from orl.trainer.loop import consume_and_train
from orl.trainer.megatron_backend.batch_file import sample_from_json, sample_to_json
from orl.trainer.megatron_backend.export import gather_checkpoint
from orl.trainer.megatron_backend.hf_conversion import MegatronBackendError
from orl.trainer.megatron_backend.launch import TorchrunJob
from orl.trainer.megatron_backend.model import MegatronPolicy, load_megatron_policy
from orl.trainer.megatron_backend.parallel import (
    ParallelContext,
    broadcast_json,
    gather_bytes,
    init_parallel,
    shutdown_parallel,
)
from orl.trainer.megatron_backend.step import train_step
from orl.trainer.resume import ResumePoint
from orl.trainer.settings import TrainSettings
from orl.trainer.steps import StepResult

log = logging.getLogger(__name__)

KEEPALIVE_S = 30.0


def run_megatron_trainer(settings: TrainSettings, job: TorchrunJob) -> int:
    """Every rank: join the job, load the policy, train until rank 0 stops; returns the steps taken."""
    parallel = init_parallel(
        settings.megatron_device,
        settings.tensor_parallel,
        job.local_rank,
        settings.seed,
        settings.megatron_timeout_s,
    )
    try:
        model_dir = _resolve_model(settings, job)
        work_dir = settings.data_dir / "trainer" / settings.run_id
        if parallel.is_writer:
            log.info(
                "megatron trainer: %d ranks = tensor parallel %d x data parallel %d on %s",
                parallel.world_size,
                parallel.tp_size,
                parallel.dp_size,
                parallel.device.type,
            )
            return asyncio.run(_lead(settings, parallel, model_dir, work_dir))
        return _follow(settings, job, parallel, model_dir, work_dir)
    finally:
        shutdown_parallel()


def _resolve_model(settings: TrainSettings, job: TorchrunJob) -> Path:
    """The base model folder; local rank 0 converts the shipped model once per node, the others wait."""
    if job.local_rank == 0:
        resolve_model(settings.model, settings.model_cache_dir)
    dist.barrier()
    return resolve_model(settings.model, settings.model_cache_dir)


def _open_store(settings: TrainSettings) -> ObjectStore:
    return open_object_store(
        settings.effective_store_url(),
        access_key=settings.s3_access_key or None,
        secret_key=settings.s3_secret_key or None,
    )


def _load(
    settings: TrainSettings, parallel: ParallelContext, model_dir: Path, init_dir: Path | None
) -> tuple[MegatronPolicy, torch.optim.Optimizer]:
    """Wait until every node has the resumed checkpoint, then load this rank's shard and its optimizer."""
    dist.barrier()
    policy = load_megatron_policy(model_dir, parallel, settings.beta_kl != 0, init_dir)
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=settings.effective_lr(), betas=(0.9, 0.999), weight_decay=0.0
    )
    restore_optimizer(optimizer, init_dir, optimizer_file(parallel))
    return policy, optimizer


def optimizer_file(parallel: ParallelContext) -> str:
    """This rank's optimizer state file under the checkpoint's trainer_state folder, named by its shard.

    A restart with another parallel layout finds no file of its own and starts the moments from zero.
    """
    return (
        f"optimizer-tp{parallel.tp_rank}-of-{parallel.tp_size}-dp{parallel.dp_rank}-of-{parallel.dp_size}.pt"
    )


def gather_optimizer_states(optimizer: torch.optim.Optimizer, parallel: ParallelContext) -> dict[str, bytes]:
    """Every rank's optimizer state by its file name, on rank 0 ({} elsewhere). A collective."""
    names = gather_bytes(optimizer_file(parallel).encode(), parallel)
    states = gather_bytes(optimizer_state_bytes(optimizer), parallel)
    if names is None or states is None:
        return {}
    return {name.decode(): data for name, data in zip(names, states, strict=True)}


def _resume_message(point: ResumePoint) -> dict[str, Any]:
    if point.manifest is None:
        return {"op": "resume", "version": 0}
    return {
        "op": "resume",
        "version": point.version,
        "manifest_key": point.manifest.manifest_key,
        "manifest_sha256": point.manifest.sha256,
        "local_dir": str(point.checkpoint_dir),
    }


@dataclass
class MegatronStepRunner:
    """Rank 0's side of a step: command the other ranks, step with them, gather and publish."""

    settings: TrainSettings
    store: ObjectStore
    policy: MegatronPolicy
    optimizer: torch.optim.Optimizer
    work_dir: Path
    _last_command_s: float = field(default_factory=time.monotonic)

    def _send(self, message: dict[str, Any]) -> None:
        broadcast_json(message, self.policy.parallel)
        self._last_command_s = time.monotonic()

    def _step(self, batch: Batch) -> StepResult:
        self._send({"op": "step", "samples": [sample_to_json(s) for s in batch.samples]})
        step = train_step(
            self.policy,
            self.optimizer,
            batch,
            _loss_config(self.settings),
            self.settings.grad_clip,
        )
        return StepResult(step.metrics)

    def _publish(self, version: int, parent_version: int, batch: Batch, step: StepResult) -> Manifest:
        checkpoint = gather_checkpoint(self.policy)
        if checkpoint is None:
            raise MegatronBackendError("rank 0 must hold the gathered weights")
        states = gather_optimizer_states(self.optimizer, self.policy.parallel)
        return publish_step(
            self.store, self.settings, checkpoint, version, parent_version, batch, step, self.work_dir, states
        )

    async def train(self, batch: Batch) -> StepResult:
        return await asyncio.to_thread(self._step, batch)

    async def publish(self, version: int, parent_version: int, batch: Batch, step: StepResult) -> Manifest:
        return await asyncio.to_thread(self._publish, version, parent_version, batch, step)

    async def restore(self, checkpoint_dir: Path | None) -> None:
        raise MegatronBackendError(
            "the megatron backend cannot reload a version (--rollback-window is refused)"
        )

    async def waiting(self) -> None:
        keepalive_s = min(KEEPALIVE_S, self.settings.megatron_timeout_s / 4)
        if time.monotonic() - self._last_command_s >= keepalive_s:
            log.debug("no batch yet: keep-alive to the other ranks")
            self._send({"op": "wait"})

    def stop(self) -> None:
        self._send({"op": "stop"})


async def _lead(settings: TrainSettings, parallel: ParallelContext, model_dir: Path, work_dir: Path) -> int:
    """Rank 0: resume, then the torch backend's loop with every step taken by the whole job."""
    store = _open_store(settings)
    async with open_event_log(
        settings.effective_log_url(), settings.topic_policy(), client_id="orl-train"
    ) as log_:
        try:
            point = await prepare_resume(settings, log_, store, work_dir)
            check_resumable(settings, point)
        except Exception as error:
            # Tell the other ranks why, so they stop with the same message instead of a timeout.
            broadcast_json({"op": "error", "message": f"rank 0 could not resume: {error}"}, parallel)
            raise
        broadcast_json(_resume_message(point), parallel)
        policy, optimizer = await asyncio.to_thread(
            _load, settings, parallel, model_dir, point.checkpoint_dir
        )
        runner = MegatronStepRunner(settings, store, policy, optimizer, work_dir)
        steps = await consume_and_train(settings, log_, store, runner, point, Metrics())
        runner.stop()
    return steps


def _resumed_checkpoint(
    settings: TrainSettings, job: TorchrunJob, message: dict[str, Any], work_dir: Path
) -> Path | None:
    """The local folder of the version rank 0 resumes from (None: the base model)."""
    if int(message["version"]) == 0:
        return None
    if job.node_rank == 0:
        return Path(message["local_dir"])  # rank 0's node: it downloaded and verified it there
    local = work_dir / f"resume-{int(message['version']):08d}-node{job.node_rank}"
    if job.local_rank == 0:
        download_and_verify(_open_store(settings), message["manifest_key"], local, message["manifest_sha256"])
    return local


def _loss_config(settings: TrainSettings) -> LossConfig:
    return loss_config(settings, resolved_numerics(settings.precision, settings.megatron_device).autocast)


def _follow(
    settings: TrainSettings, job: TorchrunJob, parallel: ParallelContext, model_dir: Path, work_dir: Path
) -> int:
    """Every rank but 0: load what rank 0 resumes from, then take each step it commands."""
    message = broadcast_json(None, parallel)
    if message["op"] == "error":
        raise MegatronBackendError(str(message["message"]))
    policy, optimizer = _load(
        settings, parallel, model_dir, _resumed_checkpoint(settings, job, message, work_dir)
    )
    config = _loss_config(settings)
    steps = 0
    while True:
        command = broadcast_json(None, parallel)
        if command["op"] == "stop":
            return steps
        if command["op"] == "wait":
            continue
        if command["op"] != "step":
            raise MegatronBackendError(f"unknown command {command['op']!r} from rank 0")
        samples = tuple(sample_from_json(body, index) for index, body in enumerate(command["samples"]))
        train_step(policy, optimizer, Batch(samples, {}, {}, (0,) * len(samples)), config, settings.grad_clip)
        gather_checkpoint(policy)  # rank 0 writes and publishes it, with every rank's optimizer state
        gather_optimizer_states(optimizer, parallel)
        steps += 1
