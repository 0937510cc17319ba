"""`orl train`: opens the event log, the object store and the base model, then runs the training loop.

Reads `<namespace>.samples` and `checkpoints/<run>/`; writes checkpoints, `<namespace>.train_steps`
and `<namespace>.checkpoints` (see `orl.trainer.loop`). Local scratch (checkpoint staging, the resumed
checkpoint's verified copy) lives in `<data-dir>/trainer/<run-id>/`. `--backend megatron` runs the
same loop across a torchrun job (`orl.trainer.megatron_backend.loop`; the command is in
`orl.trainer.megatron_backend.launch`).
"""

from __future__ import annotations

import asyncio
import logging
import os

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.model_files import resolve_model
from orl.connectors.object_store.factory import open_object_store
from orl.trainer.settings import TrainSettings, check_settings
from orl.trainer.torch_backend import run_trainer

logger = logging.getLogger(__name__)


def train(settings: TrainSettings) -> int:
    """Entry point of `orl train`; returns the exit code (0 after max_steps or an idle exit)."""
    check_settings(settings)
    if settings.backend == "megatron":
        return _train_megatron(settings)
    model_dir = resolve_model(settings.model, settings.model_cache_dir)
    store = open_object_store(
        settings.effective_store_url(),
        access_key=settings.s3_access_key or None,
        secret_key=settings.s3_secret_key or None,
    )
    work_dir = settings.data_dir / "trainer" / settings.run_id
    work_dir.mkdir(parents=True, exist_ok=True)

    async def main() -> int:
        async with open_event_log(
            settings.effective_log_url(), settings.topic_policy(), client_id="orl-train"
        ) as log:
            return await run_trainer(settings, log, store, model_dir, work_dir)

    steps = asyncio.run(main())
    logger.info("trainer %s stopped after %d steps", settings.run_id, steps)
    return 0


def _train_megatron(settings: TrainSettings) -> int:
    from orl.trainer.megatron_backend.launch import torchrun_job

    # torchrun's variables are the launcher's contract, not settings: read once, here, at start-up.
    job = torchrun_job(os.environ, settings.tensor_parallel)
    if settings.threads > 0:
        import torch

        torch.set_num_threads(settings.threads)
    from orl.trainer.megatron_backend.loop import run_megatron_trainer  # imports megatron-core

    steps = run_megatron_trainer(settings, job)
    logger.info("trainer %s (megatron, rank %d) stopped after %d steps", settings.run_id, job.rank, steps)
    return 0
