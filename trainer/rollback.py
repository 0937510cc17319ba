"""Automatic rollback: is a trained version judged worse than the one it was trained from? (pure logic)

The trainer sees every judged turn of every version: a SampleReady carries the policy version that
answered and the judge's reward. `RollbackWatch` keeps, per version, the last `window` decisive rewards
(above or below 0; neutral and promoted samples say nothing about the version) as approvals (1 or 0).
Once a version and its parent both have a full window, and the version's approval is below the
parent's by more than `margin`, `check` returns the rollback: the trainer then republishes the
parent's weights as a new version (servers follow it like any checkpoint, so no request is refused)
and trains on from there (trainer/loop.py, trainer/control.py). The rolled-back version and every version trained from it
are never compared again. Reads and writes nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rollback:
    from_version: int  # judged worse
    to_version: int  # its parent, restored
    from_approval: float
    to_approval: float


@dataclass
class RollbackWatch:
    window: int  # decisive judged turns per version; 0 turns the watch off
    margin: float
    parents: dict[int, int] = field(default_factory=dict)  # version -> the version it was trained from
    _approvals: dict[int, deque[float]] = field(default_factory=dict)
    _rolled_back: set[int] = field(default_factory=set)  # and their descendants

    def published(self, version: int, parent: int) -> None:
        """A new version of the run; one trained from a rolled-back version is rolled back with it."""
        self.parents[version] = parent
        if parent in self._rolled_back:
            self._rolled_back.add(version)

    def judged(self, version: int, reward: float | None, promoted: bool = False) -> None:
        """One judged turn answered by `version`."""
        if reward is None or reward == 0 or promoted or self.window <= 0:
            return
        approvals = self._approvals.setdefault(version, deque(maxlen=self.window))
        approvals.append(1.0 if reward > 0 else 0.0)

    def approval(self, version: int) -> float | None:
        """The version's approval over its last full window; None until the window is full."""
        approvals = self._approvals.get(version)
        if approvals is None or len(approvals) < self.window:
            return None
        return sum(approvals) / len(approvals)

    def check(self) -> Rollback | None:
        """The newest version judged worse than its parent by more than `margin`, if any."""
        if self.window <= 0:
            return None
        for version in sorted(self.parents, reverse=True):
            if version in self._rolled_back:
                continue
            parent = self.parents[version]
            mine, theirs = self.approval(version), self.approval(parent)
            if mine is not None and theirs is not None and mine < theirs - self.margin:
                return Rollback(version, parent, mine, theirs)
        return None

    def rolled_back(self, rollback: Rollback, new_version: int) -> None:
        """Record that `rollback` was carried out as `new_version` (the parent's weights, republished)."""
        self._rolled_back.update(v for v in self.parents if self._descends_from(v, rollback.from_version))
        self.parents[new_version] = rollback.to_version
        # the restored weights are the parent's: judged turns of new_version count for it, not for the parent
        self._approvals.pop(new_version, None)

    def _descends_from(self, version: int, ancestor: int) -> bool:
        seen = set()
        while version not in seen:
            if version == ancestor:
                return True
            seen.add(version)
            if version not in self.parents:
                return False
            version = self.parents[version]
        return False
