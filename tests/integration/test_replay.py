"""Replay on the embedded log: reuse reproduces the samples, a re-run adds nothing, rejudge adds new votes.

The recorded namespace is made the way live traffic is: serving events from `Conversation`, then
the real stages run over the log one after another (turn linker, the judge stage with the demo's
rule judges, tally, hint selector, scripted teacher scores, sample builder).
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.history import replay_shard
from orl.pipeline.history.namespace_io import NamespaceWriter, read_events
from orl.pipeline.history.replay import REJUDGE_TOPICS, REUSE_TOPICS, ReplayPlan, log_source, replay
from orl.pipeline.history.replay_shard import shard_of
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.pipeline.runtime.settings import PipelineSettings
from orl.pipeline.runtime.stream_runner import StreamRunner
from orl.schemas.codec import encode
from orl.schemas.errors import ConfigError
from orl.schemas.topics import topic_name

from tests.unit.pipeline_streams import Conversation, task_session, teacher_event

SOURCE = "rec"
Event = dict[str, Any]


def recorded_settings(tmp_path: Path, namespace: str = SOURCE, **extra: Any) -> PipelineSettings:
    values: dict[str, Any] = {
        "data_dir": tmp_path,
        "namespace": namespace,
        "method": "combined",
        "judge": "user_reply",
        "hint_judge": "user_hint",
        **extra,
    }
    return PipelineSettings(**values)


def conversations(namespace: str, sessions: int) -> list[Event]:
    events: list[Event] = []
    for n in range(sessions):
        chat = Conversation(f"s{n}", namespace=namespace)
        chat.say("How do I simplify the fraction 18/24?")
        chat.turn("Divide both by 6 to get 3/4. **Answer:** 3/4")
        chat.say("Please redo this: answer in under 20 words, no bold.")
        chat.turn("Divide by 6: 3/4.")
        chat.say("Thanks, that works.")
        last = chat.turn("Glad to help.")
        chat.say("Perfect, thank you!")
        chat.turn("You're welcome.")
        chat.close(last.turn_id)
        events += chat.events
    return events


async def record(log: EventLog, settings: PipelineSettings, sessions: int = 3) -> None:
    """Live-like history in `settings.namespace`: serving events, then every stage over the log."""
    writer = NamespaceWriter(log, settings.namespace)
    await writer.prepare()
    await writer.write(conversations(settings.namespace, sessions))
    config = pipeline_config(settings)
    stages = [s for s in build_stages(settings) if s.name != "teacher"]
    for stage in stages:
        if stage.name == "sample_builder":
            await scripted_teacher(log, settings.namespace)
        runner = StreamRunner(log, stage, config, settings.namespace)
        await runner.run_until_idle(idle_polls=1)


async def scripted_teacher(log: EventLog, namespace: str) -> None:
    responses = {
        e["envelope"]["turn_id"]: e async for e in read_events(log, topic_name(namespace, "responses"))
    }
    hints = [e async for e in read_events(log, topic_name(namespace, "hints"))]
    scores = [
        teacher_event(h, responses[h["envelope"]["turn_id"]])
        for h in hints
        if h["envelope"]["event_type"] == "HintSelected"
    ]
    await NamespaceWriter(log, namespace).write(scores) if scores else None


async def events_of(log: EventLog, namespace: str, topic: str) -> list[Event]:
    return [e async for e in read_events(log, topic_name(namespace, topic))]


def by_turn(samples: list[Event]) -> dict[str, Event]:
    return {s["envelope"]["turn_id"]: s for s in samples}


def comparable(sample: Event) -> bytes:
    """The sample's bytes with what a new namespace re-derives blanked: the envelope and the lineage
    ids of derived events (reward, hint, teacher). Request, response and next-state ids stay."""
    lineage = dict(sample["lineage"], reward_event_id=None, hint_event_id=None, teacher_event_id=None)
    envelope = dict(
        sample["envelope"], event_id="x", namespace="x", occurred_at=sample["envelope"]["occurred_at"]
    )
    return encode({**sample, "envelope": envelope, "lineage": lineage})


async def run_replay(
    log: EventLog, settings: PipelineSettings, target: str, votes: str, workers: int = 1, progress: Any = None
) -> Any:
    plan = ReplayPlan(target=target, votes=votes, source=f"log:{SOURCE}", settings_version="v1")
    target_settings = recorded_settings(settings.data_dir, namespace=target)
    if votes == "rejudge":
        target_settings = recorded_settings(settings.data_dir, namespace=target, judge_temperature=0.9)
    stages = [s for s in build_stages(target_settings) if s.name != "teacher" or votes == "reuse"]
    topics = REUSE_TOPICS if votes == "reuse" else REJUDGE_TOPICS
    return await replay(
        log,
        plan,
        log_source(log, SOURCE, topics),
        stages,
        pipeline_config(target_settings),
        source_namespace=SOURCE,
        workers=workers,
        **({"progress": progress} if progress else {}),
    )


@pytest.fixture
def log_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'log.db'}"


@pytest.mark.parametrize(
    "workers, votes_held",
    [(1, True), (2, True), (1, False)],
    ids=["in-process", "two-workers", "votes-read-twice"],
)
def test_reuse_reproduces_every_sample_and_a_rerun_adds_nothing(
    tmp_path: Path, log_url: str, workers: int, votes_held: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not votes_held:  # a shard over its budget drops the votes it counted; they are read again
        monkeypatch.setattr(replay_shard, "HELD_VOTE_BYTES", 0)
    # The 4 recorded sessions (s0..s3) are dealt to both workers, not all to one.
    assert {shard_of(f"s{n}".encode(), workers) for n in range(4)} == set(range(workers))

    async def scenario() -> None:
        async with open_event_log(log_url) as log:
            settings = recorded_settings(tmp_path)
            await record(log, settings, sessions=4)
            original = await events_of(log, SOURCE, "samples")
            assert sum(s["envelope"]["event_type"] == "SampleReady" for s in original) >= 4
            report = await run_replay(log, settings, "again", "reuse", workers)
            replayed = await events_of(log, "again", "samples")
            assert len(replayed) == len(original) == report.samples_ready + report.samples_rejected
            old, new = by_turn(original), by_turn(replayed)
            assert old.keys() == new.keys()
            for turn_id in old:
                assert comparable(new[turn_id]) == comparable(old[turn_id]), turn_id
                assert new[turn_id]["envelope"]["namespace"] == "again"
            assert any(s.get("teacher_logprobs") for s in replayed)  # the teacher scores were re-attached
            counts = {
                t: len(await events_of(log, "again", t))
                for t in ("requests", "judge_votes", "samples", "rewards")
            }
            rerun = await run_replay(log, settings, "again", "reuse", workers)
            assert rerun.copied == 0
            assert {t: len(await events_of(log, "again", t)) for t in counts} == counts

    asyncio.run(scenario())


def test_a_reuse_replay_keeps_a_rollout_group_together_whatever_its_workers(
    tmp_path: Path, log_url: str
) -> None:
    """Shards are dealt by session; a group's sessions are normalised together only in one shard."""
    agents = {"method": "binary", "reward_rule": "step_outcome", "group_advantage": True}
    names = ["ga", "gb", "gc", "gd"]
    assert {shard_of(name.encode(), 2) for name in names} == {0, 1}  # the group would be split

    async def scenario() -> None:
        async with open_event_log(log_url) as log:
            settings = recorded_settings(tmp_path, **agents)
            writer = NamespaceWriter(log, SOURCE)
            await writer.prepare()
            for name, outcome in zip(names, (1.0, -1.0, 1.0, 1.0), strict=True):
                await writer.write(task_session(name, [[], []], outcome, ("g", 4), SOURCE).events)
            config = pipeline_config(settings)
            for _ in range(2):  # sample_builder -> group_advantage -> sample_builder
                for stage in build_stages(settings):
                    await StreamRunner(log, stage, config, SOURCE).run_until_idle(idle_polls=1)
            original = await events_of(log, SOURCE, "samples")
            # every step 0.5 * outcome (the rule judge scores tool results 0), normalised per step index:
            # [0.5, -0.5, 0.5, 0.5] -> mean 0.25, std sqrt(3) / 4 -> 1 / sqrt(3) and -sqrt(3)
            expected = [-math.sqrt(3)] * 2 + [1 / math.sqrt(3)] * 6
            assert sorted(s["reward"] for s in original) == pytest.approx(expected, abs=1e-5)
            target = recorded_settings(tmp_path, namespace="again", **agents)
            plan = ReplayPlan(target="again", votes="reuse", source=f"log:{SOURCE}", settings_version="v1")
            await replay(
                log, plan, log_source(log, SOURCE, REUSE_TOPICS), build_stages(target), pipeline_config(target),
                source_namespace=SOURCE, workers=2,
            )  # fmt: skip
            replayed = await events_of(log, "again", "samples")
            assert {t: comparable(s) for t, s in by_turn(replayed).items()} == {
                t: comparable(s) for t, s in by_turn(original).items()
            }

    asyncio.run(scenario())


def test_rejudge_casts_new_votes_and_leaves_the_source_untouched(tmp_path: Path, log_url: str) -> None:
    async def scenario() -> None:
        async with open_event_log(log_url) as log:
            settings = recorded_settings(tmp_path)
            await record(log, settings, sessions=2)
            before = {t: await events_of(log, SOURCE, t) for t in ("judge_votes", "rewards", "samples")}
            phases: dict[str, list[tuple[int, int]]] = {}
            progress = lambda phase, advanced, total: phases.setdefault(phase, []).append((advanced, total))  # noqa: E731
            await run_replay(log, settings, "rejudged", "rejudge", progress=progress)
            # A bar per phase: the copy, the judge, then the pure stages. Each reaches the backlog it
            # found; hint_selector goes past it (it reads its own HintSelected back from the hints topic).
            assert list(phases)[:2] == ["copy", "judge"] and "sample_builder" in phases
            for phase, steps in phases.items():
                done, total = sum(a for a, _ in steps), steps[0][1]
                assert {t for _, t in steps} == {total} and total > 0, phase
                assert done == total if phase != "hint_selector" else done > total, phase
            old_versions = {v["judge_config_version"] for v in before["judge_votes"]}
            new_votes = await events_of(log, "rejudged", "judge_votes")
            assert new_votes and {v["judge_config_version"] for v in new_votes}.isdisjoint(old_versions)
            assert {v["envelope"]["event_id"] for v in new_votes}.isdisjoint(
                {v["envelope"]["event_id"] for v in before["judge_votes"]}
            )
            assert await events_of(log, "rejudged", "samples")
            after = {t: await events_of(log, SOURCE, t) for t in before}
            assert json.dumps(after, sort_keys=True) == json.dumps(before, sort_keys=True)

    asyncio.run(scenario())


def test_a_different_replay_into_a_used_namespace_is_refused(tmp_path: Path, log_url: str) -> None:
    async def scenario() -> None:
        async with open_event_log(log_url) as log:
            settings = recorded_settings(tmp_path)
            await record(log, settings, sessions=1)
            await run_replay(log, settings, "taken", "reuse")
            with pytest.raises(ConfigError, match="another replay"):
                await run_replay(log, settings, "taken", "rejudge")
            with pytest.raises(ConfigError, match="is the source"):
                await run_replay(log, settings, SOURCE, "reuse")

    asyncio.run(scenario())


GOLDEN = Path(__file__).parents[1] / "golden" / "openclaw"
GOLDEN_FILES = ",".join(
    str(GOLDEN / name)
    for name in ("qwen3_4b_record.jsonl", "qwen3_4b_record_prm.jsonl", "qwen3_4b_record_opd.jsonl")
)


def import_settings(tmp_path: Path, model_dir: Path, **extra: Any) -> Any:
    from orl.history import ReplaySettings

    values: dict[str, Any] = {
        "data_dir": tmp_path,
        "source": "openclaw",
        "openclaw_files": tuple(GOLDEN_FILES.split(",")),
        "target_namespace": "imported",
        "method": "binary",  # opd / combined would run the teacher stage on an orl server
        "import_logprobs": "placeholder",
        "model": str(model_dir),
        "progress": False,
        **extra,
    }
    return ReplaySettings(**values)


async def all_counts(log_url: str, namespace: str) -> dict[str, int]:
    async with open_event_log(log_url) as log:
        return {
            t: len(await events_of(log, namespace, t))
            for t in ("requests", "judge_votes", "hints", "samples")
        }


def test_openclaw_import_replays_into_off_policy_samples(
    tmp_path: Path, base_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from orl.history import run_replay

    settings = import_settings(tmp_path, base_model_dir)
    log_url = settings.effective_log_url()
    assert run_replay(settings) == 0
    err = capsys.readouterr().err
    assert (
        "qwen3_4b_record.jsonl:4: malformed JSON" in err and "qwen3_4b_record.jsonl:5: truncated line" in err
    )
    counts = asyncio.run(all_counts(log_url, "imported"))
    assert counts["requests"] == 3 and counts["judge_votes"] == 9

    async def samples() -> list[Event]:
        async with open_event_log(log_url) as log:
            return await events_of(log, "imported", "samples")

    ready = [s for s in asyncio.run(samples()) if s["envelope"]["event_type"] == "SampleReady"]
    assert ready and all(s["off_policy"] for s in ready)
    assert all(len(s["old_logprobs"]) == len(s["response_token_ids"]) for s in ready)
    assert run_replay(settings) == 0  # the same import again adds nothing
    assert asyncio.run(all_counts(log_url, "imported")) == counts


def test_a_strict_import_of_a_bad_file_writes_nothing(tmp_path: Path, base_model_dir: Path) -> None:
    from orl.pipeline.history.openclaw_import import ImportFailed

    from orl.history import run_replay

    settings = import_settings(tmp_path, base_model_dir, strict=True, target_namespace="strict")
    with pytest.raises(ImportFailed, match=r"qwen3_4b_record.jsonl:4"):
        run_replay(settings)
    assert asyncio.run(all_counts(settings.effective_log_url(), "strict")) == dict.fromkeys(
        ("requests", "judge_votes", "hints", "samples"), 0
    )


@pytest.mark.model
def test_imported_old_logprobs_can_be_recomputed_by_the_base_model(base_model_dir: Path) -> None:
    from orl.pipeline.history.import_tokens import HFImportTokenizer, scorer_for
    from orl.pipeline.history.openclaw_import import ImportOptions, build_events, parse_files

    parsed = parse_files([GOLDEN / "qwen3_4b_record.jsonl"])
    options = ImportOptions("imp", str(base_model_dir), temperature=1.0)
    tokenizer = HFImportTokenizer(base_model_dir)
    events = build_events(parsed, options, tokenizer, scorer_for("base", base_model_dir))
    responses = [e for e in events if e["envelope"]["event_type"] == "ResponseGenerated"]
    assert len(responses) == 3
    for response in responses:
        logprobs = response["response_logprobs"]
        assert len(logprobs) == len(response["response_token_ids"]) > 0
        assert all(lp <= 0.0 for lp in logprobs) and any(lp < 0.0 for lp in logprobs)
        assert response["policy_spans"] == [{"start_token": 0, "policy_version": 0}]


@pytest.mark.model
def test_imported_tool_turns_get_the_token_ids_serving_records(base_model_dir: Path) -> None:
    """An imported conversation with tool calls and a tool result is tokenized as the server renders
    it (SmolLM2's template knows no tool roles: Hermes-style blocks), and its tool-call response as
    the assistant turn serving would render after it."""
    from orl.pipeline.history.import_tokens import HFImportTokenizer
    from orl.serving.policy.chat_template import ChatTemplate

    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is here?"}]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    tokenizer = HFImportTokenizer(base_model_dir)
    template = ChatTemplate.from_dir(base_model_dir)
    assert tokenizer.prompt_ids(messages, "") == template.render(messages)
    response = tokenizer.response_ids("", [call], finished=True)
    assert template.decode(response, skip_special_tokens=False) == (
        '<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call><|im_end|>'
    )
