"""`orl train` and the megatron worker refuse the same unusable loss flags with the same message."""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.schemas.errors import ConfigError
from orl.trainer.megatron_backend.settings import MegatronSettings, check_megatron_settings
from orl.trainer.settings import TrainSettings, check_settings


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"beta_kl": -0.1}, "--beta-kl must be >= 0"),
        ({"eps_low": 1.0}, "--eps-low must be in"),
        ({"eps_high": -0.1}, "--eps-high must be >= 0"),
        ({"grad_clip": -1.0}, "--grad-clip must be >= 0"),
        ({"old_logprobs": "serving"}, "--old-logprobs must be one of"),
        ({"loss_reduction": "sum"}, "--loss-reduction must be one of"),
        ({"opd_advantage_clip": -2.0}, "--opd-advantage-clip must be >= 0"),
        ({"kl_estimator": "k2"}, "--kl-estimator must be one of"),
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
