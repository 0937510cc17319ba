"""The trainer's control plane: when to go back to earlier weights, when to wait, when to stop (pure logic).

The training loop (trainer/loop.py) asks `TrainerControl` on every turn and carries out its answer.
Three things decide it:
- The promotion gate. `orl gate` holds or promotes each version (`orl.rules.gate_decisions`,
  fed by trainer/gate_holds.py). Servers behind the gate keep serving the promoted version, so when
  the trainer's own newest version is held it republishes the promoted version's weights as its next
  version and trains on from there (`gate_restore`). Nor does it run ahead of a slow gate
  (`waits_for_gate`): it waits while its samples' version would soon be too old to train on.
- Automatic rollback. Every judged sample counts for the version that answered (`RollbackWatch`);
  a version judged worse than its parent by more than the margin is rolled back: its parent's weights
  are republished as the next version (`judged`).
- `--rollback-action stop`: after a rollback the run trains no more, also across a restart.
Reads and writes nothing: the loop does the I/O (restore, publish, events).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from orl.rules.gate_decisions import GateDecisions
from orl.trainer.rollback import Rollback, RollbackWatch


class JudgedSample(Protocol):
    """What the control reads of a trained sample (`orl.trainer.batching.TrainingSample` has it)."""

    @property
    def policy_version(self) -> int: ...
    @property
    def reward(self) -> float | None: ...
    @property
    def promoted(self) -> bool: ...


def restore_for(decisions: GateDecisions, version: int) -> int | None:
    """The promoted version to go back to if `version` (the trainer's newest) was held, else None."""
    return decisions.promoted if version in decisions.held and decisions.promoted < version else None


def ahead_of_gate(version: int, promoted: int, max_staleness: int) -> bool:
    """Whether a trainer at `version` must wait for the gate before its next step: servers behind the
    gate serve `promoted`, and a sample of it is trained only up to `max_staleness` versions later, so
    the trainer publishes at most max(1, max_staleness) versions beyond it (a negative bound: no wait)."""
    return max_staleness >= 0 and version - promoted >= max(1, max_staleness)


def stopped_by_rollback(manifest_metrics: Mapping[str, Any] | None, rollback_action: str) -> bool:
    """Whether the run stopped at a rollback before this start: its newest version restored earlier
    weights after a rollback, and `--rollback-action` is stop."""
    return rollback_action == "stop" and manifest_metrics is not None and "rollback_of" in manifest_metrics


@dataclass(frozen=True)
class Restore:
    """Republish `replaced.to_version`'s weights (0: the base model) as the next version, train on from them."""

    replaced: Rollback  # from_version: held by the gate or judged worse; to_version: restored
    by_gate: bool  # the gate held from_version (else: a rollback)
    gate_reason: str = ""  # the gate's words on the hold

    @property
    def manifest_note(self) -> dict[str, int]:
        """Why the new version exists, in its manifest's metrics."""
        key = "held_by_gate" if self.by_gate else "rollback_of"
        return {key: self.replaced.from_version, "restored": self.replaced.to_version}


@dataclass
class TrainerControl:
    """One trainer's control state: the gate's decisions, the rollback watch, and the policies that act on them."""

    holds: GateDecisions
    watch: RollbackWatch
    restores_for_gate: bool  # the torch backend goes back after a hold (settings refuse the gate otherwise)
    follow_promoted: bool  # --follow-promoted: do not run ahead of the gate
    max_staleness: int
    stop_after_rollback: bool  # --rollback-action stop

    def gate_restore(self, version: int) -> Restore | None:
        """Go back to the promoted version if the gate held the trainer's newest `version`."""
        promoted = restore_for(self.holds, version) if self.restores_for_gate else None
        if promoted is None:
            return None
        return Restore(
            Rollback(version, promoted, 0.0, 0.0), by_gate=True, gate_reason=self.holds.held[version]
        )

    def waits_for_gate(self, version: int) -> bool:
        return self.follow_promoted and ahead_of_gate(version, self.holds.promoted, self.max_staleness)

    def judged(self, samples: Iterable[JudgedSample]) -> Restore | None:
        """Count a batch's judged samples for the versions that answered them; a rollback if one is due."""
        for sample in samples:
            self.watch.judged(sample.policy_version, sample.reward, sample.promoted)
        rollback = self.watch.check()
        return None if rollback is None else Restore(rollback, by_gate=False)

    def restored(self, restore: Restore, new_version: int) -> None:
        """`restore` was carried out as `new_version`."""
        self.watch.rolled_back(restore.replaced, new_version)

    def published(self, version: int, parent_version: int) -> None:
        self.watch.published(version, parent_version)
