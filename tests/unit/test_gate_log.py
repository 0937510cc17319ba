"""What `orl gate` reads from the log (GateLog): the candidate to decide and the held-out prompts."""

from __future__ import annotations

import json
from typing import Any

from orl.gate.runner import GateLog, answer_seed
from orl.schemas.ids import held_out_session

from orl.gate_scenarios import scenario_prompts, scenario_user
from tests.unit.event_examples import example_event


def request(session_id: str, turn_id: str, text: str, kind: str = "main") -> dict[str, Any]:
    event = example_event("RequestReceived")
    event["envelope"].update(session_id=session_id, turn_id=turn_id)
    event.update(turn_kind=kind, messages_json=json.dumps([{"role": "user", "content": text}]))
    return event


def published(version: int, run_id: str = "run-1") -> dict[str, Any]:
    event = example_event("CheckpointPublished")
    event.update(run_id=run_id, version=version)
    return event


def gated(version: int, decision: str) -> dict[str, Any]:
    event = example_event("PolicyGated")
    event.update(run_id="run-1", version=version, decision=decision)
    return event


def test_the_candidate_is_the_newest_undecided_version_above_the_promoted_one() -> None:
    state = GateLog("run-1", holdout_share=0.5, keep=4)
    assert state.candidate() is None  # nothing published
    for event in (published(1), published(2), published(7, run_id="other")):
        state.read(event)
    assert state.candidate() == 2  # v1 is passed over for the newest
    state.read(gated(2, "held"))
    assert (state.candidate(), state.promoted) == (None, 0)
    state.read(published(3))
    assert state.candidate() == 3
    state.read(gated(3, "promoted"))
    assert (state.candidate(), state.promoted) == (None, 3)


def test_only_main_turns_of_held_out_sessions_are_kept_the_newest_first_to_go() -> None:
    held = [f"s{i}" for i in range(100) if held_out_session(f"s{i}", 0.5)]
    kept = [f"s{i}" for i in range(100) if not held_out_session(f"s{i}", 0.5)]
    state = GateLog("run-1", holdout_share=0.5, keep=2)
    state.read(request(kept[0], "k-0", "trained on"))
    state.read(request(held[0], "h-side", "a side turn", kind="side"))
    for index in range(3):
        state.read(request(held[index], f"h-{index}", f"question {index}"))
    assert [(p.prompt_id, p.text) for p in state.held_out] == [("h-1", "question 1"), ("h-2", "question 2")]


def test_a_scenario_gives_its_gate_prompts_and_a_user_who_replies_to_each_answer() -> None:
    prompts = scenario_prompts("student", 3)
    assert [p.prompt_id for p in prompts] == ["student:0", "student:1", "student:2"]
    reply = scenario_user("student")
    short = reply(prompts[0], "Multiply the radius by itself.", 0)
    assert short["role"] == "user" and short == reply(prompts[0], "Multiply the radius by itself.", 0)
    assert reply(prompts[0], "**Step 1:** " + "word " * 80, 0)["content"] != short["content"]
    assert answer_seed("p", 0, 0) == answer_seed("p", 0, 0) != answer_seed("p", 0, 1)


def test_a_tenant_run_s_gate_keeps_only_her_held_out_sessions() -> None:
    held = [f"s{i}" for i in range(100) if held_out_session(f"s{i}", 0.5)]
    alices = set(held[::2])  # as the key store would name them
    state = GateLog("run-1.alice", holdout_share=0.5, keep=10, keeps_session=alices.__contains__)
    for index, session in enumerate(held[:6]):
        state.read(request(session, f"h-{index}", f"question {index}"))
    assert [p.prompt_id for p in state.held_out] == ["h-0", "h-2", "h-4"]
