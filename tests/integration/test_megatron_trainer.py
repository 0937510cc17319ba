"""`orl train --backend megatron` end to end on CPU: torchrun, gloo, a SQLite log, a local object store.

The real entry point (`orl.cli.main`) runs under `torchrun --no-python`, in a Python whose only
addition is the two test-only CPU patches of megatron-core (tests/support/megatron_cpu.py), on a tiny
random Llama at tensor parallel 2. It consumes SampleReady / SampleRejected events from the samples
topic, steps twice, and publishes two checkpoints; the same events trained by the torch backend
(in-process, kind full, fp32, both at --train-temperature 1 on samples drawn at 0.7) give the same
batches, offsets, metrics keys and losses. A restart
resumes from the newest manifest: it trains only the samples after it, starting from the v2 weights.
The quick tests check the settings, the refusal without torchrun and the compose service.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.connectors.checkpoint_store import Manifest, download_and_verify, sample_ids_digest, version_prefix
from orl.connectors.event_log.base import ConsumedRecord, OutgoingRecord, TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.schemas.codec import decode, encode
from orl.schemas.errors import ConfigError
from orl.schemas.events import make_event
from orl.schemas.topics import topic_name
from orl.trainer.settings import TrainSettings, check_settings
from orl.trainer.torch_backend import run_trainer
from safetensors.torch import load_file

from orl.cli import build_parser
from orl.cli import main as orl_main
from orl.settings_binding import build_settings

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "mt"
RUN = "megatron-run"
LR = 1e-3
# The orl CLI with the test-only CPU patches applied first (torchrun --no-python runs this Python).
CPU_ORL = (
    "import sys; from tests.support.megatron_cpu import apply_cpu_patches; apply_cpu_patches(); "
    "from orl.cli import main; sys.exit(main(sys.argv[1:]))"
)


# ---- quick checks: settings, the torchrun refusal, the compose service --------------------------


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"backend": "megatron", "kind": "lora"}, "--backend megatron trains full weights only"),
        ({"backend": "megatron", "kind": "full", "tensor_parallel": 0}, "--tensor-parallel must be >= 1"),
        ({"tensor_parallel": 2}, "--tensor-parallel 2 needs --backend megatron"),
        ({"backend": "megatron", "kind": "full", "megatron_timeout_s": 0}, "--megatron-timeout-s"),
    ],
)
def test_bad_backend_settings_name_the_flag(overrides: dict[str, Any], flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        check_settings(TrainSettings(**overrides))


def test_the_flags_and_variables_reach_the_settings() -> None:
    args = build_parser().parse_args(["train", "--backend", "megatron", "--kind", "full"])
    settings = build_settings(
        args._settings_cls, args, {"ORL_TRAIN_TENSOR_PARALLEL": "4", "ORL_TRAIN_MEGATRON_TIMEOUT_S": "60"}
    )
    assert (settings.backend, settings.kind, settings.tensor_parallel) == ("megatron", "full", 4)
    assert settings.megatron_timeout_s == 60.0 and settings.megatron_device == "cuda"
    check_settings(settings)


def test_without_torchrun_it_refuses_and_prints_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    code = orl_main(
        [
            "train",
            "--backend",
            "megatron",
            "--kind",
            "full",
            "--tensor-parallel",
            "2",
            "--data-dir",
            str(tmp_path),
        ]
    )
    error = capsys.readouterr().err
    assert code == 1
    assert "torchrun environment" in error
    assert (
        "torchrun --standalone --nproc-per-node=<GPUs on this node> --no-python orl train --backend megatron "
        "--kind full --tensor-parallel 2" in error
    )


def test_compose_runs_the_megatron_trainer_under_torchrun(tmp_path: Path) -> None:
    """The gpu profile's train-megatron service: torchrun, then an `orl train` line the CLI accepts."""
    from tests.unit.test_compose import resolve, sample_env, write_env

    config = resolve(write_env(tmp_path / "orl.env", sample_env()), "--profile", "gpu")
    service = config["services"]["train-megatron"]
    assert service["profiles"] == ["gpu"]
    assert service["entrypoint"] == ["torchrun"]
    command = list(service["command"])
    orl_argv = command[command.index("orl") + 1 :]
    launcher = command[: command.index("orl")]
    assert "--no-python" in launcher
    args = build_parser().parse_args(orl_argv)
    assert args.command == "train"
    settings = build_settings(args._settings_cls, args, service["environment"])
    check_settings(settings)
    assert (settings.backend, settings.kind) == ("megatron", "full")
    nproc = int(launcher[launcher.index("--nproc-per-node") + 1])
    assert nproc % settings.tensor_parallel == 0
    known = {f.metadata["env"] for f in TrainSettings.__dataclass_fields__.values() if f.metadata.get("env")}
    given = {k for k in service["environment"] if k.startswith("ORL_")}
    assert given - known - {"ORL_LOG_LEVEL"} == set()
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]
    assert service["environment"]["ORL_STORE_URL"].startswith("s3://")
    assert service["environment"]["ORL_LOG_URL"] == "kafka://kafka:9092"


# ---- end to end under torchrun ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama (4 heads, 2 KV heads, tied embeddings): splits over 2 tensor-parallel ranks."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=True,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(out)
    return out


def sample_event(index: int, policy_version: int = 0) -> dict[str, Any]:
    rng = random.Random(index)
    method = ("binary", "combined", "opd")[index % 3]
    response = [rng.randrange(3, 256) for _ in range(3 + index % 3)]
    return make_event(
        "SampleReady", namespace=NAMESPACE, producer="test", occurred_at_ms=1000 + index,
        id_parts=[index], session_id=f"s{index}", turn_id=f"t{index}", method=method,
        prompt_token_ids=[rng.randrange(3, 256) for _ in range(4)], response_token_ids=response,
        old_logprobs=[-5.5] * len(response), temperature=0.7,
        reward=None if method == "opd" else rng.choice((1.0, -1.0)),
        teacher_logprobs=None if method == "binary" else [-5.0] * len(response),
        teacher_kind=None if method == "binary" else "frozen_reference",
        policy_version=policy_version, promoted=False, off_policy=False,
        lineage={"request_event_id": f"req{index}", "response_event_id": f"resp{index}"},
    )  # fmt: skip


def rejected_event(index: int) -> dict[str, Any]:
    return make_event(
        "SampleRejected", namespace=NAMESPACE, producer="test", occurred_at_ms=1000 + index,
        id_parts=[index, "rejected"], session_id=f"s{index}", turn_id=f"t{index}", method="opd",
        reason="no_valid_hint", lineage={"request_event_id": f"req{index}", "response_event_id": f"resp{index}"},
    )  # fmt: skip


async def append(db: Path, events: list[dict[str, Any]]) -> None:
    async with SqliteEventLog(db) as log:
        topic = topic_name(NAMESPACE, "samples")
        await log.create_topics([TopicSpec(topic)])
        await log.append_batch(topic, [OutgoingRecord(value=encode(e), key=b"k") for e in events])


async def read_topic(db: Path, topic: str) -> list[dict[str, Any]]:
    async with SqliteEventLog(db) as log:
        total = sum((await log.end_offsets(topic)).values())
        out: list[ConsumedRecord] = []
        async with log.consumer(f"check-{topic}-{total}", [topic]) as consumer:
            await consumer.seek_to_beginning()
            while len(out) < total:
                out += await consumer.poll(timeout_s=1.0)
    return [decode(r.value) for r in out]


def manifests(store: LocalObjectStore, run_id: str) -> dict[int, Manifest]:
    found = {}
    for key in store.list(f"checkpoints/{run_id}/"):
        if key.endswith("/manifest.json"):
            manifest = Manifest.from_json(store.get(key))
            found[manifest.version] = manifest
    return found


def orl_flags(tmp_path: Path, model_dir: Path, run_id: str, max_steps: int) -> list[str]:
    return [
        "--data-dir", str(tmp_path), "--model", str(model_dir), "--namespace", NAMESPACE,
        "--run-id", run_id, "--kind", "full", "--lr", str(LR), "--batch-size", "2",
        "--max-steps", str(max_steps), "--precision", "fp32", "--poll-timeout-s", "0.2", "--idle-exit-s", "20",
        "--threads", "1", "--train-temperature", "1.0",
    ]  # fmt: skip


def torchrun_orl_train(
    tmp_path: Path, model_dir: Path, max_steps: int, *flags: str, exit_code: int = 0
) -> str:
    """`torchrun --no-python python -c CPU_ORL train --backend megatron ...` in 2 processes; its output."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--no-python",
        sys.executable, "-c", CPU_ORL, "train", "--backend", "megatron", "--megatron-device", "cpu",
        *orl_flags(tmp_path, model_dir, RUN, max_steps), *flags,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert (done.returncode == 0) == (exit_code == 0), (
        f"torchrun exited {done.returncode}:\n{output[-10000:]}"
    )
    return output


def weights(store: LocalObjectStore, manifest: Manifest, dest: Path) -> dict[str, torch.Tensor]:
    download_and_verify(store, manifest.manifest_key, dest, manifest.sha256)
    return load_file(str(dest / "model.safetensors"))


@pytest.mark.slow
def test_orl_train_megatron_two_steps_then_exact_resume(tiny_model_dir: Path, tmp_path: Path) -> None:
    db = tmp_path / "log.db"
    store = LocalObjectStore(tmp_path / "objects")
    ready = [sample_event(i) for i in range(6)] + [sample_event(6, policy_version=2)]  # not stale at v3
    ids = [e["envelope"]["event_id"] for e in ready]
    # offsets: 0 s0, 1 s1, 2 rejected, 3 s2, 4 s3, 5 s4 (polled in step 2, not trained: not covered)
    asyncio.run(append(db, [ready[0], ready[1], rejected_event(99), ready[2], ready[3], ready[4]]))

    output = torchrun_orl_train(tmp_path, tiny_model_dir, 2, "--tensor-parallel", "2")
    assert "tensor parallel 2 x data parallel 1 on cpu" in output
    found = manifests(store, RUN)
    assert sorted(found) == [1, 2]
    assert [found[1].parent_version, found[2].parent_version] == [0, 1]
    assert found[1].kind == "full" and found[1].base_model == str(tiny_model_dir)
    assert found[1].metrics["sample_ids"] == ids[0:2]
    assert found[2].metrics["sample_ids"] == ids[2:4]
    assert found[2].sample_id_digest == sample_ids_digest(ids[2:4])
    assert [(o.topic, o.partition, o.offset) for o in found[1].consumed_offsets] == [("mt.samples", 0, 2)]
    assert [(o.partition, o.offset) for o in found[2].consumed_offsets] == [(0, 5)]
    assert found[2].metrics["skipped"] == {"rejected": 1}
    assert found[2].metrics["tensor_parallel"] == 2 and found[2].metrics["backend"] == "megatron"

    steps = asyncio.run(read_topic(db, topic_name(NAMESPACE, "train_steps")))
    published = asyncio.run(read_topic(db, topic_name(NAMESPACE, "checkpoints")))
    assert [e["policy_version"] for e in steps] == [1, 2]
    assert [e["version"] for e in published] == [1, 2]
    for event in steps:
        manifest = found[event["policy_version"]]
        assert event["sample_ids"] == manifest.metrics["sample_ids"]
        assert event["loss"] == pytest.approx(manifest.metrics["loss"]) and event["grad_norm"] > 0
        assert event["tokens"] == manifest.metrics["tokens"] > 0
    for event in published:
        manifest = found[event["version"]]
        assert event["manifest_sha256"] == manifest.sha256
        assert event["consumed_offsets"] == [
            {"topic": "mt.samples", "partition": 0, "offset": o.offset} for o in manifest.consumed_offsets
        ]
        assert event["uri"].endswith(version_prefix(RUN, event["version"]))

    # The torch backend on the same topic: same batches and offsets, same metric keys, same numbers.
    torch_settings = TrainSettings(
        data_dir=tmp_path, log_url=f"sqlite:///{db}", store_url=f"file://{tmp_path / 'objects'}",
        namespace=NAMESPACE, model=str(tiny_model_dir), run_id="torch-run", kind="full", lr=LR,
        batch_size=2, max_steps=2, precision="fp32", poll_timeout_s=0.2, idle_exit_s=20.0, train_temperature=1.0,
    )  # fmt: skip

    async def torch_backend() -> int:
        async with SqliteEventLog(db) as log:
            return await run_trainer(torch_settings, log, store, tiny_model_dir, tmp_path / "torch-work")

    torch.set_num_threads(1)
    assert asyncio.run(torch_backend()) == 2
    reference = manifests(store, "torch-run")
    for version in (1, 2):
        got, want = found[version].metrics, reference[version].metrics
        assert set(got) - {"backend", "tensor_parallel", "data_parallel"} == set(want)
        assert found[version].consumed_offsets == reference[version].consumed_offsets
        assert got["sample_ids"] == want["sample_ids"] and got["tokens"] == want["tokens"]
        for name in ("loss", "pg_loss", "kl", "clip_fraction", "advantage_mean", "reward_mean"):
            assert math.isclose(got[name], want[name], rel_tol=1e-4, abs_tol=1e-6), (version, name)
        assert math.isclose(got["grad_norm"], want["grad_norm"], rel_tol=1e-3), version

    # Restart at another layout (TP 1 x DP 2): resumes at v2's offsets (s4, read once already, then
    # s5) from v2's weights. Then s6 alone: a partial batch once the stream is quiet, smaller than
    # DP (one replica has no sample), after keep-alive commands (every timeout / 4 = 5 s).
    asyncio.run(append(db, [ready[5], ready[6]]))
    output = torchrun_orl_train(
        tmp_path, tiny_model_dir, 2, "--tensor-parallel", "1", "--partial-batch-after-s", "6",
        "--megatron-timeout-s", "20",
    )  # fmt: skip
    assert "tensor parallel 1 x data parallel 2 on cpu" in output
    found = manifests(store, RUN)
    assert sorted(found) == [1, 2, 3, 4] and [found[3].parent_version, found[4].parent_version] == [2, 3]
    assert found[3].metrics["sample_ids"] == ids[4:6] and found[3].metrics["data_parallel"] == 2
    assert found[4].metrics["sample_ids"] == ids[6:7]
    assert found[4].metrics["tokens"] == len(ready[6]["response_token_ids"])
    assert found[4].metrics["grad_norm"] > 0
    assert [(o.partition, o.offset) for o in found[4].consumed_offsets] == [(0, 8)]
    trained = [i for v in (1, 2, 3, 4) for i in found[v].metrics["sample_ids"]]
    assert trained == ids  # every sample once, in topic order
    steps = asyncio.run(read_topic(db, topic_name(NAMESPACE, "train_steps")))
    assert [e["policy_version"] for e in steps if e["run_id"] == RUN] == [1, 2, 3, 4]  # none re-emitted
    # Fresh Adam moves each weight by at most lr per step: v3 is one step from v2, not from the base.
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    v2 = weights(store, found[2], tmp_path / "v2")
    v3 = weights(store, found[3], tmp_path / "v3")
    assert max(float((v3[n] - v2[n]).abs().max()) for n in v3) <= LR * 1.01
    assert max(float((v2[n] - base[n]).abs().max()) for n in v2) > LR * 1.5

    # A restart that cannot resume (another base model) stops every rank with rank 0's reason.
    other_model = Path(shutil.copytree(tiny_model_dir, tmp_path / "other-model"))
    output = torchrun_orl_train(tmp_path, other_model, 1, "--tensor-parallel", "2", exit_code=1)
    assert f"was trained from --model {str(tiny_model_dir)!r}" in output
    assert "orl train: error: rank 0 could not resume: run 'megatron-run' was trained from" in output
    assert sorted(manifests(store, RUN)) == [1, 2, 3, 4]


@pytest.mark.slow
def test_orl_train_megatron_restarted_after_each_step_equals_an_uninterrupted_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Weights and every rank's AdamW state equal after step 2, at tensor parallel 2 (optimizer resume)."""
    store = LocalObjectStore(tmp_path / "objects")
    asyncio.run(append(tmp_path / "log.db", [sample_event(i) for i in range(4)]))
    torchrun_orl_train(tmp_path, tiny_model_dir, 2, "--tensor-parallel", "2", "--run-id", "straight")
    for _ in range(2):
        torchrun_orl_train(tmp_path, tiny_model_dir, 1, "--tensor-parallel", "2", "--run-id", "restarted")
    runs = {run_id: manifests(store, run_id)[2] for run_id in ("straight", "restarted")}
    assert runs["straight"].metrics["sample_ids"] == runs["restarted"].metrics["sample_ids"]
    folders = {run_id: tmp_path / run_id for run_id in runs}
    for run_id, manifest in runs.items():
        download_and_verify(store, manifest.manifest_key, folders[run_id], manifest.sha256)
    straight, restarted = (
        load_file(str(folders[r] / "model.safetensors")) for r in ("straight", "restarted")
    )
    assert straight.keys() == restarted.keys()
    assert all(torch.equal(straight[name], restarted[name]) for name in straight)
    state_files = sorted(p.name for p in (folders["straight"] / "trainer_state").iterdir())
    assert state_files == ["optimizer-tp0-of-2-dp0-of-1.pt", "optimizer-tp1-of-2-dp0-of-1.pt"]
    for name in state_files:
        states = [
            torch.load(folders[r] / "trainer_state" / name, weights_only=True)["state"]
            for r in ("straight", "restarted")
        ]
        assert states[0].keys() == states[1].keys() and len(states[0]) > 0
        for index, moments in states[0].items():
            assert all(torch.equal(value, states[1][index][key]) for key, value in moments.items()), name
