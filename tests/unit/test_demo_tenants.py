"""`orl demo --two-tenants`: the explainer's preference is the student's opposite, its user's redo turns
into a -1 and a hint, and the report says per tenant whether issue 47's targets were met."""

from __future__ import annotations

import json
import random
from pathlib import Path

from orl.gate.scoring import MIN_DETAILED_WORDS, OFF_TOPIC, TOO_SHORT, explainer_score
from orl.pipeline.effects.reply_rules import user_hint_extractor, user_reply_judge

from orl.demo.run import DemoSettings
from orl.demo.scenarios import EXPLAINER, STUDENT
from orl.demo.session_driver import Evaluation
from orl.demo.simulated_user import react
from orl.demo.tenants import TENANT_SCENARIOS, check_tenant_targets, tenant_up_settings, write_tenant_report
from orl.up import stack_launches

PROMPT = "Why does the Moon have phases?"
SHORT = "We see different parts of the Moon's sunlit half as it orbits Earth."
LONG = " ".join([SHORT] * 9)  # 117 words, on topic


def test_no_answer_pleases_both_the_student_and_the_explainer() -> None:
    for answer in (SHORT, LONG, " ".join([SHORT] * 4)):
        assert student_or_explainer(answer) <= 1
    assert STUDENT.scorer(PROMPT, SHORT).score == 1.0 and EXPLAINER.scorer(PROMPT, SHORT).violations == (
        TOO_SHORT,
    )
    assert EXPLAINER.scorer(PROMPT, LONG).score == 1.0 and STUDENT.scorer(PROMPT, LONG).score == 0.0
    off_topic = " ".join(["Bananas are yellow fruit that grow in warm places."] * 12)
    assert explainer_score(PROMPT, off_topic).violations == (OFF_TOPIC,)
    at_limit = " ".join(["phases"] * MIN_DETAILED_WORDS)
    assert explainer_score(PROMPT, at_limit).score == 1.0
    assert explainer_score(PROMPT, " ".join(["phases"] * (MIN_DETAILED_WORDS - 1))).violations == (TOO_SHORT,)


def student_or_explainer(answer: str) -> int:
    return int(STUDENT.scorer(PROMPT, answer).score + EXPLAINER.scorer(PROMPT, answer).score)


def test_the_explainer_asks_for_more_and_the_rule_judges_read_it_as_a_correction_and_a_hint() -> None:
    for seed in range(20):
        reaction = react(EXPLAINER, PROMPT, SHORT, random.Random(seed), restate_length=True)
        assert not reaction.satisfied and reaction.violations == [TOO_SHORT]
        assert str(MIN_DETAILED_WORDS) in reaction.text and "40 words" not in reaction.text
        assert user_reply_judge([], SHORT, reaction.text)[0] == -1
        vote, hint, _ = user_hint_extractor([], SHORT, reaction.text)
        assert vote == 1 and hint is not None and str(MIN_DETAILED_WORDS) in hint
    satisfied = react(EXPLAINER, PROMPT, LONG, random.Random(0))
    assert satisfied.satisfied and user_reply_judge([], LONG, satisfied.text)[0] == 1


def test_two_tenants_start_a_trainer_each_without_the_gate_and_run_one_method(tmp_path: Path) -> None:
    settings = DemoSettings(two_tenants=True, data_dir=tmp_path).effective()
    assert settings.methods == ("combined",)
    assert DemoSettings(two_tenants=True, methods=("binary",)).effective().methods == ("binary",)
    up = tenant_up_settings(settings, "demo-x-tenants")
    assert up.tenants == tuple(name for name, _ in TENANT_SCENARIOS) and up.tenant_adapters and not up.gate
    launches = stack_launches(up, {})
    assert {"train-alice", "train-bob"} <= set(launches) and not any(n.startswith("gate") for n in launches)
    assert launches["train-alice"].env["ORL_RUN_ID"] == "demo-x-tenants.alice"
    assert EXPLAINER.max_tokens is not None and EXPLAINER.max_tokens > settings.max_tokens


def evaluation(scores: list[float]) -> Evaluation:
    return Evaluation([[s] for s in scores], style=1.0, relevance=1.0, words=30.0, examples=[])


def test_the_report_says_per_tenant_whether_she_rose_and_never_fell(tmp_path: Path) -> None:
    rising = {0: evaluation([0.0] * 8 + [1.0] * 2), 4: evaluation([0.0] * 4 + [1.0] * 6)}
    dipping = {0: evaluation([0.0] * 5 + [1.0] * 5), 4: evaluation([0.0] * 6 + [1.0] * 4)}
    curves = {"alice (student)": rising, "bob (explainer)": dipping}
    cross = {
        "alice (student)": {"bob (explainer)": evaluation([0.0] * 10)},
        "bob (explainer)": {"alice (student)": evaluation([0.0] * 10)},
    }
    files = write_tenant_report(tmp_path, curves, cross, {})
    results = json.loads(files.results.read_text())
    assert results["targets"] == {
        "alice (student)": {"rose_at_least_0.3": True, "never_fell_more_than_0.05": True},
        "bob (explainer)": {"rose_at_least_0.3": False, "never_fell_more_than_0.05": False},
    }
    assert results["tenants"]["alice (student)"]["4"]["score"] == 0.6
    assert results["cross"]["bob (explainer)"]["alice (student)"]["score"] == 0.0
    table = files.table.read_text()
    assert "- met: alice (student) rose at least 0.3" in table
    assert "- NOT met: bob (explainer) never fell more than 0.05" in table
    assert files.chart.stat().st_size > 0
    summary = {0: {"score": 0.2}, 8: {"score": 0.5}, 16: {"score": 0.16}}
    assert check_tenant_targets({"t": summary}) == {
        "t": {"rose_at_least_0.3": False, "never_fell_more_than_0.05": True}
    }
