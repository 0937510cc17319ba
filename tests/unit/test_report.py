"""`orl report`'s figures per policy version, from events shaped as on the log."""

from __future__ import annotations

import json
from typing import Any

import pytest
from orl.connectors.metrics import Metrics
from orl.gate.scoring import student_score

from orl.report import export_metrics, render_markdown, version_figures


def turn(
    turn_id: str, session: str, version: int, question: str, answer: str, kind: str = "main"
) -> list[dict]:
    envelope = {"turn_id": turn_id, "session_id": session, "event_type": "RequestReceived"}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
    request = {
        "envelope": envelope,
        "request_id": f"r-{turn_id}",
        "turn_kind": kind,
        "messages_json": json.dumps(messages),
    }
    response = {
        "envelope": {**envelope, "event_type": "ResponseGenerated"},
        "request_id": f"r-{turn_id}",
        "policy_version": version,
        "response_text": answer,
    }
    return [request, response]


def reward(turn_id: str, value: float, promoted: bool = False) -> dict:
    return {
        "envelope": {"turn_id": turn_id, "event_type": "RewardDecided"},
        "reward": value,
        "promoted": promoted,
    }


def events() -> dict[str, list[dict[str, Any]]]:
    turns = [
        turn("t1", "s1", 0, "How do photosynthesis plants work?", "Plants use photosynthesis to make sugar."),
        turn("t2", "s1", 0, "Thanks", "You're"),  # the session's closing turn: judged 0
        turn("t3", "s2", 0, "What is a noun?", "I like trains."),
        turn("t4", "s3", 1, "What is a noun?", "A noun names a thing."),
        turn("t5", "s3", 1, "And a verb?", "A verb is an action word, like run."),
        turn("e1", "x", 1, "What is a noun?", "A noun names a person or thing.", kind="side"),
        turn("e2", "x", 1, "What is a verb?", "**Verb**: an action.", kind="side"),
        turn("e3", "x", 1, "What is an adverb?", "I have nothing to add.", kind="side"),
    ]
    feedback = {
        "envelope": {"turn_id": "t4", "event_type": "NextStateObserved"},
        "outcome": {"kind": "thumbs", "thumbs": 1, "reward": None},
    }
    return {
        "requests": [pair[0] for pair in turns],
        "responses": [pair[1] for pair in turns],
        "rewards": [reward("t1", 1), reward("t2", 0), reward("t3", -1), reward("t4", 1), reward("t5", -1, promoted=True)],
        "next_states": [feedback],
        "train_steps": [{"policy_version": 1, "kl": 0.05}],
        "checkpoints": [
            {"envelope": {"event_type": "CheckpointPublished"}, "version": 1},
            {
                "envelope": {"event_type": "PolicyRolledBack"}, "from_version": 1, "to_version": 0,
                "new_version": 3, "window": 4, "from_approval": 0.25, "to_approval": 0.75,
            },
            {
                "envelope": {"event_type": "PolicyGated"}, "version": 1, "baseline_version": 0,
                "decision": "promoted", "reason": "approval 0.75 vs 0.50; relevance 1.00 vs 0.50: within the margin 0.10 or better",
            },
        ],
        "policy_activations": [
            {"envelope": {"event_type": "PolicyActivated"}, "version": 1, "server_id": "serve-0"},
            {"envelope": {"event_type": "PolicyRejected"}, "version": 2, "server_id": "trainer", "reason": "sha256 mismatch"},
        ],
    }  # fmt: skip


def test_each_version_gets_its_approval_relevance_feedback_kl_and_refusals() -> None:
    v0, v1, v2, v3 = version_figures(events())
    assert v3.version == 3 and v3.main_turns == 0
    assert (v0.version, v0.main_turns, v0.judged_turns, v0.neutral_turns) == (0, 3, 2, 1)
    assert v0.approval is not None and v0.approval.mean == pytest.approx(0.5)  # one session +1, one -1
    assert v0.relevance == pytest.approx(0.5)  # "I like trains." says nothing about nouns
    assert v0.kl is None and v0.satisfied is None and v0.activations == 0
    assert (v1.main_turns, v1.judged_turns) == (2, 1)  # the promoted turn is not a judgement
    assert v1.approval is not None and v1.approval.mean == 1.0 and v1.satisfied == 1.0
    assert (v1.kl, v1.activations, v1.held_out_score) == (0.05, 1, None)  # no scorer: side turns unscored
    assert (v2.main_turns, v2.refusals) == (0, ["trainer: sha256 mismatch"])
    assert v1.rolled_back == "to v0 as v3 (approval 0.25 vs 0.75 over 4 turns)" and v0.rolled_back is None
    assert v1.gate is not None and v1.gate.startswith("promoted against v0: approval 0.75 vs 0.50")
    assert v0.gate is None
    table = render_markdown("ns", [v0, v1, v2, v3], scenario="")
    assert "| promoted |" in table and "- v1 promoted against v0: approval 0.75" in table


def test_side_turns_are_scored_per_prompt_with_the_given_scorer() -> None:
    rows = version_figures(events(), scorer=student_score)
    v1 = rows[1]
    assert v1.held_out_samples == 3 and v1.held_out_score is not None
    assert v1.held_out_score.mean == pytest.approx(1 / 3)  # only the plain, short, on-topic answer
    assert v1.held_out_style == pytest.approx(2 / 3)  # the off-topic one is short and plain
    assert v1.held_out_relevance == pytest.approx(2 / 3)
    table = render_markdown("live", rows, "student")
    assert "held-out style" in table and "| 0.33 [0.00, 1.00] | 0.67 | 0.67 |" in table
    assert "| 1 | 2 | 1 | 1.00 [1.00, 1.00] | 0 | 1.00 (1) |" in table
    assert "- v2: trainer: sha256 mismatch" in table
    assert "- v1 rolled back to v0 as v3" in table


def test_the_figures_are_exported_as_gauges_per_version() -> None:
    metrics = Metrics()
    export_metrics(version_figures(events()), metrics)
    value = metrics.registry.get_sample_value
    assert value("orl_report_approval", {"version": "0", "bound": "mean"}) == pytest.approx(0.5)
    assert value("orl_report_judged_turns", {"version": "0"}) == 2.0
    assert value("orl_report_kl", {"version": "1"}) == 0.05
    assert value("orl_report_kl", {"version": "0"}) is None  # no step made v0: no figure, not a zero
    assert value("orl_report_promoted", {"version": "1"}) == 1.0
    assert value("orl_report_rolled_back", {"version": "1"}) == 1.0
    assert value("orl_report_refusals", {"version": "2"}) == 1.0
    export_metrics(version_figures(events()), metrics)  # a refresh sets the same gauges again
    assert value("orl_report_judged_turns", {"version": "0"}) == 2.0


def test_a_tenants_report_counts_only_its_own_sessions_main_turns() -> None:
    rows = version_figures(events(), scorer=student_score, sessions=frozenset({"s3"}))
    assert [row.version for row in rows] == [1, 2, 3]  # v0 served only s1 and s2, someone else's
    v1 = rows[0]
    assert (v1.main_turns, v1.judged_turns, v1.satisfied) == (2, 1, 1.0)
    assert v1.held_out_samples == 3  # the held-out evaluation belongs to the version, not to a tenant
    table = render_markdown("live", rows, "student", tenant="alice")
    assert table.startswith("# orl report: namespace live, tenant alice\n")
    assert "Main turns of tenant alice's sessions only." in table
