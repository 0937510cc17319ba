"""The effect stages' pure planning: which judge and teacher calls a stream asks for, in any topic order."""

from __future__ import annotations

import json

from orl.pipeline.effects.judge_stage import JudgeStage
from orl.pipeline.effects.judging import JudgeConfig
from orl.pipeline.effects.teacher_stage import TeacherStage, messages_with_hint
from orl.pipeline.processors.config import PipelineConfig
from orl.schemas.events import make_event

from tests.unit.pipeline_streams import Conversation

CONFIG = PipelineConfig()


def next_state(conversation: Conversation, turn_id: str, content: str) -> dict:
    return make_event(
        "NextStateObserved",
        namespace=conversation.namespace,
        producer="test",
        occurred_at_ms=conversation.tick(),
        id_parts=(turn_id, "ns"),
        session_id=conversation.session_id,
        turn_id=turn_id,
        source="conversation",
        role="user",
        content=content,
        messages_json=None,
        outcome=None,
    )


def plan_all(stage, events):
    state, calls = None, []
    for event in events:
        state, planned = stage.plan(state, event, CONFIG)
        calls.extend(planned)
    return state, calls


def judged_turn() -> tuple[Conversation, list[dict]]:
    conversation = Conversation("s1")
    conversation.say("How do I add 1/3 and 1/4?")
    turn = conversation.turn("Use a common denominator: 7/12.")
    return conversation, [
        turn.request,
        turn.response,
        next_state(conversation, turn.turn_id, "Too long, redo."),
    ]


def judge() -> JudgeStage:
    return JudgeStage(reward_judges=(JudgeConfig(m=3),), hint_judge=JudgeConfig(judge_id="hint", m=2))


def test_each_next_state_asks_for_m_reward_and_m_hint_votes() -> None:
    _, events = judged_turn()
    _, calls = plan_all(judge(), events)
    assert sorted((c.kind, c.payload["vote_index"]) for c in calls) == [
        ("hint", 0),
        ("hint", 1),
        ("reward", 0),
        ("reward", 1),
        ("reward", 2),
    ]
    assert calls[0].payload["turn"]["response_text"] == "Use a common denominator: 7/12."
    json.dumps([c.payload for c in calls])  # calls are JSON (they may be re-planned after a crash)


def test_a_next_state_read_before_its_response_waits_for_it() -> None:
    _, (request, response, observed) = judged_turn()
    for order in (
        [observed, request, response],
        [response, observed, request],
        [request, observed, response],
    ):
        stage = judge()
        state, calls = plan_all(stage, order)
        assert len(calls) == 5, order
        assert stage.state_codec.from_bytes(stage.state_codec.to_bytes(state)) == state


def test_redelivery_and_side_turns_ask_for_nothing() -> None:
    conversation, events = judged_turn()
    _, calls = plan_all(judge(), [*events, *events])
    assert len(calls) == 5
    side = conversation.turn("memory summary", kind="side")
    _, side_calls = plan_all(
        judge(), [side.request, side.response, next_state(conversation, side.turn_id, "x")]
    )
    assert side_calls == []


def test_a_selected_hint_before_the_turn_is_scored_once_the_turn_is_known() -> None:
    conversation, (request, response, _) = judged_turn()
    hint = make_event(
        "HintSelected",
        namespace=conversation.namespace,
        producer="test",
        occurred_at_ms=conversation.tick(),
        id_parts=("hint",),
        session_id="s1",
        turn_id=request["envelope"]["turn_id"],
        hint_vote_ids=["v"],
        selected_vote_id="v",
        hint="Answer in under 40 words.",
    )
    stage = TeacherStage("http://127.0.0.1:1/v1", "key")
    _, calls = plan_all(stage, [hint, response, request])
    assert len(calls) == 1
    assert calls[0].payload["hint"] == "Answer in under 40 words."
    assert calls[0].payload["turn"]["response_token_ids"] == response["response_token_ids"]


def test_the_hint_goes_at_the_end_of_the_last_user_message() -> None:
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "second"},
    ]
    enhanced = messages_with_hint(messages, "be brief")
    assert enhanced[2]["content"] == "second\n\n[user's hint / instruction]\nbe brief"
    assert messages[2]["content"] == "second"  # the original is untouched
