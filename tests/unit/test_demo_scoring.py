"""orl.gate.scoring: the student and teacher scorers, relevance and the cluster bootstrap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
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
    DemoDataError,
    bootstrap_ci,
    parse_grading_prompt,
    relevance,
    repeats_question,
    student_score,
    teacher_score,
    word_base,
)

PROMPT = "Why does the Moon have phases?"
GOOD = "The Moon looks different because we see changing parts of its sunlit half as it orbits Earth."
GRADE_PROMPT = (
    "Grade this answer to 'How many sides does a hexagon have?': 'Six sides, like the cells in a honeycomb.'"
)
GOOD_COMMENT = "Nice work! Comparing the six sides to a honeycomb is a great way to remember a hexagon."


def test_a_short_plain_on_topic_answer_scores_one() -> None:
    result = student_score(PROMPT, GOOD)
    assert (result.score, result.violations, result.relevance) == (1.0, (), 1.0)


@pytest.mark.parametrize(
    ("response", "violation"),
    [
        ("The **Moon** shows phases as it orbits.", BOLD),
        ("The __Moon__ shows phases as it orbits.", BOLD),
        ("Phases of the Moon:\n- new moon\n- full moon", LIST),
        ("Phases:\n* new moon", LIST),
        ("Phases:\n+ new moon", LIST),
        ("1. The Moon orbits Earth.\n2. We see its lit half.", LIST),
        ("1) The Moon orbits Earth.", LIST),
        ("# Moon phases\nThe Moon orbits Earth.", HEADER),
        ("The Moon orbits Earth. Final Answer: orbit.", FINAL_ANSWER),
        ("The Moon " + "orbits " * 39, LENGTH),
    ],
)
def test_each_ai_style_marker_scores_zero_and_is_named(response: str, violation: str) -> None:
    result = student_score(PROMPT, response)
    assert result.score == 0.0
    assert violation in result.violations


def test_forty_words_pass_and_forty_one_fail() -> None:
    forty = "Moon " + "word " * 39
    assert student_score(PROMPT, forty).score == 1.0
    result = student_score(PROMPT, forty + "extra")
    assert (result.score, result.violations, result.words) == (0.0, (LENGTH,), 41)


def test_decimals_and_ranges_are_not_list_markers() -> None:
    assert student_score("How do I round 3.467?", "3.5 is 3.467 rounded to one decimal place.").score == 1.0


def test_a_short_off_topic_answer_scores_zero_with_relevance_zero() -> None:
    result = student_score(PROMPT, "I have absolutely nothing to add.")
    assert (result.score, result.relevance, result.violations) == (0.0, 0.0, (OFF_TOPIC,))
    assert relevance(PROMPT, "I have absolutely nothing to add.") == 0.0
    assert result.style == 1.0  # short and plain: the prototype's score, which did not check the topic


def test_style_fails_on_any_check_but_relevance() -> None:
    long_off_topic = student_score(PROMPT, "I have absolutely nothing to add. " * 8)
    assert long_off_topic.style == 0.0 and long_off_topic.relevance == 0.0


def test_relevance_matches_numbers_and_word_prefixes() -> None:
    assert relevance("How do I solve 4x - 7 = 9?", "Add 7 to both sides, then divide by 4.") == 1.0
    assert relevance("Explain photosynthesis for my homework.", "Plants make photosynthetic sugar.") == 1.0
    assert relevance("Explain photosynthesis for my homework.", "It is hard homework, explain more.") == 0.0


def test_relevance_ignores_stop_words_and_question_framing() -> None:
    assert relevance("What is the difference between weather and climate?", "What is the difference?") == 0.0


@pytest.mark.parametrize(
    ("prompt", "response"),
    [
        ("How do vaccines help the immune system?", "How do vaccines help the immune system?"),  # an echo
        ("How do vaccines help the immune system?", "Vaccines help the immune system."),  # a restatement
        ("How does a magnet pick up paper clips?", "A magnet picks up paper clips because it has a magnet."),
        ("What do red blood cells do?", "Red blood cells do nothing."),
        # in other word forms: Binary RL's restatements at step 32 (docs/demo/ablations.md)
        (
            "Why did the ancient Egyptians build pyramids?",
            "The ancient Egyptians built pyramids with pyramids.",
        ),
        ("Why did people in the Middle Ages build castles?", "People in the Middle Ages built castles."),
        ("Why did the Titanic sink?", "The Titanic sank."),
        ("How do I solve 4x - 7 = 9?", "You solved 4x - 7 = 9 by solving it."),
    ],
)
def test_saying_the_question_back_is_not_an_answer(prompt: str, response: str) -> None:
    # Binary RL learned exactly these under a user who let them pass (docs/demo/ablations.md).
    result = student_score(prompt, response)
    assert repeats_question(prompt, response)
    assert (result.score, result.relevance, result.violations) == (0.0, 0.0, (OFF_TOPIC,))


@pytest.mark.parametrize(
    ("prompt", "response"),
    [
        (
            "Should I write 'fewer apples' or 'less apples'?",
            "Write 'fewer apples', since apples can be counted.",
        ),
        (
            "Should I write 'fewer apples' or 'less apples'?",
            "Write 'fewer apples'.",
        ),  # picked out of the question
        ("What is the subject in the sentence 'The tall dog barked loudly'?", "The subject is the tall dog."),
        ("How do I work out 25% of 60?", "25% of 60 is 15."),
        ("What do red blood cells do?", "Red blood cells carry oxygen around the body."),
        ("Why did the Titanic sink?", "The Titanic sank after it hit an iceberg."),
        ("Why did the Romans build so many roads?", "Roads built by Romans moved armies fast."),
    ],
)
def test_an_answer_that_uses_the_questions_words_is_still_an_answer(prompt: str, response: str) -> None:
    assert not repeats_question(prompt, response)
    assert student_score(prompt, response).score == 1.0


@pytest.mark.parametrize(
    ("forms", "base"),
    [
        (("build", "built", "building", "builds"), "build"),
        (("solve", "solved", "solving", "solves"), "solv"),
        (("sink", "sank", "sunk", "sinking"), "sink"),
        (("change", "changed", "changes", "changing"), "chang"),
        (("seed", "seeds"), "seed"),  # "seed" keeps its "ed": no ending leaves fewer than 3 letters
    ],
)
def test_word_forms_share_a_base(forms: tuple[str, ...], base: str) -> None:
    assert {word_base(form) for form in forms} == {base}


def test_grading_prompt_parses_quoted_question_and_answer() -> None:
    prompt = "Grade this answer to 'What is a synonym for 'happy'?': 'Joyful, like my birthday.'"
    assert parse_grading_prompt(prompt) == ("What is a synonym for 'happy'?", "Joyful, like my birthday.")


def test_a_specific_friendly_short_comment_scores_one() -> None:
    result = teacher_score(GRADE_PROMPT, GOOD_COMMENT)
    assert (result.score, result.violations, result.relevance) == (1.0, (), 1.0)


@pytest.mark.parametrize(
    ("comment", "violation"),
    [
        ("Great job, keep going!", NOT_SPECIFIC),
        ("Six sides and the honeycomb comparison are both there.", NOT_FRIENDLY),
        ("This answer is incorrect. The correct answer is: 'Six sides, like a honeycomb.'", NOT_FRIENDLY),
        ("Grade: A\nNice honeycomb comparison.", TEMPLATE),
        ("Nice honeycomb comparison, 9/10.", TEMPLATE),
        ("Strengths: nice honeycomb comparison.", TEMPLATE),
        ("The student's answer is great: six sides, like a honeycomb.", TEMPLATE),
        ("**Nice** honeycomb comparison.", BOLD),
        ("Nice work:\n- honeycomb comparison", LIST),
        ("# Feedback\nNice honeycomb comparison.", HEADER),
        ("Nice honeycomb comparison! " + "really " * 40, LENGTH),
    ],
)
def test_each_teacher_violation_scores_zero_and_is_named(comment: str, violation: str) -> None:
    result = teacher_score(GRADE_PROMPT, comment)
    assert result.score == 0.0
    assert violation in result.violations


def test_an_off_topic_comment_is_not_specific_and_not_relevant() -> None:
    result = teacher_score(GRADE_PROMPT, "I have absolutely nothing to add.")
    assert result.score == 0.0
    assert result.relevance == 0.0
    assert NOT_SPECIFIC in result.violations


def test_bootstrap_interval_contains_the_mean_of_prompt_means() -> None:
    scores = [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0, 1.0, 0.0]]
    mean, low, high = bootstrap_ci(scores)
    assert mean == pytest.approx((1.0 + 0.5 + 0.0 + 0.5 + 0.75) / 5)
    assert low <= mean <= high
    assert 0.0 <= low < high <= 1.0


def test_bootstrap_narrows_with_more_prompts() -> None:
    few = [[1.0], [0.0]] * 4
    many = [[1.0], [0.0]] * 64
    _, low_few, high_few = bootstrap_ci(few)
    _, low_many, high_many = bootstrap_ci(many)
    assert high_many - low_many < high_few - low_few


def test_bootstrap_is_deterministic_for_a_seed() -> None:
    scores = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    assert bootstrap_ci(scores, seed=3) == bootstrap_ci(scores, seed=3)


def test_bootstrap_rejects_empty_input() -> None:
    with pytest.raises(DemoDataError):
        bootstrap_ci([])
    with pytest.raises(DemoDataError):
        bootstrap_ci([[1.0], []])


@given(st.text(max_size=400))
def test_scores_are_zero_or_one_and_say_why(response: str) -> None:
    for result in (student_score(PROMPT, response), teacher_score(GRADE_PROMPT, response)):
        assert result.score in (0.0, 1.0)
        assert (result.score == 1.0) == (result.violations == ())
        assert result.relevance in (0.0, 1.0)


@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=4), min_size=1, max_size=20))
def test_bootstrap_interval_always_brackets_the_mean(scores: list[list[float]]) -> None:
    mean, low, high = bootstrap_ci(scores, resamples=200)
    assert low - 1e-9 <= mean <= high + 1e-9
