"""`orl up` (the gate is on by default) starts the gate and tells the server and the trainer: follow promotions, hold out sessions."""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.gate.settings import GateSettings
from orl.schemas.errors import ConfigError
from orl.serving.settings import ServeSettings
from orl.trainer.settings import TrainSettings, check_settings

from orl.up import UpSettings, component_env, stack_launches


def test_the_gate_is_started_and_the_children_told(tmp_path: Path) -> None:
    settings = UpSettings(data_dir=tmp_path, holdout_share=0.2, cores=2)  # the gate is on by default
    env = component_env(settings)
    assert (env["ORL_FOLLOW_PROMOTED"], env["ORL_HOLDOUT_SHARE"]) == ("true", "0.2")
    launches = stack_launches(settings, env)
    assert launches["gate"].command == "gate"
    assert launches["gate"].env["ORL_HOLDOUT_SHARE"] == "0.2"  # the shared settings, its own secrets
    # the variables are the ones the server's, the trainer's and the gate's settings are bound to
    assert ServeSettings.__dataclass_fields__["follow_promoted"].metadata["env"] == "ORL_FOLLOW_PROMOTED"
    assert TrainSettings.__dataclass_fields__["follow_promoted"].metadata["env"] == "ORL_FOLLOW_PROMOTED"
    for settings_class in (TrainSettings, GateSettings):
        assert settings_class.__dataclass_fields__["holdout_share"].metadata["env"] == "ORL_HOLDOUT_SHARE"


def test_without_the_gate_every_version_is_served_and_every_session_trained(tmp_path: Path) -> None:
    settings = UpSettings(data_dir=tmp_path, gate=False, holdout_share=0.2, cores=2)  # --no-gate
    env = component_env(settings)
    assert (env["ORL_FOLLOW_PROMOTED"], env["ORL_HOLDOUT_SHARE"]) == ("false", "0.0")
    assert "gate" not in stack_launches(settings, env)


def test_the_gate_runs_beside_the_trainer_only(tmp_path: Path) -> None:
    """Servers started on their own (`--components serve`) follow promotions but start no gate: the run's
    one gate runs where its one trainer does."""
    settings = UpSettings(data_dir=tmp_path, components=("serve",), cores=2)
    env = component_env(settings)
    assert env["ORL_FOLLOW_PROMOTED"] == "true"
    assert list(stack_launches(settings, env)) == ["serve"]


def test_the_megatron_trainer_refuses_to_train_behind_the_gate() -> None:
    """After a hold the trainer goes back to the promoted weights, which megatron cannot reload yet."""
    with pytest.raises(ConfigError, match="--follow-promoted .* needs the torch backend"):
        check_settings(TrainSettings(backend="megatron", kind="full", follow_promoted=True))
    check_settings(TrainSettings(backend="megatron", kind="full"))
    check_settings(TrainSettings(follow_promoted=True))
