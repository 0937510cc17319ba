"""The user_reply / user_hint rule judges (pipeline/effects/reply_rules.py) against every reply the demo's simulated user can produce."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from orl.gate.scoring import (
    BOLD,
    FINAL_ANSWER,
    HEADER,
    LENGTH,
    LIST,
    NOT_FRIENDLY,
    NOT_SPECIFIC,
    OFF_TOPIC,
    TEMPLATE,
)
from orl.pipeline.effects.reply_rules import user_hint_extractor, user_reply_judge

from orl.demo.scenarios import STUDENT, TEACHER, Scenario
from orl.demo.simulated_user import DIRECTIVES, SATISFIED_REPLIES, redo_variants

STUDENT_VIOLATIONS = (LENGTH, BOLD, LIST, HEADER, FINAL_ANSWER, OFF_TOPIC)
TEACHER_VIOLATIONS = (LENGTH, BOLD, LIST, HEADER, TEMPLATE, NOT_SPECIFIC, NOT_FRIENDLY)
REQUEST = [{"role": "user", "content": "Why does the Moon have phases?"}]
NEUTRAL = (
    "Ok.",
    "What about the next question on my sheet?",
    "Can you also tell me how long a lunar month is?",
    "",
)


def subsets(codes: tuple[str, ...]) -> Iterator[list[str]]:
    for size in range(1, len(codes) + 1):
        for combination in itertools.combinations(codes, size):
            yield list(combination)


def every_redo(scenario: Scenario, codes: tuple[str, ...]) -> Iterator[str]:
    """Every redo text the user can produce: all violation sets, all phrasings, two prompts."""
    for prompt in scenario.prompts[:2]:
        for violations in subsets(codes):
            yield from redo_variants(violations, prompt)


ALL_REDOS = sorted(
    set(every_redo(STUDENT, STUDENT_VIOLATIONS)) | set(every_redo(TEACHER, TEACHER_VIOLATIONS))
)


def test_all_redo_texts_are_enumerated() -> None:
    assert len(ALL_REDOS) > 10_000


@pytest.mark.parametrize("reply", SATISFIED_REPLIES)
def test_satisfied_replies_are_plus_one_and_give_no_hint(reply: str) -> None:
    assert user_reply_judge(REQUEST, "any response", {"role": "user", "content": reply})[0] == 1
    score, hint, _ = user_hint_extractor(REQUEST, "any response", {"role": "user", "content": reply})
    assert (score, hint) == (-1, None)


def test_every_redo_variant_is_minus_one() -> None:
    wrong = [text for text in ALL_REDOS if user_reply_judge(REQUEST, "", text)[0] != -1]
    assert wrong == []


def test_every_redo_variant_yields_a_hint_of_more_than_ten_characters() -> None:
    failures = []
    for text in ALL_REDOS:
        score, hint, _ = user_hint_extractor(REQUEST, "", text)
        if score != 1 or hint is None or len(hint) <= 10:
            failures.append(text)
    assert failures == []


def test_the_hint_is_the_directive_as_an_instruction() -> None:
    variants = list(redo_variants([LENGTH, BOLD], STUDENT.prompts[0]))
    for text in variants:
        _, hint, _ = user_hint_extractor(REQUEST, "", text)
        assert hint is not None
        assert hint[0].isupper() and hint.endswith(".")
        assert "40 words" in hint and "bold" in hint
        assert not hint.lower().startswith(("please", "next time", "from now on"))
        assert "redo" not in hint and "problem" not in hint


def test_every_directive_phrase_reaches_the_hint() -> None:
    for code, phrases in DIRECTIVES.items():
        for style, phrase in enumerate(phrases):
            text = f"Not like that. Please {phrase.format(question='why tides happen', detail='honeycomb')}."
            _, hint, _ = user_hint_extractor(REQUEST, "", text)
            assert hint is not None, (code, style)
            assert phrase.format(question="why tides happen", detail="honeycomb")[1:] in hint


@pytest.mark.parametrize("reply", NEUTRAL)
def test_neutral_replies_are_zero_and_give_no_hint(reply: str) -> None:
    assert user_reply_judge(REQUEST, "", reply)[0] == 0
    assert user_hint_extractor(REQUEST, "", reply)[:2] == (-1, None)


def test_a_correction_wins_over_thanks() -> None:
    assert user_reply_judge(REQUEST, "", "Thanks, but it's too long.")[0] == -1


def test_the_judge_ignores_the_response_style() -> None:
    styled = "# Phases\n1. **New**\n2. **Full**\nFinal Answer: orbit."
    reply = {"role": "user", "content": SATISFIED_REPLIES[0]}
    assert user_reply_judge(REQUEST, styled, reply) == user_reply_judge(REQUEST, "plain", reply)


def test_judges_accept_a_next_state_mapping_or_text() -> None:
    text = "Could you try that again? Please leave out the bold."
    assert user_reply_judge(REQUEST, "", text) == user_reply_judge(REQUEST, "", {"content": text})
    assert user_hint_extractor(REQUEST, "", text)[1] == "Leave out the bold."
