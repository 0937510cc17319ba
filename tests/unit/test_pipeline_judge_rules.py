"""Rule judges in the judge stage: inline while fast, in a worker thread once one call was slow."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from orl.pipeline.effects.contract import EffectCall
from orl.pipeline.effects.judge_stage import JudgeStage
from orl.pipeline.effects.judging import JudgeConfig


def call(index: int = 0, judge_id: str = "prm:test") -> EffectCall:
    next_state = {
        "event_id": "NextStateObserved-1", "namespace": "test", "session_id": "s1", "turn_id": "s1-t0",
        "occurred_at": 1_700_000_000_000, "role": "user", "content": "thanks", "source": "conversation",
        "outcome": None,
    }  # fmt: skip
    turn = {"messages": [{"role": "user", "content": "Question?"}], "response_text": "Answer."}
    return EffectCall(
        "reward", {"turn": turn, "next_state": next_state, "vote_index": index, "judge_id": judge_id}
    )


def stage(rule: Any) -> JudgeStage:
    judge = JudgeConfig(judge_id="prm:test", kind="rule", m=1)
    return JudgeStage(reward_judges=(judge,), hint_judge=None, rule_judges={judge.judge_id: rule})


def votes(judge: JudgeStage, count: int) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        return [emit.event for i in range(count) for emit in await judge.perform(call(i))]

    return asyncio.run(run())


def test_a_fast_rule_judge_runs_inline_and_scores() -> None:
    judge = stage(lambda messages, response, next_state: (1, "thanked"))
    cast = votes(judge, 3)
    assert [vote["score"] for vote in cast] == [1, 1, 1]
    assert judge._rule_inline


def test_a_rule_judge_that_waits_moves_to_a_worker_thread_and_still_scores() -> None:
    def slow(messages: Any, response: Any, next_state: Any) -> tuple[int, str]:
        time.sleep(0.12)  # wall time without CPU: a rule that waits on I/O
        return -1, "redo"

    judge = stage(slow)
    cast = votes(judge, 2)
    assert [vote["score"] for vote in cast] == [-1, -1]
    assert not judge._rule_inline


def test_a_failing_rule_judge_gives_a_failed_vote() -> None:
    def broken(messages: Any, response: Any, next_state: Any) -> tuple[int, str]:
        raise ValueError("no verdict")

    (vote,) = votes(stage(broken), 1)
    assert vote["score"] is None and "ValueError: no verdict" in vote["parse_error"]
