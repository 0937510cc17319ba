"""orl.demo.simulated_user and orl.demo.scenarios: the scripted user's reactions and the scenario data."""

from __future__ import annotations

import random

import pytest
from orl.gate.scoring import LENGTH, OFF_TOPIC, keywords, parse_grading_prompt
from orl.pipeline.effects.reply_rules import user_hint_extractor
from orl.schemas.errors import ConfigError

from orl.demo.scenarios import (
    HELD_OUT_COUNT,
    SCENARIOS,
    STUDENT,
    TEACHER,
    evaluation_prompts,
    get_scenario,
    make_scenario,
    split_prompts,
)
from orl.demo.simulated_user import SATISFIED_REPLIES, react, redo_variants
from orl.gate_scenarios import scenario_prompts

PROMPT = "Why does the Moon have phases?"
GOOD = "We see different parts of the Moon's sunlit half as it orbits Earth."
TEMPLATED = "# Moon phases\n1. **New moon**: dark.\n2. **Full moon**: bright.\nFinal Answer: the orbit."
GRADE_PROMPT = TEACHER.prompts[0]


@pytest.mark.parametrize("scenario", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_scenarios_have_enough_prompts_and_a_disjoint_seeded_split(scenario) -> None:
    assert len(scenario.prompts) >= 40
    assert len(set(scenario.prompts)) == len(scenario.prompts)
    assert len(scenario.gate_prompts) == HELD_OUT_COUNT
    assert not set(scenario.train_prompts) & set(scenario.gate_prompts)
    assert set(scenario.train_prompts) | set(scenario.gate_prompts) == set(scenario.prompts)
    assert split_prompts(scenario.prompts) == (scenario.train_prompts, scenario.gate_prompts)
    assert len(scenario.hint) > 10


@pytest.mark.parametrize("scenario", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_the_demo_evaluates_on_prompts_that_neither_the_gate_nor_any_session_asks(scenario) -> None:
    """Issue 48: a version the gate selected is scored on prompts it was not selected on."""
    evaluated = evaluation_prompts(scenario, 16)
    gated = {p.text for p in scenario_prompts(scenario.name, 16)}
    assert len(set(evaluated)) == 16 and len(gated) == 16
    assert not set(evaluated) & gated
    assert not set(evaluated) & set(scenario.train_prompts)


def test_a_scenario_refuses_evaluation_prompts_from_its_pool() -> None:
    with pytest.raises(ConfigError, match="outside the pool"):
        make_scenario("s", "d", STUDENT.prompts, STUDENT.prompts[:1], STUDENT.hint, STUDENT.scorer)
    with pytest.raises(ConfigError, match="distinct"):
        make_scenario("s", "d", STUDENT.prompts, ("Why?", "Why?"), STUDENT.hint, STUDENT.scorer)


@pytest.mark.parametrize("scenario", list(SCENARIOS.values()), ids=list(SCENARIOS))
def test_every_prompt_has_content_words_to_be_relevant_to(scenario) -> None:
    for prompt in scenario.prompts + scenario.eval_prompts:
        _, answer = parse_grading_prompt(prompt)
        assert keywords(prompt), prompt
        assert keywords(answer), prompt


def test_every_teacher_prompt_parses_as_question_and_answer() -> None:
    for prompt in TEACHER.prompts:
        question, answer = parse_grading_prompt(prompt)
        assert question and answer != prompt


def test_unknown_scenario_is_a_config_error() -> None:
    assert get_scenario("student") is STUDENT
    with pytest.raises(ConfigError, match="student"):
        get_scenario("pirate")


def test_a_good_response_gets_a_satisfied_reply() -> None:
    reaction = react(STUDENT, PROMPT, GOOD, random.Random(0))
    assert reaction.satisfied
    assert reaction.violations == []
    assert reaction.text in SATISFIED_REPLIES


def test_a_templated_response_gets_a_redo_naming_each_violation() -> None:
    reaction = react(STUDENT, PROMPT, TEMPLATED, random.Random(0))
    assert not reaction.satisfied
    assert set(reaction.violations) == {"bold", "list", "header", "final_answer"}
    text = reaction.text.lower()
    assert "bold" in text
    assert "list" in text or "numbered" in text
    assert "header" in text or "heading" in text
    assert "final answer" in text


def test_a_long_response_is_asked_to_be_under_forty_words() -> None:
    reaction = react(STUDENT, PROMPT, "The Moon orbits Earth. " * 12, random.Random(1))
    assert reaction.violations == [LENGTH]
    assert "40 words" in reaction.text


def test_an_off_topic_response_is_asked_to_answer_the_question() -> None:
    reaction = react(
        STUDENT, "Why did the Titanic sink?", "I have absolutely nothing to add.", random.Random(0)
    )
    assert reaction.violations == [OFF_TOPIC]
    assert "why did the Titanic sink" in reaction.text


def test_a_user_who_restates_the_length_repeats_it_only_for_answers_that_kept_it() -> None:
    off_topic = "I have absolutely nothing to add."
    plain = react(STUDENT, "Why did the Titanic sink?", off_topic, random.Random(0))
    restated = react(STUDENT, "Why did the Titanic sink?", off_topic, random.Random(0), restate_length=True)
    assert restated.violations == plain.violations == [OFF_TOPIC]
    assert "40 words" not in plain.text and "40 words" in restated.text
    assert "why did the Titanic sink" in restated.text
    _, hint, _ = user_hint_extractor([], off_topic, {"role": "user", "content": restated.text})
    assert hint is not None and "40 words" in hint and "Titanic" in hint
    long_answer = "The Moon orbits Earth. " * 12
    once = react(STUDENT, PROMPT, long_answer, random.Random(1), restate_length=True)
    assert once.text == react(STUDENT, PROMPT, long_answer, random.Random(1)).text  # said once already


def test_a_two_sentence_question_is_quoted_as_one_clause() -> None:
    prompt = "What is a simile? Give me one about rain."
    reaction = react(STUDENT, prompt, "I have absolutely nothing to add.", random.Random(0))
    assert "what is a simile; Give me one about rain" in reaction.text


def test_the_teacher_correction_names_a_detail_of_the_student_answer() -> None:
    reaction = react(TEACHER, GRADE_PROMPT, "Great job, keep going!", random.Random(0))
    assert "not_specific" in reaction.violations
    _, answer = parse_grading_prompt(GRADE_PROMPT)
    assert any(word in reaction.text for word in keywords(answer))
    assert "'coats'" in reaction.text  # the first content word of "Coats trap warm air ..."


def test_reactions_are_deterministic_for_a_seed_and_vary_across_seeds() -> None:
    texts = [react(STUDENT, PROMPT, "The Moon orbits. " * 20, random.Random(seed)).text for seed in range(12)]
    again = [react(STUDENT, PROMPT, "The Moon orbits. " * 20, random.Random(seed)).text for seed in range(12)]
    assert texts == again
    assert len(set(texts)) > 3
    satisfied = {react(STUDENT, PROMPT, GOOD, random.Random(seed)).text for seed in range(30)}
    assert len(satisfied) > 3


def test_redo_variants_cover_many_distinct_texts() -> None:
    variants = list(redo_variants([LENGTH], PROMPT))
    assert len(set(variants)) == len(variants) == 90
