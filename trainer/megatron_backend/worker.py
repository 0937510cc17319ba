"""The megatron backend on a samples file (a parity and benchmark tool): one process per device under torchrun.

The trainer of the live loop is `orl train --backend megatron` (`orl.trainer.megatron_backend.loop`:
it consumes the samples topic and publishes a checkpoint per step). This worker runs the same step
on a JSON-lines file and exports once at the end, which is what the parity tests compare with the
torch backend:

    torchrun --nproc-per-node 8 -m orl.trainer.megatron_backend.worker \\
        --model-dir MODEL_DIR --samples-file samples.jsonl --tensor-parallel 2 \\
        --batch-size 16 --store-url file:///path/to/objects --run-id megatron

Every rank loads its shard of the Hugging Face base model into megatron's GPTModel (plus a frozen
reference when beta_kl > 0), then for each batch of `--batch-size` samples of the samples file
(`orl.trainer.megatron_backend.batch_file`) computes the torch backend's loss
(`orl.trainer.megatron_backend.step`), steps AdamW and logs the step. At the end rank 0 writes the
weights as a full Hugging Face folder (`--export-dir`) and/or publishes them as
`checkpoints/<run-id>/<version>/` with the manifest last (`--store-url`), and writes `--report-file`.
Reads the model folder and the samples file; writes the object store, the export folder, the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from orl.connectors.object_store.factory import open_object_store
from orl.schemas.errors import OrlError
from orl.trainer.batch_loss import loss_config
from orl.trainer.batching import Batch, TrainingSample
from orl.trainer.megatron_backend.batch_file import read_samples
from orl.trainer.megatron_backend.export import export_hf_checkpoint, publish_export
from orl.trainer.megatron_backend.model import MegatronPolicy, load_megatron_policy
from orl.trainer.megatron_backend.parallel import ParallelContext, dp_group, init_parallel, shutdown_parallel
from orl.trainer.megatron_backend.settings import MegatronSettings, check_megatron_settings
from orl.trainer.megatron_backend.step import StepResult, local_indices, train_step

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """One flag per MegatronSettings field (booleans as --x / --no-x, Literal choices checked)."""
    parser = argparse.ArgumentParser(
        prog="orl.trainer.megatron_backend.worker", description=__doc__.split("\n\n")[0]
    )
    hints = typing.get_type_hints(MegatronSettings)
    for f in dataclasses.fields(MegatronSettings):
        name = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        if isinstance(kind, types.UnionType):  # `X | None`
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        help_text = f"{f.metadata['help']} [default {f.default}]"
        if kind is bool:
            parser.add_argument(
                name, action=argparse.BooleanOptionalAction, default=f.default, help=help_text
            )
        elif typing.get_origin(kind) is typing.Literal:
            parser.add_argument(name, choices=typing.get_args(kind), default=f.default, help=help_text)
        else:
            parser.add_argument(name, type=kind, default=f.default, help=help_text)
    return parser


def parse_settings(argv: Sequence[str] | None) -> MegatronSettings:
    args = build_parser().parse_args(argv)
    return MegatronSettings(**vars(args))


def batches(samples: Sequence[TrainingSample], batch_size: int) -> list[list[TrainingSample]]:
    return [list(samples[i : i + batch_size]) for i in range(0, len(samples), batch_size)]


def gather_logprobs(
    step: StepResult, samples: Sequence[TrainingSample], parallel: ParallelContext
) -> dict[str, list[float]]:
    """Every sample's pre-update logprobs, by sample id (complete on rank 0; every rank calls it)."""
    per_rank = -(-len(samples) // parallel.dp_size)
    width = max(len(s.response_ids) for s in samples)
    mine = torch.zeros((per_rank, width), dtype=torch.float32, device=parallel.device)
    for row, values in enumerate(step.logprobs):
        mine[row, : values.shape[0]] = values.to(parallel.device)
    parts = [torch.empty_like(mine) for _ in range(parallel.dp_size)]
    if parallel.dp_size > 1:
        dist.all_gather(parts, mine, group=dp_group())
    else:
        parts = [mine]
    found: dict[str, list[float]] = {}
    for dp_rank, part in enumerate(parts):
        shifted = dataclasses.replace(parallel, dp_rank=dp_rank)
        for row, index in enumerate(local_indices(len(samples), shifted)):
            sample = samples[index]
            found[sample.sample_id] = part[row, : len(sample.response_ids)].tolist()
    return found


def _finish(
    policy: MegatronPolicy,
    settings: MegatronSettings,
    steps: list[dict[str, Any]],
    samples: list[TrainingSample],
) -> dict[str, Any]:
    """Export and/or publish the final weights; returns what the report says about them."""
    done: dict[str, Any] = {}
    if settings.export_dir is not None:
        files = export_hf_checkpoint(policy, settings.export_dir)
        done["export_files"] = [p.name for p in files]
        dist.barrier()
    if settings.store_url:
        store = open_object_store(
            settings.store_url,
            access_key=settings.s3_access_key or None,
            secret_key=settings.s3_secret_key or None,
        )
        version = settings.version or len(steps)
        manifest = publish_export(
            policy,
            store,
            settings.run_id,
            version,
            settings.work_dir,
            base_model=settings.base_model or str(settings.model_dir),
            sample_ids=[s.sample_id for s in samples],
            metrics={"step": version, **(steps[-1] if steps else {})},
        )
        if manifest is not None:
            done["manifest_key"], done["manifest_sha256"] = manifest.manifest_key, manifest.sha256
    return done


def run(settings: MegatronSettings, local_rank: int) -> dict[str, Any]:
    """Train on the samples file and export; returns the report (complete on rank 0)."""
    check_megatron_settings(settings)
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    parallel = init_parallel(settings.device, settings.tensor_parallel, local_rank, settings.seed)
    try:
        samples = read_samples(settings.samples_file)
        policy = load_megatron_policy(settings.model_dir, parallel, with_reference=settings.beta_kl != 0)
        optimizer = torch.optim.AdamW(
            policy.trainable_parameters(), lr=settings.lr, betas=(0.9, 0.999), weight_decay=0.0
        )
        steps: list[dict[str, Any]] = []
        first_logprobs: dict[str, list[float]] = {}
        for index, chunk in enumerate(batches(samples, settings.batch_size)):
            batch = Batch(tuple(chunk), {}, {}, tuple(0 for _ in chunk))
            step = train_step(
                policy, optimizer, batch, loss_config(settings, settings.autocast), settings.grad_clip
            )
            if index == 0:
                first_logprobs = gather_logprobs(step, chunk, parallel)
            steps.append(step.metrics)
            m = step.metrics
            log.info(
                "step %d: loss %.6f (pg %.6f) kl %.6f grad %.4f | %d samples %d tokens %.2f s",
                index + 1,
                m["loss"],
                m["pg_loss"],
                m["kl"],
                m["grad_norm"],
                len(chunk),
                m["tokens"],
                m["duration_s"],
            )
        report = {
            "steps": steps,
            "first_step_logprobs": first_logprobs,
            **_finish(policy, settings, steps, samples),
        }
        if parallel.is_writer and settings.report_file is not None:
            settings.report_file.write_text(json.dumps(report, indent=1, allow_nan=True))
        return report
    finally:
        shutdown_parallel()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point under torchrun (reads LOCAL_RANK, as torchrun sets it); returns the exit code."""
    settings = parse_settings(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        run(settings, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    except OrlError as error:
        log.error("%s", error)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
