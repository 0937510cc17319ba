"""StreamRunner commits an effect stage's batch in parts once its calls take long (a slow judge).

A batch of next states asks the judge for many calls; on a CPU an LLM judge needs minutes for them.
The runner performs them in rounds and commits what it has handled once a batch has spent
`effect_commit_interval_s` on calls (0 here: after every round), so a crash loses at most that
much and a replay's progress moves. Real SQLite log, the real judge stage with the demo's rule
judges (one reward and one hint call per next state).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.turn_linker import TURN_LINKER
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.pipeline.runtime.settings import PipelineSettings
from orl.pipeline.runtime.stream_runner import EFFECT_CALLS_PER_ROUND, StreamRunner
from orl.schemas.codec import decode
from orl.schemas.topics import topic_name

from tests.component.test_stream_runner_restart import append
from tests.unit.pipeline_streams import NAMESPACE, Conversation

pytestmark = pytest.mark.timeout(120)
SESSIONS = 12  # 12 sessions x 2 judged turns x 2 calls = 48 calls: 6 rounds of 8 at concurrency 1


class Crash(Exception):
    """Stands for the process dying right after a commit."""


def history() -> list[dict]:
    events = []
    for n in range(SESSIONS):
        chat = Conversation(f"s{n}")
        chat.say("How do I simplify the fraction 18/24?")
        chat.turn("Divide both by 6 to get 3/4. **Answer:** 3/4")
        chat.say("Please redo this: answer in under 20 words, no bold.")
        chat.turn("Divide by 6: 3/4.")
        chat.say("Thanks, that works.")
        chat.turn("Glad to help.")
        events += chat.events
    return events


async def judge_runner(log: SqliteEventLog, **extra: object) -> StreamRunner:
    settings = PipelineSettings(namespace=NAMESPACE, judge="user_reply", hint_judge="user_hint")
    (judge,) = [stage for stage in build_stages(settings) if stage.name == "judge"]
    runner = StreamRunner(log, judge, pipeline_config(settings), NAMESPACE, effect_concurrency=1, **extra)  # type: ignore[arg-type]
    await runner.prepare()
    return runner


async def recorded(path: Path) -> SqliteEventLog:
    """Serving's events of every session, and the turn linker's next states from them."""
    log = SqliteEventLog(path)
    await log.start()
    await judge_runner(log)  # creates the topics
    await append(log, history())
    await StreamRunner(log, TURN_LINKER, PipelineConfig(), NAMESPACE).run_until_idle()
    return log


async def vote_ids(log: SqliteEventLog) -> dict[str, list[str]]:
    """The event ids on the judge's output topics, in log order."""
    ids = {}
    for topic in ("judge_votes", "hints"):
        records = await read_to_end(log, topic_name(NAMESPACE, topic))
        ids[topic] = [decode(r.value)["envelope"]["event_id"] for r in records]
    return ids


async def test_a_slow_batch_is_committed_in_parts_with_the_same_votes(tmp_path: Path) -> None:
    whole = await recorded(tmp_path / "whole.db")
    parts = await recorded(tmp_path / "parts.db")
    try:
        await (await judge_runner(whole)).run_until_idle()  # one batch, one commit (the calls are fast)
        commits: list[tuple[int, int]] = []
        runner = await judge_runner(
            parts,
            effect_commit_interval_s=0.0,
            on_commit=lambda done, backlog: commits.append((done, backlog)),
        )
        await runner.run_until_idle()
        assert commits[0][0] == 0  # first the backlog, before any commit
        assert len(commits) > 48 // EFFECT_CALLS_PER_ROUND, (
            commits
        )  # then a commit after every round of calls
        backlog = len(history()) + 2 * SESSIONS  # serving's events and the linker's next states
        assert commits == [(done, backlog) for done, _ in commits]  # the backlog it found when it started
        assert sum(done for done, _ in commits) == backlog
        expected = await vote_ids(whole)
        assert [len(set(ids)) for ids in expected.values()] == [24, 24]
        assert await vote_ids(parts) == expected
    finally:
        await whole.close()
        await parts.close()


async def test_a_crash_after_a_partial_commit_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    reference = await recorded(tmp_path / "reference.db")
    crashed = await recorded(tmp_path / "crashed.db")
    try:
        await (await judge_runner(reference)).run_until_idle()
        expected = await vote_ids(reference)

        def crash_after_the_first(done: int, backlog: int) -> None:
            if done:  # 0: the runner tells the backlog it found, before any commit
                raise Crash

        first = await judge_runner(crashed, effect_commit_interval_s=0.0, on_commit=crash_after_the_first)
        with pytest.raises(Crash):
            await first.run_until_idle()
        partial = await vote_ids(crashed)
        assert 0 < len(partial["judge_votes"]) < 24  # the first round's votes were committed, the rest not
        for topic, ids in partial.items():
            assert ids == expected[topic][: len(ids)]

        await (await judge_runner(crashed)).run_until_idle()  # a new process: state from the changelog
        assert await vote_ids(crashed) == expected
    finally:
        await reference.close()
        await crashed.close()
