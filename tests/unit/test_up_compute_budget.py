"""`orl up` decides the compute budget of the processes it starts, and says what it chose."""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.compute.machine import available_cores, cpu_model_name
from orl.schemas.errors import ConfigError

from orl.up import UpSettings, component_env, compute_budget, stack_cores


def test_every_torch_process_gets_the_budget_and_passive_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    settings = UpSettings(data_dir=tmp_path, cores=3, precision="fp32")
    line = compute_budget(settings)
    assert stack_cores(settings) == 3
    assert line.startswith("compute budget: 3 cores (set by --cores;")
    assert (
        "serve, train and gate use 3 torch threads each while computing alone, 1 each while all compute"
        in line
    )
    no_gate = compute_budget(UpSettings(data_dir=tmp_path, cores=3, precision="fp32", gate=False))
    assert (
        "serve and train use 3 torch threads each while computing alone, 1 each while all compute" in no_gate
    )
    assert "numerics fp32 (set by --precision)" in line
    env = component_env(settings)
    assert env["ORL_THREADS"] == "3" and env["ORL_PRECISION"] == "fp32"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # a user's own choice is kept
    assert component_env(settings)["OMP_WAIT_POLICY"] == "ACTIVE"


def test_the_default_budget_is_every_available_core(tmp_path: Path) -> None:
    line = compute_budget(UpSettings(data_dir=tmp_path))
    cores = stack_cores(UpSettings(data_dir=tmp_path))
    assert cores == available_cores()
    assert f"{cores} cores (all this process may use; {cores} available, {cpu_model_name()})" in line
    assert "numerics " in line and "core board" in line


def test_bad_budgets_name_their_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--cores must be >= 0"):
        compute_budget(UpSettings(data_dir=tmp_path, cores=-1))
    with pytest.raises(ConfigError, match="--precision must be one of auto, bf16, fp32"):
        compute_budget(UpSettings(data_dir=tmp_path, precision="int8"))
