"""sample_builder: each method, waiting for inputs in any order, the at-least-one promotion, determinism."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orl.pipeline.processors.config import PipelineConfig, SampleConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import Event, event_type_of
from orl.pipeline.processors.sample_builder import SAMPLE_BUILDER
from orl.pipeline.processors.topology import stage_named
from orl.rules.top_k import top_k_rows_aligned
from orl.schemas.codec import encode

from tests.unit.pipeline_streams import (
    Conversation,
    PipelineDriver,
    ScriptedEffects,
    of_type,
    run_processor,
    tick_processor,
)

UP, DOWN, ZERO, FAIL = "\\boxed{1}", "\\boxed{-1}", "\\boxed{0}", "no idea"
HINT = "\\boxed{1} [HINT_START]Confirm the target directory before moving files.[HINT_END]"


def config(method: str, **fields: object) -> PipelineConfig:
    return PipelineConfig(samples=SampleConfig(method=method, **fields))  # type: ignore[arg-type]


def three_turns(close: bool = True, temperature: float = 0.7) -> tuple[Conversation, list[str]]:
    c = Conversation("sb")
    ids = []
    for question in ("move a.txt to docs/", "now copy b.txt", "thanks"):
        c.say(question)
        ids.append(c.turn(f"done with: {question}", temperature=temperature, policy_version=3).turn_id)
    if close:
        c.close()
    return c, ids


def run(
    method: str,
    rewards: dict[str, list[str]],
    hints: dict[str, list[str]],
    temperature: float = 0.7,
    **fields: object,
) -> list[Emit]:
    c, _ = three_turns(temperature=temperature)
    driver = PipelineDriver(config(method, **fields), ScriptedEffects(rewards, hints))
    driver.feed_all(c.events)
    for emit in driver.log:
        encode(emit.event)
    return driver.log


def samples_by_turn(log: list[Emit]) -> dict[str, Event]:
    return {e.event["envelope"]["turn_id"]: e.event for e in log if e.topic == "samples"}


def test_binary_uses_the_exact_sampled_tokens_logprobs_and_temperature() -> None:
    c, (t0, t1, t2) = three_turns(temperature=0.9)
    log = run("binary", {"sb-t0": [UP, UP, DOWN], "sb-t1": [DOWN, DOWN, FAIL]}, {}, temperature=0.9)
    by_turn = samples_by_turn(log)
    ready = by_turn[t0]
    response = next(e for e in c.events if event_type_of(e) == "ResponseGenerated")
    assert event_type_of(ready) == "SampleReady" and ready["reward"] == 1.0
    assert ready["old_logprobs"] == response["response_logprobs"]
    assert ready["response_token_ids"] == response["response_token_ids"]
    assert ready["prompt_token_ids"] == response["prompt_token_ids"]
    assert (ready["temperature"], ready["policy_version"], ready["teacher_logprobs"]) == (0.9, 3, None)
    lineage = ready["lineage"]
    assert lineage["response_event_id"] == response["envelope"]["event_id"]
    assert lineage["request_event_id"] == c.events[0]["envelope"]["event_id"]
    assert lineage["next_state_event_id"] and lineage["reward_event_id"] and lineage["hint_event_id"] is None
    assert by_turn[t1]["reward"] == -1.0
    assert (event_type_of(by_turn[t2]), by_turn[t2]["reason"]) == ("SampleRejected", "reward_zero")
    assert of_type(log, "RewardDecided")[-1]["promoted"] is False


def test_opd_needs_a_selected_hint_and_teacher_scores() -> None:
    log = run("opd", {}, {"sb-t1": [HINT, DOWN, DOWN]})
    by_turn = samples_by_turn(log)
    ready = by_turn["sb-t1"]
    assert ready["reward"] is None and ready["teacher_kind"] == "frozen_reference"
    assert len(ready["teacher_logprobs"]) == len(ready["response_token_ids"])
    assert ready["lineage"]["hint_event_id"] and ready["lineage"]["teacher_event_id"]
    assert by_turn["sb-t0"]["reason"] == "no_valid_hint"


def test_top_k_teacher_rows_reach_the_sample() -> None:
    c, _ = three_turns()
    effects = ScriptedEffects({"sb-t1": [UP] * 3}, {"sb-t1": [HINT, DOWN, DOWN]}, teacher_top_k=3)
    driver = PipelineDriver(config("combined"), effects)
    driver.feed_all(c.events)
    teacher = of_type(driver.log, "TeacherScored")[0]
    ready = samples_by_turn(driver.log)["sb-t1"]
    encode(ready)
    assert ready["teacher_top_ids"] == teacher["teacher_top_ids"]
    assert ready["teacher_top_logprobs"] == teacher["teacher_top_logprobs"]
    assert [len(row) for row in ready["teacher_top_ids"]] == [3] * len(ready["response_token_ids"])


def test_a_token_level_teacher_leaves_the_top_k_fields_empty() -> None:
    ready = samples_by_turn(run("opd", {}, {"sb-t1": [HINT, DOWN, DOWN]}))["sb-t1"]
    assert ready["teacher_top_ids"] is None and ready["teacher_top_logprobs"] is None


@pytest.mark.parametrize(
    ("top_ids", "top_logprobs", "aligned"),
    [
        (None, None, True),
        ([[1, 2], [3, 4]], [[-0.1, -2.0], [-0.2, -3.0]], True),
        ([[1, 2]], [[-0.1, -2.0]], False),  # one row for two tokens
        ([[1, 2], [3, 4]], None, False),  # ids without logprobs
        ([[1, 2], [3]], [[-0.1, -2.0], [-0.2]], False),  # ragged K
        ([[], []], [[], []], False),  # K = 0
    ],
)
def test_top_k_rows_must_fit_the_response(top_ids: object, top_logprobs: object, aligned: bool) -> None:
    assert top_k_rows_aligned(top_ids, top_logprobs, 2) is aligned  # type: ignore[arg-type]


def test_combined_never_adds_an_opd_term_to_a_reward_only_turn() -> None:
    log = run(
        "combined", {"sb-t0": [UP] * 3, "sb-t1": [DOWN] * 3}, {"sb-t1": [HINT] * 3, "sb-t2": [HINT] * 3}
    )
    by_turn = samples_by_turn(log)
    reward_only = by_turn["sb-t0"]
    assert reward_only["reward"] == 1.0
    assert reward_only["teacher_logprobs"] is None and reward_only["teacher_kind"] is None
    assert reward_only["lineage"]["teacher_event_id"] is None
    both = by_turn["sb-t1"]
    assert both["reward"] == -1.0 and both["teacher_logprobs"] is not None
    hint_only = by_turn["sb-t2"]
    assert hint_only["reward"] is None and hint_only["teacher_logprobs"] is not None


def test_combined_rejects_a_turn_with_neither_signal() -> None:
    log = run("combined", {"sb-t0": [UP] * 3}, {})
    assert samples_by_turn(log)["sb-t1"]["reason"] == "no_signal"


def test_combined_waits_for_the_hint_outcome_after_the_reward() -> None:
    log = run("combined", {"sb-t0": [UP] * 3}, {})
    builder_inputs = stage_named("sample_builder").inputs
    c, _ = three_turns()
    events = c.events + [e.event for e in log if e.topic in builder_inputs]
    without_hints = [e for e in events if event_type_of(e) not in ("HintRejected", "HintSelected")]
    _, emits = run_processor(
        SAMPLE_BUILDER, [e for e in without_hints if event_type_of(e) != "SessionClosed"], config("combined")
    )
    assert emits == []


def test_at_least_one_promotes_the_last_judged_turn_with_a_negative_reward() -> None:
    log = run("binary", {"sb-t0": [UP, DOWN, ZERO], "sb-t1": [ZERO] * 3, "sb-t2": [UP, DOWN, FAIL]}, {})
    ready = of_type(log, "SampleReady")
    assert len(ready) == 1
    promoted = ready[0]
    assert promoted["promoted"] is True and promoted["envelope"]["turn_id"] == "sb-t2"
    assert promoted["reward"] == -0.1
    (promotion,) = [r for r in of_type(log, "RewardDecided") if r["promoted"]]
    assert promotion["reason"] == "at_least_one_promotion" and promotion["reward"] == -0.1
    assert promotion["votes"] == [1, -1, None]
    assert promoted["lineage"]["reward_event_id"] == promotion["envelope"]["event_id"]


def test_promotion_uses_the_mean_of_valid_votes_when_it_is_not_zero() -> None:
    log = run("binary", {"sb-t2": [ZERO, ZERO, UP]}, {}, promotion_reward=0.2)
    (promoted,) = of_type(log, "SampleReady")
    assert promoted["reward"] == 1 / 3


def test_no_promotion_when_the_session_has_a_sample_or_when_disabled() -> None:
    assert all(not s["promoted"] for s in of_type(run("binary", {"sb-t0": [UP] * 3}, {}), "SampleReady"))
    assert of_type(run("binary", {}, {}, at_least_one=False), "SampleReady") == []


def test_no_promotion_under_opd_whose_promoted_sample_would_carry_no_teacher_signal() -> None:
    log = run("opd", {"sb-t2": [UP, DOWN, FAIL]}, {})
    assert of_type(log, "SampleReady") == []
    assert [r for r in of_type(log, "RewardDecided") if r["promoted"]] == []
    assert len(of_type(log, "SampleRejected")) >= 1  # the turns are still decided, as rejections


def test_promotion_waits_for_the_last_turn_then_times_out() -> None:
    c, (_, _, t2) = three_turns(close=False)
    c.close(last_turn_id=t2)
    cfg = config("binary", settle_timeout_s=30)
    states, emits = run_processor(SAMPLE_BUILDER, c.events, cfg)
    assert emits == []  # the last turn is not judged yet
    closed_ms = c.events[-1]["envelope"]["occurred_at"]
    assert tick_processor(SAMPLE_BUILDER, states, closed_ms + 29_000, cfg) == []
    assert (
        tick_processor(SAMPLE_BUILDER, states, closed_ms + 31_000, cfg) == []
    )  # nothing judged: nothing to promote
    assert tick_processor(SAMPLE_BUILDER, states, closed_ms + 10**8, cfg) == []
    assert states == {}


def test_greedy_responses_are_rejected_not_trained() -> None:
    c, _ = three_turns(temperature=0.0)
    driver = PipelineDriver(config("binary"), ScriptedEffects({"sb-t0": [UP] * 3}, {}))
    driver.feed_all(c.events)
    assert samples_by_turn(driver.log)["sb-t0"]["reason"] == "greedy_sampling"
    assert of_type(driver.log, "SampleReady") == []  # and never promoted


def builder_inputs(method: str) -> tuple[list[Event], list[Event]]:
    """The sample builder's input stream from a full run, and what it produced."""
    c, _ = three_turns()
    log = run(method, {"sb-t0": [UP] * 3, "sb-t1": [ZERO] * 3}, {"sb-t1": [HINT] * 3})
    inputs = stage_named("sample_builder").inputs
    events = [e for e in c.events] + [e.event for e in log if e.topic in inputs]
    produced = [e.event for e in log if e.event["envelope"]["producer"].startswith("pipeline.sample_builder")]
    return [
        e for e in events if not e["envelope"]["producer"].startswith("pipeline.sample_builder")
    ], produced


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["binary", "opd", "combined"]), st.randoms())
def test_outputs_do_not_depend_on_input_order(method: str, rnd: object) -> None:
    events, produced = builder_inputs(method)
    closes = [e for e in events if event_type_of(e) == "SessionClosed"]
    others = [e for e in events if event_type_of(e) != "SessionClosed"]
    rnd.shuffle(others)  # type: ignore[attr-defined]
    _, emits = run_processor(SAMPLE_BUILDER, others + closes, config(method))
    key = lambda e: e["envelope"]["event_id"]  # noqa: E731
    assert sorted((e.event for e in emits), key=key) == sorted(produced, key=key)


def test_redelivery_emits_nothing_and_replay_is_byte_identical() -> None:
    events, _ = builder_inputs("combined")
    states, emits = run_processor(SAMPLE_BUILDER, events, config("combined"))
    _, again = run_processor(SAMPLE_BUILDER, events, config("combined"), states)
    assert again == []
    _, replay = run_processor(SAMPLE_BUILDER, events, config("combined"))
    assert [encode(e.event) for e in replay] == [encode(e.event) for e in emits]


def stored(state: object) -> str:
    """A sample builder state as its changelog holds it."""
    return SAMPLE_BUILDER.state_codec.to_bytes(state).decode()


def test_states_kept_in_memory_only_give_the_same_bytes_unpacked() -> None:
    events, _ = builder_inputs("combined")
    memory_config = replace(config("combined"), compact_states=False)
    _, packed = run_processor(SAMPLE_BUILDER, events, config("combined"))
    _, unpacked = run_processor(SAMPLE_BUILDER, events, memory_config)
    assert packed and [encode(e.event) for e in unpacked] == [encode(e.event) for e in packed]
    first_response = [event_type_of(e) for e in events].index("ResponseGenerated")
    holding = events[: first_response + 1]  # a state that holds a response's arrays
    (packed_state,) = (
        stored(s) for s in run_processor(SAMPLE_BUILDER, holding, config("combined"))[0].values()
    )
    (state,) = (stored(s) for s in run_processor(SAMPLE_BUILDER, holding, memory_config)[0].values())
    assert "token_ids_json" in packed_state and "response_token_ids" not in packed_state
    assert "response_token_ids" in state and "token_ids_json" not in state


def test_constrained_responses_are_rejected_not_trained() -> None:
    """A response_format json turn was sampled from a masked distribution: its logprobs are not the
    policy's, so no sample is built from it (docs/clients.md)."""
    c, (t0, t1, _) = three_turns()
    response = next(
        e
        for e in c.events
        if e["envelope"]["event_type"] == "ResponseGenerated" and e["envelope"]["turn_id"] == t0
    )
    response["sampling"] = {**response["sampling"], "constraint": '{"type":"json_object"}'}
    driver = PipelineDriver(config("binary"), ScriptedEffects({t0: [UP] * 3, t1: [UP] * 3}, {}))
    driver.feed_all(c.events)
    decided = samples_by_turn(driver.log)
    assert decided[t0]["reason"] == "constrained_decoding"
    assert decided[t1]["envelope"]["event_type"] == "SampleReady"
