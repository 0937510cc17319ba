"""One realistic example per event type, built with `make_event`, for tests anywhere in the repo.

`example_event(event_type)` returns a fresh dict each call (mutate it freely). Floats in float
arrays (logprobs) are exactly representable in 32 bits so that encode -> decode returns an equal dict.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from orl.schemas.events import make_event

NAMESPACE = "live"
SESSION_ID = "sess-7f3a"
TURN_ID = "turn-0003"
OCCURRED_AT_MS = 1_763_780_000_000


def sampling(seed: int | None = 1234) -> dict[str, Any]:
    return {
        "temperature": 0.7,
        "top_p": 0.95,
        "max_tokens": 512,
        "stop": ["</s>"],
        "seed": seed,
        "constraint": None,
    }


def lineage() -> dict[str, Any]:
    return {
        "request_event_id": "RequestReceived-0123456789abcdef01234567",
        "response_event_id": "ResponseGenerated-0123456789abcdef01234567",
        "next_state_event_id": "NextStateObserved-0123456789abcdef01234567",
        "reward_event_id": "RewardDecided-0123456789abcdef01234567",
        "hint_event_id": None,
        "teacher_event_id": None,
    }


def _event(event_type: str, producer: str, **payload: Any) -> dict[str, Any]:
    return make_event(
        event_type,
        namespace=NAMESPACE,
        producer=producer,
        occurred_at_ms=OCCURRED_AT_MS,
        id_parts=[SESSION_ID, TURN_ID],
        session_id=SESSION_ID,
        turn_id=TURN_ID,
        **payload,
    )


def request_received() -> dict[str, Any]:
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Run the tests and fix the failing one."},
    ]
    tools = [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    return _event(
        "RequestReceived",
        "serving/0.1.0",
        request_id="req-42",
        turn_kind="main",
        turn_index=3,
        previous_turn_id="turn-0002",
        link_method="header",
        messages_json=json.dumps(messages),
        tools_json=json.dumps(tools),
        tool_choice_json=None,
        sampling=sampling(),
        model="SmolLM2-135M-Instruct",
        stream=False,
        client_id="openclaw",
        group_id="calc-3:0",
        group_size=4,
    )


def response_generated(response_tokens: int = 48) -> dict[str, Any]:
    """A ResponseGenerated; the default size encodes to about 1 KB."""
    return _event(
        "ResponseGenerated",
        "serving/0.1.0",
        request_id="req-42",
        prompt_token_ids=[1 + (i * 7919) % 49_000 for i in range(96)],
        response_token_ids=[2 + (i * 104_729) % 49_000 for i in range(response_tokens)],
        response_logprobs=[-((i % 16) / 8.0) for i in range(response_tokens)],
        response_text="I ran `pytest -q`; test_parse fails on empty input. Patching parse() to return [].",
        reasoning_text=None,
        tool_calls_json=json.dumps([{"id": "call_1", "type": "function", "function": {"name": "shell"}}]),
        finish_reason="tool_calls",
        sampling=sampling(),
        policy_version=7,
        policy_spans=[{"start_token": 0, "policy_version": 6}, {"start_token": 20, "policy_version": 7}],
        latency_ms=812.5,
        prompt_tokens=96,
        completion_tokens=response_tokens,
        model="SmolLM2-135M-Instruct",
        policy_run="live",
    )


def next_state_observed() -> dict[str, Any]:
    outcome = {
        "kind": "tests",
        "reward": None,
        "exit_code": 1,
        "passed": 11,
        "failed": 1,
        "errors": 0,
        "thumbs": None,
        "detail_json": json.dumps({"failed": ["test_parse_empty"]}),
    }
    return _event(
        "NextStateObserved",
        "connectors/shell/0.1.0",
        source="tool",
        role="tool",
        content="1 failed, 11 passed",
        messages_json=json.dumps([{"role": "tool", "content": "1 failed, 11 passed"}]),
        outcome=outcome,
    )


def session_closed() -> dict[str, Any]:
    return _event("SessionClosed", "pipeline/0.1.0", reason="idle_timeout", last_turn_id=TURN_ID)


def _vote_payload() -> dict[str, Any]:
    return {
        "judge_id": "prm-judge",
        "judge_kind": "llm",
        "judge_config_version": "prm-v3",
        "model": "SmolLM2-135M-Instruct",
        "model_version": "policy-7",
        "vote_index": 1,
        "prompt_sha256": "9" * 64,
        "prompt_text": "Was the assistant's last action helpful given what happened next? \\boxed{1|-1}",
        "sampling": sampling(seed=11),
        "raw_output": "The tests now fail less. \\boxed{1}",
        "score": 1,
        "parse_error": None,
        "latency_ms": 95.25,
        "prompt_tokens": 410,
        "completion_tokens": 17,
        "next_state_event_id": "NextStateObserved-0123456789abcdef01234567",
    }


def judge_vote_cast() -> dict[str, Any]:
    return _event("JudgeVoteCast", "pipeline/0.1.0", **_vote_payload())


def reward_decided() -> dict[str, Any]:
    return _event(
        "RewardDecided",
        "pipeline/0.1.0",
        vote_ids=["JudgeVoteCast-a", "JudgeVoteCast-b", "JudgeVoteCast-c"],
        votes=[1, None, 1],
        rule="majority",
        rule_version="1",
        reward=1.0,
        reason="majority",
        promoted=False,
        judge_id="prm",
        parts=[],
        explanation=None,
    )


def trajectory_scored() -> dict[str, Any]:
    return _event(
        "TrajectoryScored",
        "pipeline/0.1.0",
        group_id="calc-3:0",
        group_size=4,
        steps=[
            {"turn_id": "turn-0001", "step_index": 0, "reward": 1.0, "reward_event_id": "RewardDecided-a"},
            {"turn_id": "turn-0002", "step_index": 1, "reward": -0.5, "reward_event_id": "RewardDecided-b"},
        ],
    )


def hint_vote_cast() -> dict[str, Any]:
    payload = _vote_payload() | {"judge_id": "hint-judge", "score": None, "hint": "Check empty input first."}
    return _event("HintVoteCast", "pipeline/0.1.0", **payload)


def hint_selected() -> dict[str, Any]:
    return _event(
        "HintSelected",
        "pipeline/0.1.0",
        hint_vote_ids=["HintVoteCast-a", "HintVoteCast-b"],
        selected_vote_id="HintVoteCast-b",
        hint="Check empty input first.",
    )


def hint_rejected() -> dict[str, Any]:
    return _event(
        "HintRejected", "pipeline/0.1.0", hint_vote_ids=["HintVoteCast-a"], reason="no_hint_in_any_vote"
    )


def teacher_scored() -> dict[str, Any]:
    return _event(
        "TeacherScored",
        "pipeline/0.1.0",
        hint_event_id="HintSelected-0123456789abcdef01234567",
        teacher_kind="frozen_reference",
        teacher_prompt_token_ids=[1, 500, 501, 502, 9],
        response_token_ids=[77, 78, 79],
        teacher_logprobs=[-0.25, -1.5, -0.125],
        policy_version=7,
        temperature=1.0,
        teacher_top_ids=[[77, 5], [6, 78], [79, 7]],
        teacher_top_logprobs=[[-0.25, -2.0], [-0.5, -1.5], [-0.125, -3.0]],
    )


def sample_ready() -> dict[str, Any]:
    return _event(
        "SampleReady",
        "pipeline/0.1.0",
        method="combined",
        prompt_token_ids=[1, 500, 501],
        response_token_ids=[77, 78, 79],
        old_logprobs=[-0.5, -0.75, -2.0],
        temperature=0.7,
        reward=1.0,
        teacher_logprobs=[-0.25, -1.5, -0.125],
        teacher_kind="frozen_reference",
        policy_version=7,
        promoted=False,
        off_policy=False,
        lineage=lineage(),
        teacher_top_ids=[[77, 5], [6, 78], [79, 7]],
        teacher_top_logprobs=[[-0.25, -2.0], [-0.5, -1.5], [-0.125, -3.0]],
        policy_run="live",
    )


def sample_rejected() -> dict[str, Any]:
    return _event(
        "SampleRejected", "pipeline/0.1.0", method="binary", reason="zero_reward", lineage=lineage()
    )


def train_step_completed() -> dict[str, Any]:
    return _event(
        "TrainStepCompleted",
        "trainer/0.1.0",
        run_id="run-1",
        step=12,
        policy_version=8,
        sample_ids=["SampleReady-a", "SampleReady-b"],
        loss=0.125,
        pg_loss=0.1,
        kl=0.002,
        clip_fraction=0.05,
        grad_norm=1.75,
        tokens=4096,
        duration_s=2.5,
        tokens_per_s=1638.4,
        dropped_stale=1,
        mean_staleness=0.5,
    )


def checkpoint_published() -> dict[str, Any]:
    return _event(
        "CheckpointPublished",
        "trainer/0.1.0",
        run_id="run-1",
        version=8,
        parent_version=7,
        kind="lora",
        uri="s3://orl-checkpoints/run-1/v8/",
        manifest_key="run-1/v8/manifest.json",
        manifest_sha256="a" * 64,
        base_model="SmolLM2-135M-Instruct",
        consumed_offsets=[{"topic": "live.samples", "partition": 0, "offset": 1024}],
        sample_id_digest="b" * 64,
    )


def policy_rolled_back() -> dict[str, Any]:
    return _event(
        "PolicyRolledBack",
        "trainer/0.1.0",
        run_id="run-1",
        from_version=8,
        to_version=7,
        new_version=10,
        window=32,
        margin=0.25,
        from_approval=0.41,
        to_approval=0.78,
    )


def policy_gated() -> dict[str, Any]:
    answer = {
        "prompt_id": "sess-9:0",
        "sample_index": 0,
        "next_state": "Thanks, that's exactly what I needed.",
        "relevant": True,
        "votes": ['{"score": 1, "explanation": "the user thanked the assistant"}'],
    }
    return _event(
        "PolicyGated",
        "serving.gate/1",
        run_id="run-1",
        version=9,
        baseline_version=8,
        decision="held",
        reason="approval 0.25 vs 0.75 of v8: below it by more than the margin 0.10",
        judge_id="prm",
        prompt_source="log",
        margin=0.1,
        candidate_approval=0.25,
        baseline_approval=0.75,
        candidate_relevance=1.0,
        baseline_relevance=0.5,
        evaluation_s=12.5,
        answers=[
            {**answer, "version": 9, "text": "Sure! **Step 1**", "reward": None},
            {**answer, "version": 8, "text": "Multiply 3 by 3.", "reward": 1},
        ],
    )


def policy_activated() -> dict[str, Any]:
    return _event(
        "PolicyActivated",
        "serving/0.1.0",
        server_id="srv-0",
        run_id="run-1",
        version=8,
        uri="s3://orl-checkpoints/run-1/v8/",
        swap_latency_ms=340.0,
    )


def policy_rejected() -> dict[str, Any]:
    return _event(
        "PolicyRejected",
        "serving/0.1.0",
        server_id="srv-0",
        run_id="run-1",
        version=9,
        uri="s3://orl-checkpoints/run-1/v9/",
        reason="manifest sha256 mismatch",
    )


def dead_lettered() -> dict[str, Any]:
    return _event(
        "DeadLettered",
        "pipeline/0.1.0",
        source_topic="live.responses",
        source_partition=0,
        source_offset=99,
        original_bytes=b"\xc3\x01garbage",
        error="EventDecodeError: unknown writer schema fingerprint",
    )


EXAMPLES: dict[str, Callable[[], dict[str, Any]]] = {
    "RequestReceived": request_received,
    "ResponseGenerated": response_generated,
    "NextStateObserved": next_state_observed,
    "SessionClosed": session_closed,
    "JudgeVoteCast": judge_vote_cast,
    "RewardDecided": reward_decided,
    "TrajectoryScored": trajectory_scored,
    "HintVoteCast": hint_vote_cast,
    "HintSelected": hint_selected,
    "HintRejected": hint_rejected,
    "TeacherScored": teacher_scored,
    "SampleReady": sample_ready,
    "SampleRejected": sample_rejected,
    "TrainStepCompleted": train_step_completed,
    "CheckpointPublished": checkpoint_published,
    "PolicyRolledBack": policy_rolled_back,
    "PolicyGated": policy_gated,
    "PolicyActivated": policy_activated,
    "PolicyRejected": policy_rejected,
    "DeadLettered": dead_lettered,
}


def example_event(event_type: str) -> dict[str, Any]:
    return EXAMPLES[event_type]()
