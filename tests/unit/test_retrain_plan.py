"""`orl forget --retrain`'s plan (orl.forget.retrain_plan): which new run replaces each run trained
on forgotten data, and on whose sessions it trains."""

from __future__ import annotations

from pathlib import Path

import pytest

from orl.forget import Retraining, retrain_plan
from orl.history import ReplaySettings, train_replayed


def test_each_run_is_replaced_the_way_it_was_trained() -> None:
    plan = retrain_plan(
        runs={"live", "live.alice", "live.bob", "exp"},
        namespace="live",
        target="live-retrain-1",
        named_tenants={"alice", "bob", "carol"},
        # the shared run trained alice's and unnamed keys' sessions; bob and carol are private
        trained={"live": {"alice", None}, "live.alice": {"alice"}, "live.bob": {"bob"}, "exp": {"carol"}},
        tenants_left={"alice"},
    )
    assert plan == [
        Retraining("exp", "live-retrain-1-exp", private_tenants=("alice", "bob")),
        Retraining("live", "live-retrain-1", private_tenants=("bob", "carol")),
        Retraining("live.alice", "live-retrain-1.alice", tenant="alice"),
        Retraining("live.bob", "live-retrain-1.bob", tenant="bob", nothing_left=True),
    ]


def test_without_named_tenants_the_shared_run_trains_every_session_left() -> None:
    plan = retrain_plan({"live"}, "live", "t", set(), {"live": {None}}, set())
    assert plan == [Retraining("live", "t")]
    assert retrain_plan(set(), "live", "t", {"alice"}, {}, {"alice"}) == []


def test_a_run_only_named_like_a_tenant_is_a_tenant_run_only_for_a_named_tenant() -> None:
    [run] = retrain_plan({"live.v2"}, "live", "t", {"alice"}, {"live.v2": {"alice"}}, {"alice"})
    assert run == Retraining("live.v2", "t-live.v2")


def test_a_retrained_runs_training_is_shown_with_its_tenant_filter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = ReplaySettings(data_dir=tmp_path, target_namespace="t", train_steps=0)
    assert train_replayed(settings, "t.alice", tenant="alice") == 0
    assert train_replayed(settings, "t", private_tenants=("bob", "carol")) == 0
    shown = capsys.readouterr().out.splitlines()
    assert "--run-id t.alice" in shown[0] and "--tenant alice" in shown[0]
    assert "--private-tenants bob,carol" in shown[1] and "--tenant " not in shown[1]
