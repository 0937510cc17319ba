"""hint_selector: longest usable hint wins, deterministic ties, rejection reasons, order invariance."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from orl.pipeline.processors.config import HintSelectionConfig, PipelineConfig
from orl.pipeline.processors.event_building import Event
from orl.pipeline.processors.hint_selector import HINT_SELECTOR
from orl.schemas.codec import encode

from tests.unit.pipeline_streams import of_type, run_processor, vote_event
from tests.unit.test_pipeline_vote_tally import NEXT_STATE

CONFIG = PipelineConfig(hints=HintSelectionConfig(votes_per_judgement=3))


def hint_votes(outputs: list[str]) -> list[Event]:
    return [vote_event(NEXT_STATE, index, raw, hint_vote=True) for index, raw in enumerate(outputs)]


def positive(hint: str) -> str:
    return f"\\boxed{{1}}\n[HINT_START]{hint}[HINT_END]"


def test_longest_hint_over_ten_characters_wins() -> None:
    cast = hint_votes(
        [
            positive("Ask first."),
            positive("Check the file exists before moving it."),
            positive("Be brief, please."),
        ]
    )
    _, emits = run_processor(HINT_SELECTOR, cast, CONFIG)
    (selected,) = of_type(emits, "HintSelected")
    assert selected["hint"] == "Check the file exists before moving it."
    assert selected["selected_vote_id"] == cast[1]["envelope"]["event_id"]
    assert selected["hint_vote_ids"] == [v["envelope"]["event_id"] for v in cast]
    assert emits[0].topic == "hints"
    encode(selected)


def test_equal_length_hints_go_to_the_lowest_vote_index() -> None:
    cast = hint_votes(["\\boxed{-1}", positive("Use tabs here."), positive("Use dots here.")])
    _, emits = run_processor(HINT_SELECTOR, list(reversed(cast)), CONFIG)
    assert of_type(emits, "HintSelected")[0]["selected_vote_id"] == cast[1]["envelope"]["event_id"]


def test_rejection_reasons() -> None:
    cases = {
        "all_negative": ["\\boxed{-1}", "\\boxed{-1}", "garbage"],
        "hints_too_short": [positive("Be nicer."), "\\boxed{1}", "\\boxed{-1}"],
        "no_valid_votes": ["garbage", "\\boxed{0}", "\\boxed{7}"],
    }
    for reason, outputs in cases.items():
        _, emits = run_processor(HINT_SELECTOR, hint_votes(outputs), CONFIG)
        (rejected,) = of_type(emits, "HintRejected")
        assert rejected["reason"] == reason
        encode(rejected)


def test_a_negative_vote_with_a_hint_is_not_a_candidate() -> None:
    cast = hint_votes(
        ["\\boxed{-1} [HINT_START]A long but rejected hint here.[HINT_END]", "\\boxed{-1}", "\\boxed{-1}"]
    )
    _, emits = run_processor(HINT_SELECTOR, cast, CONFIG)
    assert of_type(emits, "HintRejected")[0]["reason"] == "all_negative"


def test_own_outputs_on_the_hints_topic_are_ignored() -> None:
    states, emits = run_processor(HINT_SELECTOR, hint_votes([positive("Check inputs first.")] * 3), CONFIG)
    _, again = run_processor(HINT_SELECTOR, [emit.event for emit in emits], CONFIG, states)
    assert again == []


hint_texts = st.sampled_from(
    ["", "short", "Check the docs first.", "Ask which file the user means.", "Use tabs here."]
)


@settings(max_examples=60)
@given(st.lists(st.tuples(st.sampled_from([1, -1, None]), hint_texts), min_size=3, max_size=3), st.randoms())
def test_selection_ignores_arrival_order(votes: list[tuple[int | None, str]], rnd: object) -> None:
    raw = {1: "\\boxed{1}", -1: "\\boxed{-1}", None: "?"}
    cast = hint_votes([f"{raw[score]} [HINT_START]{hint}[HINT_END]" for score, hint in votes])
    shuffled = list(cast)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert run_processor(HINT_SELECTOR, cast, CONFIG)[1] == run_processor(HINT_SELECTOR, shuffled, CONFIG)[1]
