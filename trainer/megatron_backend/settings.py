"""Settings of the megatron worker (`python -m orl.trainer.megatron_backend.worker`, under torchrun).

Each field is one command-line flag (`--name-with-dashes`); `orl.trainer.megatron_backend.worker`
builds the parser from these fields, so `--help` lists them all. Loss defaults are the torch
backend's (`orl.trainer.settings.TrainSettings`), except two: the learning rate is the full fine-tuning
one (1e-5), since this backend trains every weight, and every sample is scored at its own
temperature (`orl train` defaults to `--train-temperature 1.0`).
Reads nothing from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orl.schemas.errors import ConfigError
from orl.trainer.policy_model import default_lr
from orl.trainer.settings import (
    KlEstimator,
    LossReduction,
    MegatronDevice,
    OldLogprobs,
    OpdLoss,
    loss_flag_problems,
)


def flag(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class MegatronSettings:
    model_dir: Path = flag(Path(), "Hugging Face Llama-family model folder (config.json + safetensors).")
    samples_file: Path = flag(Path(), "JSON lines, one training sample per line (see batch_file.py).")
    tensor_parallel: int = flag(1, "Tensor-parallel size; the torchrun world size must be a multiple.")
    device: MegatronDevice = flag(
        "cuda", "cuda (NCCL) | cpu (gloo; tests only, needs tests/support/megatron_cpu.py)."
    )
    batch_size: int = flag(16, "Samples per optimizer step (the file is cut into batches in order).")
    lr: float = flag(default_lr("full"), "AdamW learning rate (all weights).")
    beta_kl: float = flag(0.02, "Weight of the KL to the base model (0: off, no reference model).")
    kl_estimator: KlEstimator = flag(
        "exact", "KL per token: exact (over the vocabulary) | k3 (from the sampled token)."
    )
    eps_low: float = flag(0.2, "PPO clip below: ratio >= 1 - eps-low.")
    eps_high: float = flag(0.28, "PPO clip above: ratio <= 1 + eps-high.")
    w_opd: float = flag(1.0, "Weight of teacher - old in the combined advantage.")
    w_rl: float = flag(1.0, "Weight of the reward in the combined advantage.")
    center_rewards: bool = flag(False, "Subtract the batch-mean reward (a baseline) before training.")
    prompt_baseline: bool = flag(False, "Subtract the mean reward of the batch's answers to the same prompt.")
    old_logprobs: OldLogprobs = flag("recompute", "pi_old for the PPO ratio: recompute | rollout.")
    loss_reduction: LossReduction = flag(
        "token", "Per-token losses to one: token (batch token mean) | sample."
    )
    opd_advantage_clip: float = flag(0.0, "Clamp teacher - old per token to [-c, c] (0: off).")
    opd_anchor: float = flag(
        1.0, "Share of the OPD advantage's pull back to the base model to keep, in [0, 1]."
    )
    opd_loss: OpdLoss = flag(
        "token", "OPD term: token (teacher - old on the sampled tokens); topk is torch only."
    )
    train_temperature: float | None = flag(
        None, "Temperature of the gradient's logprobs (default: each sample's)."
    )
    autocast: bool = flag(False, "Run forwards under bf16 autocast (fp32 master weights).")
    grad_clip: float = flag(1.0, "Clip the global gradient norm to this (0: off).")
    seed: int = flag(0, "torch and megatron RNG seed.")
    threads: int = flag(0, "torch threads per process (0: torch's default).")
    export_dir: Path | None = flag(None, "Write the final weights here as a Hugging Face folder (rank 0).")
    store_url: str = flag("", "Publish the final weights to this object store (file:///dir or s3://...).")
    s3_access_key: str = flag("", "S3 access key (for an s3:// store).")
    s3_secret_key: str = flag("", "S3 secret key (for an s3:// store).")
    run_id: str = flag("megatron", "Run name: checkpoints/<run-id>/<version>/.")
    version: int = flag(0, "Version to publish (0: the number of steps taken).")
    base_model: str = flag("", "Base model name recorded in the manifest (default: --model-dir).")
    work_dir: Path = flag(Path(".orl/trainer/megatron"), "Local scratch for staging checkpoints.")
    report_file: Path | None = flag(None, "Write per-step metrics and first-step logprobs as JSON (rank 0).")


def check_megatron_settings(settings: MegatronSettings) -> None:
    """ConfigError naming the flag of the first unusable value."""
    problems = [
        (
            not (settings.model_dir / "config.json").is_file(),
            f"--model-dir {settings.model_dir} has no config.json",
        ),
        (not settings.samples_file.is_file(), f"--samples-file {settings.samples_file} does not exist"),
        (settings.tensor_parallel < 1, f"--tensor-parallel must be >= 1, not {settings.tensor_parallel}"),
        (settings.batch_size < 1, f"--batch-size must be >= 1, not {settings.batch_size}"),
        (settings.lr < 0, f"--lr must be >= 0, not {settings.lr}"),
        *loss_flag_problems(settings, "megatron"),
        (
            not settings.run_id or "/" in settings.run_id,
            f"--run-id must be one key segment, not {settings.run_id!r}",
        ),
        (settings.version < 0, f"--version must be >= 0, not {settings.version}"),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)
