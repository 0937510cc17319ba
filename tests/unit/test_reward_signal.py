"""The stack's default reward signal: rules that are real without a capable model, unless a judge endpoint is given,
and parse failures of an LLM judge made visible."""

from __future__ import annotations

from pathlib import Path

from orl.pipeline.effects.judging import ParseWatch
from orl.pipeline.effects.rule_judges import load_hint_extractor, load_rule_judge, reaction_judge

from orl.samples import VoteSummary, vote_summary
from orl.up import UpSettings, component_env, reward_signal


def test_without_a_judge_endpoint_the_stack_judges_by_rules_and_says_so() -> None:
    signal = reward_signal(UpSettings())
    assert (signal.judge, signal.hint_judge) == ("reaction", "user_hint")
    assert "rule judge 'reaction'" in signal.description and "no --judge-url given" in signal.description


def test_a_judge_endpoint_makes_it_an_llm_judge_there() -> None:
    signal = reward_signal(UpSettings(judge_url="http://judge:8000/v1"))
    assert (signal.judge, signal.hint_judge) == ("llm", "llm")
    assert "LLM judge on the judge endpoint http://judge:8000/v1" in signal.description


def test_an_llm_judge_on_the_served_model_is_called_out() -> None:
    signal = reward_signal(UpSettings(judge="llm", hint_judge="user_hint"))
    assert signal.judge == "llm" and "the served model judges itself" in signal.description


def test_the_pipeline_is_told_the_resolved_judges_and_the_endpoint(tmp_path: Path) -> None:
    env = component_env(UpSettings(data_dir=tmp_path, judge_url="http://judge/v1", judge_model="big"))
    assert (env["ORL_JUDGE"], env["ORL_HINT_JUDGE"], env["ORL_JUDGE_URL"], env["ORL_JUDGE_MODEL"]) == (
        "llm", "llm", "http://judge/v1", "big",
    )  # fmt: skip
    assert component_env(UpSettings(data_dir=tmp_path))["ORL_JUDGE"] == "reaction"


def test_the_reaction_judge_takes_an_outcome_first_then_the_users_reply() -> None:
    thumbs_down = {"content": "thanks!", "outcome": {"kind": "thumbs", "thumbs": -1}}
    assert reaction_judge([], "", thumbs_down)[0] == -1  # the explicit feedback wins over the words
    assert reaction_judge([], "", {"content": "Thanks, exactly what I needed.", "outcome": None})[0] == 1
    assert reaction_judge([], "", {"content": "Try again, that is wrong.", "outcome": None})[0] == -1
    assert reaction_judge([], "", {"content": "ok", "outcome": None})[0] == 0
    assert load_rule_judge("reaction") is reaction_judge
    assert (
        load_hint_extractor("user_hint")([], "", {"content": "Too long. Please keep it short."})[1]
        == "Keep it short."
    )


def test_the_parse_watch_warns_once_when_most_recent_votes_fail() -> None:
    watch = ParseWatch(window=4, threshold=0.5)
    results = [watch.record("prm", error) for error in (None, None, None, "no boxed", "no boxed")]
    assert results[:4] == [None] * 4  # 1 of the last 4 failed
    assert results[4] is not None and "2 of its last 4 votes failed to parse" in results[4]
    assert watch.record("prm", "no boxed") is None  # said once
    for _ in range(3):
        watch.record("prm", None)  # back under the threshold
    assert [watch.record("prm", "x") for _ in range(2)][-1] is not None  # and over it again: said again
    assert (watch.votes, watch.unparsed) == (11, 5)


def test_orl_samples_tells_how_the_votes_went() -> None:
    votes = [{"judge_kind": "llm", "parse_error": e} for e in ("no boxed", "no boxed", None)]
    votes.append({"judge_kind": "rule", "parse_error": None})
    summary = vote_summary(votes)
    assert summary == VoteSummary(rule=1, llm=3, llm_unparsed=2)
    assert "2 of them failed to parse (67%)" in summary.line() and "--judge reaction" in summary.line()
    assert VoteSummary().line() == "judge votes: none yet"
