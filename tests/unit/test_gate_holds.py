"""GateDecisions and restore_for: which promoted version the trainer returns to when the gate held its newest one."""

from __future__ import annotations

from typing import Any

from orl.rules.gate_decisions import GateDecisions
from orl.trainer.gate_holds import ahead_of_gate, restore_for

from tests.unit.event_examples import example_event


def gated(version: int, decision: str, run_id: str = "run-1") -> dict[str, Any]:
    event = example_event("PolicyGated")
    event.update(run_id=run_id, version=version, decision=decision, reason=f"{decision} v{version}")
    return event


def test_a_held_newest_version_goes_back_to_the_newest_promoted_one() -> None:
    holds = GateDecisions("run-1")
    assert restore_for(holds, 3) is None  # no gate: nothing is held
    for event in (
        gated(1, "promoted"),
        gated(2, "promoted"),
        gated(3, "held"),
        gated(4, "held", run_id="other"),
    ):
        holds.read(event)
    holds.read(example_event("CheckpointPublished"))  # the topic's other events are not decisions
    assert holds.promoted == 2
    assert restore_for(holds, 3) == 2
    assert restore_for(holds, 4) is None  # another run's hold, or a version not decided yet
    assert holds.held == {3: "held v3"}


def test_a_version_promoted_after_all_is_no_longer_held() -> None:
    holds = GateDecisions("run-1")
    holds.read(gated(5, "held"))
    assert restore_for(holds, 5) == 0  # nothing promoted yet: the base model
    holds.read(gated(5, "promoted"))
    assert restore_for(holds, 5) is None and holds.promoted == 5


def test_the_trainer_runs_at_most_max_staleness_versions_ahead_of_the_promoted_one() -> None:
    # the servers serve v3: its samples are trained up to v5 (bound 2), so v5 waits for the gate
    assert [ahead_of_gate(version, 3, max_staleness=2) for version in (3, 4, 5, 6)] == [
        False,
        False,
        True,
        True,
    ]
    assert [ahead_of_gate(version, 3, max_staleness=0) for version in (3, 4)] == [
        False,
        True,
    ]  # one at a time
    assert not ahead_of_gate(50, 3, max_staleness=-1)  # no staleness bound: no wait
