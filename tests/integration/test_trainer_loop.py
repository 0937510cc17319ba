"""The training loop on the real SmolLM2 model, a real SQLite log and a local object store.

Samples are real: a chat-template prompt, a short response sampled from the model, its logprobs at
the sampling temperature, and (for opd / combined) the frozen base model's logprobs of the same
response under the prompt plus a hint as the teacher's.
"""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from orl.connectors.checkpoint_store import Manifest, download_and_verify, sample_ids_digest, version_prefix
from orl.connectors.event_log.base import ConsumedRecord, OutgoingRecord, TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.schemas.codec import decode, encode
from orl.schemas.events import make_event
from orl.schemas.topics import topic_name
from orl.trainer.logprobs import response_logprobs
from orl.trainer.policy_model import load_policy
from orl.trainer.settings import TrainSettings
from orl.trainer.torch_backend import run_trainer

pytestmark = [pytest.mark.model, pytest.mark.slow]

NAMESPACE = "t"
HINT = "\n[user's hint] Answer in under ten words."
QUESTIONS = [
    "What is 2 + 2?",
    "Name a color.",
    "Why is the sky blue?",
    "Say hello.",
    "What is the capital of France?",
    "Name an animal.",
    "What is water made of?",
    "Count to three.",
]


def chat_ids(tokenizer: Any, question: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(str(text), add_special_tokens=False))


@pytest.fixture(scope="module")
def generated(base_model_dir: Path) -> list[dict[str, Any]]:
    """One sampled response per question: prompt/response ids, rollout and teacher logprobs."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base_model_dir)
    model = AutoModelForCausalLM.from_pretrained(base_model_dir, dtype=torch.float32).eval()
    prompts = [chat_ids(tokenizer, q) for q in QUESTIONS]
    width = max(len(p) for p in prompts)
    pad = int(tokenizer.pad_token_id)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left padding: one batch
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(0)
    with torch.no_grad():
        ids = model.generate(
            input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=0.7, top_k=0,
            max_new_tokens=8, pad_token_id=pad, eos_token_id=2,
        )  # fmt: skip
        responses = []
        for row in ids[:, width:].tolist():
            responses.append(row[: row.index(2) + 1] if 2 in row else row)  # keep <|im_end|>, drop padding
        temps = [0.7] * len(prompts)
        rollout = response_logprobs(model, prompts, responses, temps, autocast=False)
        hinted = [chat_ids(tokenizer, q + HINT) for q in QUESTIONS]
        teacher = response_logprobs(model, hinted, responses, temps, autocast=False)
    return [
        {"prompt": p, "response": r, "rollout": lp.tolist(), "teacher": t.tolist()}
        for p, r, lp, t in zip(prompts, responses, rollout, teacher, strict=True)
    ]


def sample_event(
    index: int,
    g: dict[str, Any],
    *,
    method: str = "binary",
    reward: float | None = 1.0,
    teacher: bool = False,
    policy_version: int = 0,
) -> dict[str, Any]:
    return make_event(
        "SampleReady", namespace=NAMESPACE, producer="test", occurred_at_ms=1000 + index,
        id_parts=[index, method], session_id=f"s{index}", turn_id=f"t{index}",
        method=method, prompt_token_ids=g["prompt"], response_token_ids=g["response"],
        old_logprobs=g["rollout"], temperature=0.7, reward=reward,
        teacher_logprobs=g["teacher"] if teacher else None, teacher_kind="frozen_reference" if teacher else None,
        policy_version=policy_version, promoted=False, off_policy=False,
        lineage={"request_event_id": f"req{index}", "response_event_id": f"resp{index}"},
    )  # fmt: skip


def rejected_event(index: int) -> dict[str, Any]:
    return make_event(
        "SampleRejected", namespace=NAMESPACE, producer="test", occurred_at_ms=1000 + index,
        id_parts=[index, "rejected"], session_id=f"s{index}", turn_id=f"t{index}", method="opd",
        reason="no_valid_hint", lineage={"request_event_id": f"req{index}", "response_event_id": f"resp{index}"},
    )  # fmt: skip


async def append(log: SqliteEventLog, events: list[dict[str, Any]]) -> None:
    # One key: one partition, so topic order is the order written here.
    records = [OutgoingRecord(value=encode(e), key=b"k") for e in events]
    await log.append_batch(topic_name(NAMESPACE, "samples"), records)


async def read_all(log: SqliteEventLog, topic: str) -> list[ConsumedRecord]:
    ends = await log.end_offsets(topic)
    out: list[ConsumedRecord] = []
    async with log.consumer(f"reader-{topic}-{sum(ends.values())}", [topic]) as consumer:
        await consumer.seek_to_beginning()
        while len(out) < sum(ends.values()):
            out += await consumer.poll(timeout_s=1.0)
    return out


def settings_for(tmp_path: Path, model_dir: Path, **overrides: Any) -> TrainSettings:
    base = TrainSettings(
        data_dir=tmp_path, log_url=f"sqlite:///{tmp_path / 'log.db'}", store_url=f"file://{tmp_path / 'objects'}",
        namespace=NAMESPACE, model=str(model_dir), run_id="r1", batch_size=2, max_steps=2, lora_r=4, lora_alpha=8,
        poll_timeout_s=0.2, idle_exit_s=10.0,
    )  # fmt: skip
    return replace(base, **overrides)


def manifests(store: LocalObjectStore, run_id: str) -> dict[int, Manifest]:
    found = {}
    for key in store.list(f"checkpoints/{run_id}/"):
        if key.endswith("/manifest.json"):
            manifest = Manifest.from_json(store.get(key))
            found[manifest.version] = manifest
    return found


def fixed_prompt_logprobs(model_dir: Path, init_dir: Path | None, g: dict[str, Any]) -> torch.Tensor:
    policy = load_policy(model_dir, "lora", init_dir=init_dir)
    with torch.no_grad():
        return response_logprobs(policy.module, [g["prompt"]], [g["response"]], [1.0], autocast=False)[0]


async def test_two_steps_then_resume(tmp_path: Path, base_model_dir: Path, generated: list[dict]) -> None:
    settings = settings_for(tmp_path, base_model_dir)
    store = LocalObjectStore(tmp_path / "objects")
    ready = [sample_event(i, generated[i]) for i in range(6)]
    ready[1] = sample_event(1, generated[1], reward=-1.0)
    async with SqliteEventLog(tmp_path / "log.db") as log:
        await log.create_topics([TopicSpec(topic_name(NAMESPACE, "samples"))])
        # offsets: 0 s0, 1 s1, 2 rejected, 3 s2, 4 s3, 5 s4  (s4 polled in step 2 but not trained)
        await append(log, [ready[0], ready[1], rejected_event(99), ready[2], ready[3], ready[4]])
        steps = await run_trainer(settings, log, store, base_model_dir, tmp_path / "work1")
        assert steps == 2

        found = manifests(store, "r1")
        assert sorted(found) == [1, 2]
        assert [found[1].parent_version, found[2].parent_version] == [0, 1]
        ids = [e["envelope"]["event_id"] for e in ready]
        assert found[1].metrics["sample_ids"] == ids[0:2]
        assert found[2].metrics["sample_ids"] == ids[2:4]
        assert found[2].sample_id_digest == sample_ids_digest(ids[2:4])
        assert [(o.partition, o.offset) for o in found[1].consumed_offsets] == [(0, 2)]
        assert [(o.partition, o.offset) for o in found[2].consumed_offsets] == [(0, 5)]  # s4 is not covered
        assert found[2].metrics["skipped"] == {"rejected": 1}
        assert found[1].metrics["reward_mean"] == 0.0

        steps_events = [decode(r.value) for r in await read_all(log, topic_name(NAMESPACE, "train_steps"))]
        ckpt_events = [decode(r.value) for r in await read_all(log, topic_name(NAMESPACE, "checkpoints"))]
        assert [e["policy_version"] for e in steps_events] == [1, 2]
        for event, version in zip(steps_events, (1, 2), strict=True):
            manifest = found[version]
            assert event["sample_ids"] == manifest.metrics["sample_ids"]
            assert event["loss"] == pytest.approx(manifest.metrics["loss"])
            assert event["tokens"] == manifest.metrics["tokens"] > 0
            assert event["grad_norm"] > 0
        for event, version in zip(ckpt_events, (1, 2), strict=True):
            manifest = found[version]
            assert event["version"] == version and event["parent_version"] == version - 1
            assert event["manifest_key"] == manifest.manifest_key
            assert event["manifest_sha256"] == manifest.sha256
            assert event["sample_id_digest"] == manifest.sample_id_digest
            assert event["consumed_offsets"] == [{"topic": "t.samples", "partition": 0, "offset": o.offset}
                                                 for o in manifest.consumed_offsets]  # fmt: skip
            assert event["uri"].endswith(version_prefix("r1", version))

        # The policy moved: a fixed prompt's logprobs under v2 differ from the base model's.
        v2_dir = tmp_path / "v2"
        download_and_verify(store, found[2].manifest_key, v2_dir, found[2].sha256)
        base_lp = fixed_prompt_logprobs(base_model_dir, None, generated[7])
        v2_lp = fixed_prompt_logprobs(base_model_dir, v2_dir, generated[7])
        assert float((base_lp - v2_lp).abs().max()) > 1e-3

        # A new process resumes at v2's offsets: s4 (already polled once) and s5 make v3; no event repeats.
        await append(log, [ready[5]])
        steps = await run_trainer(
            replace(settings, max_steps=1), log, store, base_model_dir, tmp_path / "work2"
        )
        assert steps == 1
        found = manifests(store, "r1")
        assert found[3].parent_version == 2
        assert found[3].metrics["sample_ids"] == ids[4:6]
        steps_events = [decode(r.value) for r in await read_all(log, topic_name(NAMESPACE, "train_steps"))]
        assert [e["policy_version"] for e in steps_events] == [1, 2, 3]


async def test_methods_staleness_and_rejections(
    tmp_path: Path, base_model_dir: Path, generated: list[dict]
) -> None:
    settings = settings_for(tmp_path, base_model_dir, max_staleness=0)
    store = LocalObjectStore(tmp_path / "objects")
    events = [
        sample_event(0, generated[0], method="opd", reward=None, teacher=True),
        rejected_event(50),
        sample_event(1, generated[1], method="combined", reward=-1.0, teacher=True),
        # trained at version 1 with K = 0: a version-0 sample is stale
        sample_event(2, generated[2], method="combined", reward=1.0, teacher=True),
        sample_event(3, generated[3], method="combined", reward=1.0, teacher=False, policy_version=1),
        rejected_event(51),
        sample_event(4, generated[4], method="binary", reward=-1.0, policy_version=1),
    ]
    async with SqliteEventLog(tmp_path / "log.db") as log:
        await log.create_topics([TopicSpec(topic_name(NAMESPACE, "samples"))])
        await append(log, events)
        assert await run_trainer(settings, log, store, base_model_dir, tmp_path / "work") == 2
        found = manifests(store, "r1")
        ids = [e["envelope"]["event_id"] for e in events]
        assert found[1].metrics["sample_ids"] == [ids[0], ids[2]]
        assert found[1].metrics["skipped"] == {"rejected": 1}
        assert found[1].metrics["methods"] == {"combined": 1, "opd": 1}
        assert found[1].metrics["opd_advantage_mean"] is not None
        assert found[2].metrics["sample_ids"] == [ids[4], ids[6]]
        assert found[2].metrics["skipped"] == {"rejected": 1, "stale": 1}
        assert found[2].metrics["dropped_stale"] == 1
        assert found[2].metrics["mean_staleness"] == 0.0
        assert [(o.offset) for o in found[2].consumed_offsets] == [7]
        steps_events = [decode(r.value) for r in await read_all(log, topic_name(NAMESPACE, "train_steps"))]
        assert [e["dropped_stale"] for e in steps_events] == [0, 1]


async def test_a_quiet_stream_trains_a_partial_batch(
    tmp_path: Path, base_model_dir: Path, generated: list[dict]
) -> None:
    settings = settings_for(tmp_path, base_model_dir, batch_size=4, max_steps=1, partial_batch_after_s=0.5)
    store = LocalObjectStore(tmp_path / "objects")
    events = [sample_event(i, generated[i]) for i in range(3)]
    async with SqliteEventLog(tmp_path / "log.db") as log:
        await log.create_topics([TopicSpec(topic_name(NAMESPACE, "samples"))])
        await append(log, events)
        assert await run_trainer(settings, log, store, base_model_dir, tmp_path / "work") == 1
        (manifest,) = manifests(store, "r1").values()
        assert manifest.metrics["sample_ids"] == [e["envelope"]["event_id"] for e in events]
        assert [o.offset for o in manifest.consumed_offsets] == [3]


async def test_sigusr1_trains_what_is_pending_as_one_batch(
    tmp_path: Path, base_model_dir: Path, generated: list[dict]
) -> None:
    settings = settings_for(tmp_path, base_model_dir, batch_size=8, max_steps=1, idle_exit_s=0.0)
    store = LocalObjectStore(tmp_path / "objects")
    events = [sample_event(i, generated[i]) for i in range(3)]
    async with SqliteEventLog(tmp_path / "log.db") as log:
        await log.create_topics([TopicSpec(topic_name(NAMESPACE, "samples"))])
        await append(log, events)
        training = asyncio.create_task(run_trainer(settings, log, store, base_model_dir, tmp_path / "work"))
        await asyncio.sleep(3.0)  # the trainer waits for 8 samples: nothing happens on its own
        assert not manifests(store, "r1")
        os.kill(os.getpid(), signal.SIGUSR1)  # what `kill -USR1 <orl train pid>` does
        assert await asyncio.wait_for(training, timeout=300) == 1
        (manifest,) = manifests(store, "r1").values()
        assert manifest.metrics["sample_ids"] == [e["envelope"]["event_id"] for e in events]
