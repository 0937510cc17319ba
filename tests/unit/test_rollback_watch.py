"""The rollback watch: a version judged worse than its parent over full windows is rolled back, once."""

from __future__ import annotations

from orl.trainer.rollback import Rollback, RollbackWatch


def judged(watch: RollbackWatch, version: int, rewards: list[float]) -> None:
    for reward in rewards:
        watch.judged(version, reward)


def test_a_version_worse_than_its_parent_by_more_than_the_margin_is_rolled_back() -> None:
    watch = RollbackWatch(window=4, margin=0.25)
    watch.published(1, 0)
    judged(watch, 0, [1, 1, -1, 1])  # 0.75
    judged(watch, 1, [1, -1, -1])
    assert watch.check() is None  # v1's window is not full yet
    judged(watch, 1, [-1])  # v1: 0.25
    assert watch.check() == Rollback(from_version=1, to_version=0, from_approval=0.25, to_approval=0.75)


def test_within_the_margin_neutral_and_promoted_turns_change_nothing() -> None:
    watch = RollbackWatch(window=4, margin=0.25)
    watch.published(1, 0)
    judged(watch, 0, [1, 1, 1, -1])  # 0.75
    judged(watch, 1, [1, -1, 1, -1])  # 0.5: exactly the margin below, not more
    for neutral in (0.0, None):
        watch.judged(1, neutral)
    watch.judged(1, -1.0, promoted=True)
    assert watch.approval(1) == 0.5 and watch.check() is None


def test_a_rolled_back_version_and_its_descendants_are_not_compared_again() -> None:
    watch = RollbackWatch(window=2, margin=0.1)
    watch.published(1, 0)
    judged(watch, 0, [1, 1])
    judged(watch, 1, [-1, -1])
    watch.published(2, 1)  # trained from v1 before the rollback
    rollback = watch.check()
    assert rollback is not None and (rollback.from_version, rollback.to_version) == (1, 0)
    watch.rolled_back(rollback, new_version=3)  # v0's weights as v3
    judged(watch, 2, [-1, -1])
    watch.published(4, 2)  # a late descendant of the rolled-back line
    judged(watch, 4, [-1, -1])
    assert watch.check() is None
    judged(watch, 3, [-1, -1])  # the restored weights judged worse than v0 again: compared afresh
    assert watch.check() == Rollback(3, 0, 0.0, 1.0)


def test_window_zero_is_off() -> None:
    watch = RollbackWatch(window=0, margin=0.0)
    watch.published(1, 0)
    judged(watch, 0, [1] * 8)
    judged(watch, 1, [-1] * 8)
    assert watch.approval(1) is None and watch.check() is None
