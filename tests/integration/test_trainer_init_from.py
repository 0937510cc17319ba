"""`orl train --init-from <run>/<version>`: a new run starts from another run's published checkpoint.

The fast tests publish small stand-in checkpoints (no model) and check the errors, which name the
flag: an unknown run or version (listing the published ones), another kind or base model, a file
that fails verification, and that a run with checkpoints ignores the flag. The model tests train run
r1 for one step on the real SmolLM2, then start run r2 from r1's v1 (LoRA) on other samples, and
`orl replay --train-steps 1 --train-from r1/00000001`.
"""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.connectors.checkpoint_store import Manifest, download_and_verify, publish_checkpoint, version_prefix
from orl.connectors.event_log.base import TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.schemas.errors import ConfigError
from orl.schemas.topics import topic_name
from orl.trainer.checkpointing import prepare_resume
from orl.trainer.logprobs import response_logprobs
from orl.trainer.settings import TrainSettings, check_settings
from orl.trainer.torch_backend import load_resumed_policy, run_trainer
from safetensors.torch import load_file

from tests.integration.test_trainer_loop import (
    NAMESPACE,
    QUESTIONS,
    append,
    chat_ids,
    manifests,
    sample_event,
    settings_for,
)

GOLDEN = Path(__file__).parents[1] / "golden" / "openclaw"
GOLDEN_FILES = tuple(
    str(GOLDEN / f"qwen3_4b_record{suffix}.jsonl") for suffix in ("", "_prm", "_opd")
)  # the openclaw import test's records: some make SampleReady for --method binary
ADAPTER = "adapter_model.safetensors"
R1_LR = 5e-3  # r1's one step moves every LoRA B entry by about this much away from the base
R2_LR = 1e-7  # r2's one step moves no weight by more than this (Adam's first step is at most lr)


# ---- fast: stand-in checkpoints, no model ----


def fake_settings(tmp_path: Path, **overrides: Any) -> TrainSettings:
    base = TrainSettings(
        data_dir=tmp_path, log_url=f"sqlite:///{tmp_path / 'log.db'}", store_url=f"file://{tmp_path / 'objects'}",
        namespace=NAMESPACE, model="base-m", run_id="r2", init_from="r1/00000001",
    )  # fmt: skip
    return replace(base, **overrides)


def publish_fake(
    store: LocalObjectStore, tmp_path: Path, run_id: str, version: int, *, kind: str = "lora", **metrics: Any
) -> Manifest:
    folder = tmp_path / f"src-{run_id}-{version}"
    folder.mkdir()
    names = ("adapter_model.safetensors", "adapter_config.json") if kind == "lora" else ("model.safetensors",)
    for name in names:
        (folder / name).write_bytes(f"{run_id} {version} {name}".encode())
    return publish_checkpoint(
        store, run_id, version, folder, parent_version=version - 1, kind=kind, base_model="base-m",
        consumed_offsets=[], sample_ids=[], metrics={"step": version, "sample_ids": [], **metrics},
    )  # fmt: skip


async def resume_point(settings: TrainSettings) -> Any:
    async with SqliteEventLog(settings.data_dir / "log.db") as log:
        store = LocalObjectStore(settings.data_dir / "objects")
        return await prepare_resume(settings, log, store, settings.data_dir / "work")


async def test_latest_resolves_verifies_and_records_the_start(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    publish_fake(store, tmp_path, "r1", 1)
    v2 = publish_fake(store, tmp_path, "r1", 2)
    point = await resume_point(fake_settings(tmp_path, init_from="r1/latest"))
    assert point.version == 0 and point.manifest is None and point.consumed_offsets == {}
    assert point.init_from == {
        "run_id": "r1", "version": 2, "manifest_key": v2.manifest_key, "manifest_sha256": v2.sha256,
    }  # fmt: skip
    assert point.checkpoint_dir is not None
    assert (point.checkpoint_dir / ADAPTER).read_bytes() == b"r1 2 adapter_model.safetensors"


async def test_an_unknown_run_or_version_lists_the_published_ones(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    publish_fake(store, tmp_path, "r1", 1)
    publish_fake(store, tmp_path, "r1", 2)
    with pytest.raises(ConfigError) as error:
        await resume_point(fake_settings(tmp_path, init_from="r1/7"))
    message = str(error.value)
    assert message.startswith("--init-from r1/7: no checkpoint r1/00000007 in file://")
    assert message.endswith("checkpoints/r1/: published versions are r1/00000001, r1/00000002")
    with pytest.raises(ConfigError, match=r"--init-from nope/latest: no checkpoint nope/latest .* are none$"):
        await resume_point(fake_settings(tmp_path, init_from="nope/latest"))


async def test_another_kind_or_base_model_is_refused(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    publish_fake(store, tmp_path, "r1", 1)
    publish_fake(store, tmp_path, "f1", 1, kind="full")
    with pytest.raises(
        ConfigError, match=r"--init-from r1/00000001: r1/00000001 is a lora checkpoint .* --kind full"
    ):
        await resume_point(fake_settings(tmp_path, kind="full"))
    with pytest.raises(
        ConfigError, match=r"--init-from f1/1: f1/00000001 is a full checkpoint .* --kind lora"
    ):
        await resume_point(fake_settings(tmp_path, init_from="f1/1"))
    with pytest.raises(ConfigError, match=r"--init-from r1/00000001: .* from --model 'base-m', not 'other'"):
        await resume_point(fake_settings(tmp_path, model="other"))


async def test_a_checkpoint_that_fails_verification_is_refused(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    manifest = publish_fake(store, tmp_path, "r1", 1)
    store.put(manifest.prefix + ADAPTER, b"tampered")
    with pytest.raises(ConfigError, match=r"^--init-from r1/00000001: checkpoint .* rejected: size mismatch"):
        await resume_point(fake_settings(tmp_path))


async def test_a_run_with_checkpoints_resumes_and_ignores_the_flag(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    start = {"run_id": "r1", "version": 1, "manifest_key": "k", "manifest_sha256": "h"}
    publish_fake(store, tmp_path, "r2", 1, init_from=start)
    # the flag names a checkpoint that does not exist: it is not even looked up
    point = await resume_point(fake_settings(tmp_path, init_from="gone/00000003"))
    assert point.version == 1 and point.manifest is not None and point.init_from == start
    assert "--init-from gone/00000003 is ignored" in caplog.text


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"init_from": "r1"}, "--init-from must be <run-id>/<version> or <run-id>/latest, not 'r1'"),
        ({"init_from": "r1/v3"}, "--init-from must be <run-id>/<version> or <run-id>/latest, not 'r1/v3'"),
        ({"init_from": "r2/1"}, "--init-from r2/1 names this run ('r2')"),
        ({"backend": "megatron", "kind": "full"}, "--init-from is not supported with --backend megatron"),
    ],
)
def test_bad_flags_are_named(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        check_settings(fake_settings(tmp_path, **overrides))
    assert str(error.value).startswith(message)


def test_the_cli_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from orl.cli import main

    assert main(["train", "--init-from", "just-a-run"]) == 1
    assert "orl train: error: --init-from must be <run-id>/<version>" in capsys.readouterr().err
    assert main(["replay", "--target-namespace", "x", "--train-from", "a/b/c"]) == 1
    assert "orl replay: error: --train-from must be <run-id>/<version>" in capsys.readouterr().err


# ---- the real model ----


@pytest.fixture(scope="module")
def samples(base_model_dir: Path) -> list[dict[str, Any]]:
    """Training samples without sampling: each question's prompt and a fixed short answer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    response = list(tokenizer.encode("I am not sure.", add_special_tokens=False)) + [2]  # 2: <|im_end|>
    return [
        sample_event(i, {"prompt": chat_ids(tokenizer, q), "response": response,
                         "rollout": [-1.0] * len(response), "teacher": None}, reward=1.0 if i % 2 else -1.0)
        for i, q in enumerate(QUESTIONS)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def r1_root(tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path, samples: list[dict]) -> Path:
    """A folder whose `objects/` holds run r1 trained for one step (v1, LoRA) from the base model."""
    root = tmp_path_factory.mktemp("r1")

    async def train() -> int:
        async with SqliteEventLog(root / "log.db") as log:
            await log.create_topics([TopicSpec(topic_name(NAMESPACE, "samples"))])
            await append(log, samples[0:2])
            settings = settings_for(root, base_model_dir, lr=R1_LR, max_steps=1)
            return await run_trainer(
                settings, log, LocalObjectStore(root / "objects"), base_model_dir, root / "w"
            )

    assert asyncio.run(train()) == 1
    return root


def adapter(store: LocalObjectStore, manifest: Manifest, dest: Path) -> dict[str, torch.Tensor]:
    download_and_verify(store, manifest.manifest_key, dest, manifest.sha256)
    return load_file(dest / ADAPTER)


def fixed_prompt_logprobs(module: torch.nn.Module, sample: dict[str, Any]) -> torch.Tensor:
    prompt, response = [sample["prompt_token_ids"]], [sample["response_token_ids"]]
    with torch.no_grad():
        return response_logprobs(module, prompt, response, [1.0], autocast=False)[0]


@pytest.mark.model
@pytest.mark.slow
async def test_a_new_run_starts_from_another_runs_checkpoint(
    tmp_path: Path, base_model_dir: Path, samples: list[dict], r1_root: Path
) -> None:
    shutil.copytree(r1_root / "objects", tmp_path / "objects")
    store = LocalObjectStore(tmp_path / "objects")
    r1 = manifests(store, "r1")[1]
    settings = settings_for(
        tmp_path, base_model_dir, run_id="r2", init_from="r1/00000001", lr=R2_LR, max_steps=1
    )
    async with SqliteEventLog(tmp_path / "log.db") as log:
        await log.create_topics([TopicSpec(topic_name(NAMESPACE, "samples"))])
        await append(log, samples[2:4])  # other samples than r1's

        # What run_trainer loads: r1's v1 as the policy, the base model as the KL reference.
        point = await prepare_resume(settings, log, store, tmp_path / "w0")
        policy = load_resumed_policy(settings, base_model_dir, point)
        fixed = samples[7]
        with policy.reference() as reference:
            ref_lp = fixed_prompt_logprobs(reference, fixed)
        start_lp = fixed_prompt_logprobs(policy.module, fixed)
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32).eval()
        base_lp = fixed_prompt_logprobs(base, fixed)
        assert torch.allclose(ref_lp, base_lp, atol=1e-5)
        assert float((start_lp - base_lp).abs().max()) > 1e-3
        del policy, base

        assert await run_trainer(settings, log, store, base_model_dir, tmp_path / "w1") == 1
        found = manifests(store, "r2")
        assert sorted(found) == [1] and found[1].parent_version == 0
        start = {"run_id": "r1", "version": 1, "manifest_key": r1.manifest_key, "manifest_sha256": r1.sha256}
        assert found[1].metrics["init_from"] == start
        assert found[1].metrics["sample_ids"] == [s["envelope"]["event_id"] for s in samples[2:4]]
        # The KL is measured against the base: 0 at r1's first step (it started there), not at r2's.
        assert r1.metrics["kl"] < 1e-6 < found[1].metrics["kl"]

        # r2's v1 is one step of at most R2_LR from r1's v1, while r1's v1 is about R1_LR from a fresh
        # adapter (B = 0): r2 cannot have started anywhere else.
        r1_w, r2_w = adapter(store, r1, tmp_path / "r1v1"), adapter(store, found[1], tmp_path / "r2v1")
        assert r1_w.keys() == r2_w.keys()
        moved = max(float((r2_w[k] - r1_w[k]).abs().max()) for k in r1_w)
        assert 0 < moved <= 1.5 * R2_LR
        assert max(float(r1_w[k].abs().max()) for k in r1_w if "lora_B" in k) > 0.5 * R1_LR

        # Restarted with another --init-from: r2 resumes from its own v1 and keeps its recorded start.
        await append(log, samples[4:6])
        again = replace(settings, init_from="gone/00000009")
        assert await run_trainer(again, log, store, base_model_dir, tmp_path / "w2") == 1
        found = manifests(store, "r2")
        assert found[2].parent_version == 1 and found[2].metrics["init_from"] == start


@pytest.mark.model
@pytest.mark.slow
def test_replay_trains_from_the_chosen_checkpoint(
    tmp_path: Path, base_model_dir: Path, r1_root: Path, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from orl.history import ReplaySettings, run_replay

    shutil.copytree(r1_root / "objects", tmp_path / "objects")
    monkeypatch.setenv("ORL_TRAIN_BATCH_SIZE", "1")  # the `orl train` child reads it: one sample makes a step
    settings = ReplaySettings(
        data_dir=tmp_path, source="openclaw", openclaw_files=GOLDEN_FILES,
        target_namespace="imported", method="binary", import_logprobs="placeholder",
        model=str(base_model_dir), progress=False, train_steps=1, train_from="r1/00000001",
    )  # fmt: skip
    assert run_replay(settings) == 0
    captured = capfd.readouterr()
    out = captured.out
    assert "training: orl train --namespace imported --run-id imported" in out
    assert "--init-from r1/00000001 --max-steps 1" in out
    store = LocalObjectStore(tmp_path / "objects")
    found = manifests(store, "imported")
    assert sorted(found) == [1], captured.err[-4000:]
    r1 = manifests(store, "r1")[1]
    assert found[1].metrics["init_from"]["manifest_sha256"] == r1.sha256
    assert found[1].manifest_key == version_prefix("imported", 1) + "manifest.json"
