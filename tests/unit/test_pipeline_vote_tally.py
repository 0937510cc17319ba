"""vote_tally: OpenClaw-RL's majority examples, order invariance, timeouts, rule votes, redelivery."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orl.pipeline.processors.config import PipelineConfig, TallyConfig
from orl.pipeline.processors.event_building import Event
from orl.pipeline.processors.turn_linker import TURN_LINKER
from orl.pipeline.processors.vote_tally import VOTE_TALLY, majority
from orl.schemas.codec import encode

from tests.unit.pipeline_streams import Conversation, of_type, run_processor, tick_processor, vote_event

CONFIG = PipelineConfig(tally=TallyConfig(votes_per_judgement=3, vote_timeout_s=60, retention_s=120))
RAW = {1: "good \\boxed{1}", 0: "meh \\boxed{0}", -1: "bad \\boxed{-1}", None: "I cannot decide"}


def a_next_state() -> Event:
    c = Conversation("tally")
    c.say("hi")
    c.turn("hello")
    c.say("thanks")
    c.turn("welcome")
    _, emits = run_processor(TURN_LINKER, c.events, PipelineConfig())
    return emits[0].event


NEXT_STATE = a_next_state()


def votes(scores: list[int | None]) -> list[Event]:
    return [vote_event(NEXT_STATE, index, RAW[score]) for index, score in enumerate(scores)]


@pytest.mark.parametrize(
    ("scores", "reward", "reason"),
    [
        ([1, 1, -1], 1.0, "majority"),
        ([1, -1, 0], 0.0, "tie"),
        ([1, None, None], 1.0, "majority"),
        ([1, -1, None], 0.0, "tie"),
        ([None, None, None], 0.0, "no_valid_votes"),
        ([-1, -1, 0], -1.0, "majority"),
    ],
)
def test_original_examples(scores: list[int | None], reward: float, reason: str) -> None:
    _, emits = run_processor(VOTE_TALLY, votes(scores), CONFIG)
    (decided,) = of_type(emits, "RewardDecided")
    assert (decided["reward"], decided["reason"], decided["promoted"]) == (reward, reason, False)
    assert decided["votes"] == scores and decided["rule"] == "majority"
    assert emits[0].topic == "rewards"
    encode(decided)


def test_majority_function() -> None:
    assert majority([0, 0, 1]) == (0.0, "majority")
    assert majority([]) == (0.0, "no_valid_votes")


@settings(max_examples=60)
@given(st.lists(st.sampled_from([1, 0, -1, None]), min_size=3, max_size=3), st.randoms())
def test_vote_order_does_not_matter(scores: list[int | None], rnd: object) -> None:
    cast = votes(scores)
    shuffled = list(cast)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    _, in_order = run_processor(VOTE_TALLY, cast, CONFIG)
    _, out_of_order = run_processor(VOTE_TALLY, shuffled, CONFIG)
    assert in_order == out_of_order


def test_waits_for_all_votes_then_times_out_with_missing_ones_as_failures() -> None:
    states, emits = run_processor(VOTE_TALLY, votes([1, 1]), CONFIG)
    assert emits == []
    first_ms = votes([1])[0]["envelope"]["occurred_at"]
    assert tick_processor(VOTE_TALLY, states, first_ms + 59_000, CONFIG) == []
    (emit,) = tick_processor(VOTE_TALLY, states, first_ms + 61_000, CONFIG)
    assert emit.event["reward"] == 1.0 and len(emit.event["vote_ids"]) == 2
    assert emit.event["envelope"]["occurred_at"] == first_ms + 60_000
    _, late = run_processor(VOTE_TALLY, votes([1, 1, -1])[2:], CONFIG, states)
    assert late == []
    assert tick_processor(VOTE_TALLY, states, first_ms + 10**6, CONFIG) == []
    assert states == {}


def test_rule_judge_vote_is_an_outcome_reward() -> None:
    vote = vote_event(NEXT_STATE, 0, "exit code 1 \\boxed{-1}", judge_kind="rule", judge_id="outcome")
    _, emits = run_processor(VOTE_TALLY, [vote], CONFIG)
    (decided,) = of_type(emits, "RewardDecided")
    assert (decided["reward"], decided["reason"], decided["rule"]) == (-1.0, "outcome", "rule_judge")


def test_redelivery_and_replay() -> None:
    cast = votes([1, 0, 1])
    states, emits = run_processor(VOTE_TALLY, cast, CONFIG)
    _, again = run_processor(VOTE_TALLY, cast, CONFIG, states)
    assert again == []
    assert run_processor(VOTE_TALLY, cast, CONFIG)[1] == emits
