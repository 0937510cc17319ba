"""`orl up` gives each child only the secrets it needs (issue 44)."""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.schemas.errors import ConfigError

from orl.up import STACK_SECRETS, UpSettings, component_env, stack_launches

S3 = {"ORL_S3_ACCESS_KEY", "ORL_S3_SECRET_KEY"}
NEEDED = {
    "serve": {"ORL_API_KEYS", "ORL_TENANT_KEYS", "ORL_ADMIN_KEY", "ORL_INTERNAL_KEY", *S3},
    "pipeline": {"ORL_API_KEY", "ORL_JUDGE_API_KEY"},
    "pipeline-downstream": {"ORL_API_KEY", "ORL_JUDGE_API_KEY"},
    "train": S3,
    "gate": {"ORL_API_KEY", "ORL_JUDGE_API_KEY", *S3},
}


def test_each_child_gets_only_its_own_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORL_S3_SECRET_KEY", "from-the-shell")  # a secret of the user's shell, too
    settings = UpSettings(data_dir=tmp_path, cores=2, judge_api_key="judge-secret", s3_access_key="s3-id")
    env = component_env(settings)
    assert set(env) >= STACK_SECRETS
    launches = stack_launches(settings, env)
    assert set(launches) == set(NEEDED)
    for name, launch in launches.items():
        assert set(launch.env) & STACK_SECRETS == NEEDED[name], name
    assert launches["serve"].env["ORL_INTERNAL_KEY"] == launches["pipeline"].env["ORL_API_KEY"]
    assert launches["pipeline"].env["ORL_API_KEY"] not in launches["serve"].env["ORL_API_KEYS"].split(",")
    assert "ORL_ADMIN_KEY" not in launches["gate"].env and "ORL_API_KEYS" not in launches["train"].env


def test_an_unknown_component_is_named(tmp_path: Path) -> None:
    settings = UpSettings(data_dir=tmp_path, components=("serve", "sever"))
    with pytest.raises(ConfigError, match="sever"):
        stack_launches(settings, component_env(settings))
