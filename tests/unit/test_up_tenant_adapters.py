"""`orl up --tenant-adapters`: one trainer per named tenant on its own run, the shared trainer without
the tenants who did not opt in, and the server told to answer each tenant with its own run."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from orl.schemas.errors import ConfigError
from orl.serving.settings import ServeSettings
from orl.trainer.settings import TrainSettings, check_settings

from orl.settings_binding import build_settings
from orl.up import UpSettings, component_env, stack_launches


def test_each_tenant_trains_its_own_run_and_only_opted_in_tenants_train_the_shared_one(
    tmp_path: Path,
) -> None:
    settings = UpSettings(
        data_dir=tmp_path,
        tenants=("alice", "bob"),
        tenant_adapters=True,
        shared_tenants=("alice",),
        gate=False,
        run_id="home",
        cores=2,
    )
    env = component_env(settings)
    launches = stack_launches(settings, env)
    assert sorted(name for name in launches if not name.startswith("pipeline")) == [
        "serve",
        "train",
        "train-alice",
        "train-bob",
    ]
    trainers = {
        name: build_settings(TrainSettings, argparse.Namespace(), launch.env)
        for name, launch in launches.items()
        if launch.command == "train"
    }
    for trainer in trainers.values():
        check_settings(trainer)  # each one valid as its process will read it
    assert (trainers["train"].run_id, trainers["train"].tenant, trainers["train"].private_tenants) == (
        "home",
        "",
        ("bob",),
    )
    assert (trainers["train-alice"].run_id, trainers["train-alice"].tenant) == ("home.alice", "alice")
    assert (trainers["train-bob"].run_id, trainers["train-bob"].tenant) == ("home.bob", "bob")
    served = build_settings(ServeSettings, argparse.Namespace(), launches["serve"].env)
    assert served.tenant_adapters and sorted(served.named_tenants()) == ["alice", "bob"]
    assert served.run_id == "home"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tenants": ()}, "name them with --tenants"),
        ({"shared_tenants": ("carol",)}, "--shared-tenants carol: not in --tenants"),
        (
            {"tenant_adapters": False, "shared_tenants": ("alice",)},
            "--shared-tenants is for --tenant-adapters",
        ),
    ],
)
def test_tenant_adapters_refuse_what_they_cannot_do(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    values: dict[str, object] = {"tenants": ("alice",), "tenant_adapters": True, "gate": False, **overrides}
    with pytest.raises(ConfigError, match=message):
        component_env(UpSettings(data_dir=tmp_path, **values))  # type: ignore[arg-type]


def test_a_tenant_trainer_needs_its_run_named_after_it_and_the_key_store() -> None:
    with pytest.raises(ConfigError, match=r"named <run>\.alice"):
        check_settings(TrainSettings(run_id="home", tenant="alice"))
    with pytest.raises(ConfigError, match="need the key store"):
        check_settings(TrainSettings(run_id="home.alice", tenant="alice", key_store="off"))
    with pytest.raises(ConfigError, match="for the shared run"):
        check_settings(TrainSettings(run_id="home.alice", tenant="alice", private_tenants=("bob",)))
