"""The megatron-core trainer backend under torchrun on CPU (gloo), against the torch backend.

Each run launches real processes: `torchrun --standalone --nproc-per-node N -m
tests.support.megatron_cpu ...` (the worker with the two test-only CPU patches of megatron-core).
The torch backend's reference is `orl.trainer.torch_backend.train_step` on `orl.trainer.policy_model` (kind "full",
fp32, no autocast), with the same AdamW and gradient clipping.

- A tiny random Llama (4 heads, 2 KV heads, tied embeddings) at TP=2 x DP=2, two steps, rollout
  pi_old (ratios != 1, some clipped), reward centring and the KL term: every loss statistic, the
  gradient norm, the logprobs and the weights after two steps match.
- SmolLM2-135M-Instruct at TP=3 (its 9 heads and 3 KV heads divide by 3, not by 2), one step: loss,
  logprobs and gradient norm match; the published checkpoint passes serving's verification, loads in
  transformers and in serving's backend, generates, and its weights moved as the torch backend's.
- SmolLM2 at TP=3 with lr 0: the exported weights equal the base model's, bit for bit.

Tolerances (fp32 everywhere): per-token logprobs within 1e-4 nats, loss statistics within 1e-4
relative, gradient norm within 1e-3 relative (30 layers of reordered fp32 sums).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.connectors.checkpoint_store import download_and_verify, latest_checkpoint
from orl.connectors.event_log.base import TopicPartition
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.serving.policy.base import SamplingParams
from orl.serving.policy.transformers_backend import TransformersBackend
from orl.trainer.batching import Batch, TrainingSample
from orl.trainer.logprobs import response_logprobs
from orl.trainer.megatron_backend.batch_file import write_samples
from orl.trainer.policy_model import PolicyModel, load_policy
from orl.trainer.settings import TrainSettings
from orl.trainer.torch_backend import train_step
from safetensors.torch import load_file

pytestmark = [pytest.mark.model, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LOGPROB_ATOL = 1e-4
STAT_RTOL = 1e-4
GRAD_NORM_RTOL = 1e-3
COMPARED_STATS = ("loss", "pg_loss", "kl", "clip_fraction", "advantage_mean", "opd_advantage_mean")


def run_worker(nproc: int, args: list[str], report: Path) -> dict[str, Any]:
    """torchrun the CPU-patched worker; the rank-0 report (fails with the processes' output)."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "tests.support.megatron_cpu", "--device", "cpu", "--threads", "1",
        "--report-file", str(report), *args,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, (
        f"torchrun failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    )
    return dict(json.loads(report.read_text()))


@dataclass
class TorchRun:
    """The torch backend after the same steps: per-step metrics, first-step logprobs, the policy."""

    steps: list[dict[str, Any]]
    logprobs: dict[str, list[float]]
    policy: PolicyModel


def torch_backend(model_dir: Path, batches: list[list[TrainingSample]], settings: TrainSettings) -> TorchRun:
    torch.manual_seed(0)
    policy = load_policy(model_dir, "full")
    with torch.no_grad():
        first = batches[0]
        rows = response_logprobs(
            policy.module, [list(s.prompt_ids) for s in first], [list(s.response_ids) for s in first],
            [s.temperature if settings.train_temperature is None else settings.train_temperature for s in first],
            autocast=False,
        )  # fmt: skip  # at the training temperature, as the worker reports them
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=settings.effective_lr(), betas=(0.9, 0.999), weight_decay=0.0
    )
    steps = []
    for samples in batches:
        batch = Batch(tuple(samples), {}, {}, tuple(0 for _ in samples))
        steps.append(train_step(policy, optimizer, batch, settings).metrics)
    return TorchRun(steps, {s.sample_id: r.tolist() for s, r in zip(first, rows, strict=True)}, policy)


def assert_same_steps(megatron: list[dict[str, Any]], reference: list[dict[str, Any]]) -> None:
    """Every compared statistic within tolerance (prints the worst relative differences, for -s)."""
    assert len(megatron) == len(reference)
    worst_loss = max(
        abs(g["loss"] - w["loss"]) / abs(w["loss"]) for g, w in zip(megatron, reference, strict=True)
    )
    worst_norm = max(
        abs(g["grad_norm"] - w["grad_norm"]) / w["grad_norm"]
        for g, w in zip(megatron, reference, strict=True)
    )
    print(f"worst relative difference: loss {worst_loss:.1e}, gradient norm {worst_norm:.1e}")
    for index, (got, want) in enumerate(zip(megatron, reference, strict=True)):
        assert got["sample_ids"] == want["sample_ids"] and got["tokens"] == want["tokens"]
        for name in COMPARED_STATS:
            assert math.isclose(got[name], want[name], rel_tol=STAT_RTOL, abs_tol=1e-6), (
                index,
                name,
                got,
                want,
            )
        assert math.isclose(got["grad_norm"], want["grad_norm"], rel_tol=GRAD_NORM_RTOL), (index, got, want)


def assert_same_logprobs(megatron: dict[str, list[float]], reference: dict[str, list[float]]) -> None:
    assert sorted(megatron) == sorted(reference)
    worst = max(
        float((torch.tensor(megatron[k]) - torch.tensor(reference[k])).abs().max()) for k in reference
    )
    print(f"worst per-token logprob difference: {worst:.1e} nats")
    assert worst < LOGPROB_ATOL, worst


def loss_flags(settings: TrainSettings) -> list[str]:
    return [
        "--lr", str(settings.effective_lr()), "--beta-kl", str(settings.beta_kl),
        "--old-logprobs", settings.old_logprobs, "--grad-clip", str(settings.grad_clip),
        "--center-rewards" if settings.center_rewards else "--no-center-rewards",
        "--loss-reduction", settings.loss_reduction, "--kl-estimator", settings.kl_estimator,
        "--opd-anchor", str(settings.opd_anchor),
        *([] if settings.train_temperature is None else ["--train-temperature", str(settings.train_temperature)]),
    ]  # fmt: skip


# -- a tiny random Llama at TP=2 x DP=2 -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:  # norms start at 1: move them so a wrong norm mapping shows
                parameter.add_(0.1 * torch.randn_like(parameter))
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    return out


def tiny_samples(count: int) -> list[TrainingSample]:
    """Mixed methods and temperatures; rollout logprobs near the random model's (~ -5.5), so ratios vary."""
    rng = random.Random(7)
    methods = ("binary", "opd", "combined", "combined")
    samples = []
    for i in range(count):
        method = methods[i % 4]
        response = [rng.randrange(256) for _ in range(2 + i % 5)]
        samples.append(
            TrainingSample(
                sample_id=f"tiny-{i}",
                method=method,
                prompt_ids=tuple(rng.randrange(256) for _ in range(2 + i % 4)),
                response_ids=tuple(response),
                rollout_logprobs=tuple(-5.5 + rng.uniform(-0.4, 0.4) for _ in response),
                temperature=(1.0, 0.7, 0.0, 1.3)[i % 4],
                reward=None if method == "opd" or i == 3 else rng.choice((1.0, -1.0)),
                teacher_logprobs=None
                if method == "binary"
                else tuple(-5.0 - 0.1 * j for j in range(len(response))),
                policy_version=0,
                position=TopicPartition("samples-file", 0),
                offset=i,
            )
        )
    return samples


# opd_anchor 0.5 takes the base's logprobs from the KL's reference forward (each sample at its own
# temperature), or, with a train temperature, from a forward of its own (recomputed pi_old: no clipping)
ANCHORED = {"opd_anchor": 0.5}
ANCHORED_OWN_FORWARD = {"opd_anchor": 0.5, "old_logprobs": "recompute", "train_temperature": 1.0}


@pytest.mark.parametrize(
    ("reduction", "kl_estimator", "overrides"),
    [("token", "k3", {}), ("sample", "k3", ANCHORED), ("token", "exact", ANCHORED_OWN_FORWARD)],
    ids=["token-k3", "sample-k3-anchored", "token-exact-anchored"],
)
def test_tiny_llama_tp2_dp2_matches_the_torch_backend(
    tiny_model_dir: Path, tmp_path: Path, reduction: str, kl_estimator: str, overrides: dict[str, Any]
) -> None:
    samples = tiny_samples(8)
    write_samples(tmp_path / "samples.jsonl", samples)
    settings = TrainSettings(
        kind="full",
        lr=1e-3,
        beta_kl=0.05,
        old_logprobs="rollout",
        center_rewards=True,
        precision="fp32",
        train_temperature=None,
        loss_reduction=reduction,
        kl_estimator=kl_estimator,
    )
    settings = dataclasses.replace(settings, **overrides)
    report = run_worker(
        4,
        ["--model-dir", str(tiny_model_dir), "--samples-file", str(tmp_path / "samples.jsonl"),
         "--tensor-parallel", "2", "--batch-size", "4", "--export-dir", str(tmp_path / "export"),
         *loss_flags(settings)],
        tmp_path / "report.json",
    )  # fmt: skip
    reference = torch_backend(tiny_model_dir, [samples[:4], samples[4:]], settings)
    assert [s["data_parallel"] for s in report["steps"]] == [2, 2]
    assert_same_steps(report["steps"], reference.steps)
    assert report["steps"][1]["kl"] > 0  # the KL term at work, and (with rollout pi_old) the clip
    assert report["steps"][0]["clip_fraction"] > 0 or settings.old_logprobs == "recompute"
    assert_same_logprobs(report["first_step_logprobs"], reference.logprobs)
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    trained = reference.policy.module.state_dict()
    for name, tensor in exported.items():
        assert torch.allclose(tensor, trained[name], atol=1e-4), name


# -- SmolLM2-135M-Instruct at TP=3 -------------------------------------------------------------


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(str(rendered), add_special_tokens=False))


@pytest.fixture(scope="module")
def smol_samples(base_model_dir: Path) -> list[TrainingSample]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    turns = [
        ("What is 2 + 2?", "2 + 2 is 4.", "binary", 1.0, 1.0),
        ("Name a color.", "Blue is a color.", "opd", 0.7, None),
        ("Say hi.", "Hello there!", "combined", 0.0, -1.0),
    ]
    samples = []
    for i, (question, answer, method, temperature, reward) in enumerate(turns):
        response = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
        samples.append(
            TrainingSample(
                sample_id=f"smol-{i}",
                method=method,
                prompt_ids=tuple(chat_ids(tokenizer, question)),
                response_ids=tuple(response),
                rollout_logprobs=tuple(-1.0 for _ in response),
                temperature=temperature,
                reward=reward,
                teacher_logprobs=None
                if method == "binary"
                else tuple(-0.5 - 0.1 * j for j in range(len(response))),
                policy_version=0,
                position=TopicPartition("samples-file", 0),
                offset=i,
            )
        )
    return samples


# train_temperature None: the worker scores each sample at its own temperature (it has no such flag)
SMOL_SETTINGS = TrainSettings(
    kind="full", lr=1e-5, beta_kl=0.02, precision="fp32", run_id="megatron-test", train_temperature=None
)


@pytest.fixture(scope="module")
def smol_run(
    base_model_dir: Path, smol_samples: list[TrainingSample], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """One step at TP=3, published to a local object store as version 1."""
    work = tmp_path_factory.mktemp("megatron-smol")
    write_samples(work / "samples.jsonl", smol_samples)
    report = run_worker(
        3,
        ["--model-dir", str(base_model_dir), "--samples-file", str(work / "samples.jsonl"),
         "--tensor-parallel", "3", "--batch-size", "3", "--store-url", f"file://{work / 'objects'}",
         "--run-id", SMOL_SETTINGS.run_id, "--base-model", "smollm2-135m", "--work-dir", str(work / "scratch"),
         *loss_flags(SMOL_SETTINGS)],
        work / "report.json",
    )  # fmt: skip
    return {**report, "work": work}


@pytest.fixture(scope="module")
def smol_reference(base_model_dir: Path, smol_samples: list[TrainingSample]) -> TorchRun:
    torch.set_num_threads(2)
    return torch_backend(base_model_dir, [smol_samples], SMOL_SETTINGS)


def test_smollm2_tp3_loss_and_logprobs_match_the_torch_backend(
    smol_run: dict[str, Any], smol_reference: TorchRun
) -> None:
    assert smol_run["steps"][0]["tensor_parallel"] == 3
    assert_same_steps(smol_run["steps"], smol_reference.steps)
    assert_same_logprobs(smol_run["first_step_logprobs"], smol_reference.logprobs)


async def serve_checkpoint(
    base_model_dir: Path, folder: Path, samples: list[TrainingSample]
) -> tuple[str, list[list[float]]]:
    """Serving's backend hot-swaps the folder in: a greedy reply and its fp32 scores of the samples."""
    backend = TransformersBackend(base_model_dir, autocast_dtype=None, num_threads=2)
    await backend.start()
    try:
        await backend.load_checkpoint(folder, 1, "full")
        assert backend.policy_version == 1
        prompt = backend.chat_template.render([{"role": "user", "content": "What is the capital of France?"}])
        reply = await backend.generate(prompt, SamplingParams(temperature=0.0, max_tokens=8))
        scores = [await backend.score(list(s.prompt_ids), list(s.response_ids)) for s in samples]
        return reply.text, scores
    finally:
        await backend.close()


def test_smollm2_export_is_published_verified_and_served(
    smol_run: dict[str, Any],
    smol_reference: TorchRun,
    smol_samples: list[TrainingSample],
    base_model_dir: Path,
) -> None:
    from transformers import AutoModelForCausalLM

    store = LocalObjectStore(smol_run["work"] / "objects")
    manifest = latest_checkpoint(store, SMOL_SETTINGS.run_id)
    assert manifest is not None and manifest.version == 1 and manifest.kind == "full"
    assert manifest.manifest_key == smol_run["manifest_key"] and manifest.base_model == "smollm2-135m"
    folder = smol_run["work"] / "verified"
    download_and_verify(
        store, manifest.manifest_key, folder, expected_manifest_sha256=smol_run["manifest_sha256"]
    )
    assert {"model.safetensors", "config.json", "tokenizer.json", "manifest.json"} <= {
        p.name for p in folder.iterdir()
    }

    # Weights: every tensor moved from the base, by the torch backend's Adam step (sign for sign).
    exported, base = (
        load_file(str(folder / "model.safetensors")),
        load_file(str(base_model_dir / "model.safetensors")),
    )
    assert sorted(exported) == sorted(base)
    trained = smol_reference.policy.module.state_dict()
    same_direction, moved = 0, 0
    for name, tensor in exported.items():
        assert not torch.equal(tensor, base[name]), name
        ours, theirs = tensor - base[name], trained[name] - base[name]
        assert float((ours - theirs).abs().max()) <= 2 * SMOL_SETTINGS.effective_lr() + 1e-6, name
        same_direction += int((torch.sign(ours) == torch.sign(theirs)).sum())
        moved += ours.numel()
    assert same_direction / moved > 0.999

    # transformers loads it as a model folder and generates.
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([list(smol_samples[0].prompt_ids)]), max_new_tokens=4, do_sample=False
        )
    assert out.shape[1] == len(smol_samples[0].prompt_ids) + 4

    # Serving's backend swaps it in, answers, and scores with the trained weights (not the base's).
    reply, scores = asyncio.run(serve_checkpoint(base_model_dir, folder, smol_samples))
    assert reply.strip()
    with torch.no_grad():
        want = response_logprobs(
            smol_reference.policy.module, [list(s.prompt_ids) for s in smol_samples],
            [list(s.response_ids) for s in smol_samples], [1.0] * len(smol_samples), autocast=False,
        )  # fmt: skip
    for got, expected in zip(scores, want, strict=True):
        assert torch.allclose(torch.tensor(got), expected, atol=1e-3)


def test_smollm2_zero_lr_export_round_trips_exactly(
    base_model_dir: Path, smol_samples: list[TrainingSample], tmp_path: Path
) -> None:
    write_samples(tmp_path / "samples.jsonl", smol_samples[:1])
    run_worker(
        3,
        ["--model-dir", str(base_model_dir), "--samples-file", str(tmp_path / "samples.jsonl"),
         "--tensor-parallel", "3", "--lr", "0", "--beta-kl", "0", "--export-dir", str(tmp_path / "export")],
        tmp_path / "report.json",
    )  # fmt: skip
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    base = load_file(str(base_model_dir / "model.safetensors"))
    assert sorted(exported) == sorted(base)
    assert all(torch.equal(exported[name], base[name]) for name in base)
