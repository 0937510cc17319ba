"""`orl up` hands the top-K distillation settings to its children: ORL_OPD_TOPK (pipeline), ORL_OPD_LOSS (trainer)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from orl.pipeline.runtime.settings import PipelineSettings
from orl.schemas.errors import ConfigError
from orl.trainer.megatron_backend.settings import MegatronSettings, check_megatron_settings
from orl.trainer.settings import TrainSettings, check_settings

from orl.cli import build_parser
from orl.settings_binding import build_settings
from orl.up import UpSettings, component_env


def test_the_children_get_the_opd_settings_and_read_them_back(tmp_path: Path) -> None:
    env = component_env(UpSettings(data_dir=tmp_path, opd_topk=50, opd_loss="topk"))
    assert (env["ORL_OPD_TOPK"], env["ORL_OPD_LOSS"]) == ("50", "topk")
    # the variables are the ones the pipeline's and the trainer's settings are bound to
    assert PipelineSettings.__dataclass_fields__["opd_topk"].metadata["env"] == "ORL_OPD_TOPK"
    assert TrainSettings.__dataclass_fields__["opd_loss"].metadata["env"] == "ORL_OPD_LOSS"


def test_the_defaults_are_token_level(tmp_path: Path) -> None:
    env = component_env(UpSettings(data_dir=tmp_path))
    assert (env["ORL_OPD_TOPK"], env["ORL_OPD_LOSS"]) == ("0", "token")


@pytest.mark.parametrize(
    ("fields", "flag"),
    [
        ({"opd_loss": "topk"}, "--opd-topk K"),
        ({"opd_topk": 101}, "--opd-topk must"),
    ],
)
def test_unusable_combinations_are_refused(tmp_path: Path, fields: dict, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        component_env(UpSettings(data_dir=tmp_path, **fields))


def test_the_trainer_refuses_topk_on_megatron() -> None:
    with pytest.raises(ConfigError, match="--opd-loss topk is not supported with --backend megatron"):
        check_settings(TrainSettings(backend="megatron", kind="full", opd_loss="topk"))
    with pytest.raises(ConfigError, match="--opd-advantage-clip must"):
        check_settings(TrainSettings(opd_advantage_clip=-1.0))
    with pytest.raises(ConfigError, match="--opd-anchor must be in"):
        check_settings(TrainSettings(opd_anchor=1.5))
    check_settings(TrainSettings(backend="megatron", kind="full", opd_anchor=0.5))  # both backends anchor
    check_settings(TrainSettings(opd_anchor=0.0))
    check_settings(TrainSettings(opd_loss="topk"))


def test_the_megatron_worker_refuses_topk_from_the_same_check(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    usable = MegatronSettings(model_dir=model_dir, samples_file=samples)
    check_megatron_settings(usable)
    with pytest.raises(ConfigError, match="--opd-loss topk is not supported with --backend megatron"):
        check_megatron_settings(dataclasses.replace(usable, opd_loss="topk"))
    with pytest.raises(ConfigError, match="--opd-anchor must be in"):
        check_megatron_settings(dataclasses.replace(usable, opd_anchor=2.0))


def test_orl_up_refuses_an_opd_loss_it_does_not_have_before_it_starts_anything() -> None:
    args = build_parser(flags_of=["up"]).parse_args(["up", "--opd-loss", "kl"])
    with pytest.raises(ConfigError, match=re.escape("--opd-loss: 'kl' is not one of token | topk")):
        build_settings(UpSettings, args, {})
