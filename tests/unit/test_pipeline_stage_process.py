"""Which stages `orl pipeline --role all` moves to its second process, and how that process gets its settings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.runtime.main import build_stages
from pipeline.runtime.settings import PipelineSettings
from pipeline.runtime.stage_process import settings_from_json, settings_json, split_stages
from schemas.errors import ConfigError

BINARY = ["turn_linker", "judge", "vote_tally", "sample_builder"]
COMBINED = ["turn_linker", "judge", "vote_tally", "hint_selector", "teacher", "sample_builder"]


def test_role_all_on_two_cores_moves_the_downstream_stages() -> None:
    assert split_stages(BINARY, "all", 2) == (["turn_linker", "judge"], ["vote_tally", "sample_builder"])
    assert split_stages(COMBINED, "all", 16) == (
        ["turn_linker", "judge", "teacher"],
        ["vote_tally", "hint_selector", "sample_builder"],
    )


@pytest.mark.parametrize(
    ("names", "role", "cpus"),
    [
        (BINARY, "all", 1),  # one core: a second process would only add switching
        (BINARY, "all", None),  # unknown core count
        (BINARY, ",".join(BINARY), 8),  # stages named: exactly those, here
        (["vote_tally", "sample_builder"], "pure", 8),
        (["judge"], "judge", 8),
        (["turn_linker", "judge"], "all", 8),  # nothing downstream to move
    ],
)
def test_no_second_process_otherwise(names: list[str], role: str, cpus: int | None) -> None:
    assert split_stages(names, role, cpus) == (names, [])


def test_settings_reach_the_stage_process_unchanged() -> None:
    settings = PipelineSettings(
        data_dir=Path("/tmp/orl data"), api_key="secret", method="binary", judge_votes=5, tick_interval_s=0.5,
        at_least_one=False, role="vote_tally,sample_builder",
    )  # fmt: skip
    assert settings_from_json(settings_json(settings)) == settings


def test_a_comma_separated_role_runs_those_stages_in_topological_order() -> None:
    settings = PipelineSettings(method="binary", judge="user_reply", role="sample_builder,vote_tally")
    assert [s.name for s in build_stages(settings)] == ["vote_tally", "sample_builder"]
    with pytest.raises(ConfigError, match="comma-separated"):
        build_stages(dataclasses.replace(settings, role="vote_tally,nope"))
