"""The trainer's control plane: which version it returns to after a gate hold or a rollback, when it waits, when it stops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orl.rules.gate_decisions import GateDecisions
from orl.trainer.control import TrainerControl, ahead_of_gate, restore_for, stopped_by_rollback
from orl.trainer.rollback import RollbackWatch

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


@dataclass(frozen=True)
class Judged:
    policy_version: int
    reward: float | None
    promoted: bool = False


def control(holds: GateDecisions, **overrides: Any) -> TrainerControl:
    options: dict[str, Any] = {
        "restores_for_gate": True,
        "follow_promoted": True,
        "max_staleness": 2,
        "stop_after_rollback": False,
    }
    options.update(overrides)
    return TrainerControl(holds, RollbackWatch(window=4, margin=0.25), **options)


def test_a_held_newest_version_is_restored_from_the_promoted_one_and_noted_in_the_manifest() -> None:
    holds = GateDecisions("run-1")
    for event in (gated(1, "promoted"), gated(2, "held")):
        holds.read(event)
    restore = control(holds).gate_restore(2)
    assert restore is not None and restore.by_gate and restore.gate_reason == "held v2"
    assert (restore.replaced.from_version, restore.replaced.to_version) == (2, 1)
    assert restore.manifest_note == {"held_by_gate": 2, "restored": 1}
    assert control(holds).gate_restore(1) is None  # the newest version is the promoted one
    # a backend that cannot reload weights (megatron) is refused the gate by its settings, and never restores
    assert control(holds, restores_for_gate=False).gate_restore(2) is None


def test_the_trainer_waits_for_a_slow_gate_only_when_it_follows_the_promoted_version() -> None:
    holds = GateDecisions("run-1")
    holds.read(gated(3, "promoted"))
    assert [control(holds).waits_for_gate(v) for v in (4, 5)] == [False, True]
    assert not control(holds, follow_promoted=False).waits_for_gate(5)


def test_a_version_judged_worse_than_its_parent_is_rolled_back_once() -> None:
    trainer = control(GateDecisions("run-1"))
    trainer.published(1, 0)
    trainer.published(2, 1)
    assert trainer.judged([Judged(1, 1.0)] * 4 + [Judged(2, -1.0)] * 3) is None  # v2's window not full yet
    assert trainer.judged([Judged(2, 0.0), Judged(2, 1.0, promoted=True)]) is None  # neither says anything
    restore = trainer.judged([Judged(2, -1.0)])
    assert restore is not None and not restore.by_gate
    assert (restore.replaced.from_version, restore.replaced.to_version) == (2, 1)
    assert (restore.replaced.from_approval, restore.replaced.to_approval) == (0.0, 1.0)
    assert restore.manifest_note == {"rollback_of": 2, "restored": 1}
    trainer.restored(restore, 3)
    assert trainer.judged([Judged(2, -1.0)]) is None  # v2 is never compared again
    trainer.published(4, 2)  # nor is a version trained from it
    assert trainer.judged([Judged(4, -1.0)] * 4) is None


def test_a_run_stopped_at_a_rollback_stays_stopped_across_a_restart_only_with_rollback_action_stop() -> None:
    rolled_back = {"rollback_of": 2, "restored": 1}
    assert stopped_by_rollback(rolled_back, "stop")
    assert not stopped_by_rollback(rolled_back, "restore")
    assert not stopped_by_rollback({"held_by_gate": 2, "restored": 1}, "stop")  # a gate hold is no rollback
    assert not stopped_by_rollback(None, "stop")  # no checkpoint yet
