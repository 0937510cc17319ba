"""`orl train` and the megatron worker refuse the same unusable loss flags with the same message, and
a choice that is not one of its flag's choices when they read their command line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from orl.schemas.errors import ConfigError
from orl.trainer.megatron_backend.settings import MegatronSettings, check_megatron_settings
from orl.trainer.megatron_backend.worker import parse_settings
from orl.trainer.settings import TrainSettings, check_settings

from orl.cli import build_parser
from orl.settings_binding import build_settings


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"beta_kl": -0.1}, "--beta-kl must be >= 0"),
        ({"eps_low": 1.0}, "--eps-low must be in"),
        ({"eps_high": -0.1}, "--eps-high must be >= 0"),
        ({"grad_clip": -1.0}, "--grad-clip must be >= 0"),
        ({"opd_advantage_clip": -2.0}, "--opd-advantage-clip must be >= 0"),
    ],
)
def test_both_backends_refuse_the_flag(tmp_path: Path, fields: dict, message: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    megatron = MegatronSettings(model_dir=tmp_path, samples_file=samples)
    check_megatron_settings(megatron)  # usable as it is
    with pytest.raises(ConfigError, match=message):
        check_settings(TrainSettings(**fields))
    with pytest.raises(ConfigError, match=message):
        check_megatron_settings(MegatronSettings(model_dir=tmp_path, samples_file=samples, **fields))


@pytest.mark.parametrize(
    ("flag", "value", "choices"),
    [
        ("--old-logprobs", "serving", "recompute | rollout"),
        ("--loss-reduction", "sum", "token | sample"),
        ("--kl-estimator", "k2", "k3 | exact"),
        ("--opd-loss", "topK", "token | topk"),
    ],
)
def test_both_backends_refuse_a_choice_they_do_not_have(
    tmp_path: Path, flag: str, value: str, choices: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = build_parser(flags_of=["train"]).parse_args(["train", flag, value])
    with pytest.raises(ConfigError, match=re.escape(f"{flag}: '{value}' is not one of {choices}")):
        build_settings(TrainSettings, args, {})
    with pytest.raises(SystemExit):
        parse_settings(["--model-dir", str(tmp_path), flag, value])
    assert f"invalid choice: '{value}'" in capsys.readouterr().err
