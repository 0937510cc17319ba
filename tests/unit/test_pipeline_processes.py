"""How the stack places the pipeline's stages in processes, and how a child process gets its settings."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest
from orl.connectors.settings import settings_env
from orl.pipeline.runtime.main import build_stages
from orl.pipeline.runtime.settings import PipelineSettings
from orl.schemas.errors import ConfigError

from orl.settings_binding import build_settings
from orl.up import UpSettings, pipeline_roles, stack_launches


def test_two_cores_split_the_pipeline_into_upstream_and_downstream_processes() -> None:
    assert pipeline_roles("binary", 2) == {
        "pipeline": "turn_linker,judge",
        "pipeline-downstream": "vote_tally,sample_builder",
    }
    assert pipeline_roles("combined", 16) == {
        "pipeline": "turn_linker,judge,teacher",
        "pipeline-downstream": "vote_tally,hint_selector,sample_builder",
    }


def test_one_core_runs_the_pipeline_in_one_process() -> None:
    assert pipeline_roles("opd", 1) == {"pipeline": "all"}


def test_the_stack_launches_each_pipeline_process_with_its_role_in_the_environment() -> None:
    settings = UpSettings(data_dir=Path("/tmp/orl-launch-test"), cores=2, method="binary")
    launches = stack_launches(settings, {"ORL_NAMESPACE": "live"})
    assert list(launches) == [
        "serve",
        "pipeline",
        "pipeline-downstream",
        "train",
        "gate",
    ]  # the gate: on by default
    assert {name: launch.command for name, launch in launches.items()} == {
        "serve": "serve", "pipeline": "pipeline", "pipeline-downstream": "pipeline", "train": "train",
        "gate": "gate",
    }  # fmt: skip
    assert launches["pipeline-downstream"].env == {
        "ORL_NAMESPACE": "live",
        "ORL_PIPELINE_ROLE": "vote_tally,sample_builder",
    }
    assert "ORL_PIPELINE_ROLE" not in launches["serve"].env


def test_each_pipeline_process_gets_its_own_metrics_port_when_asked() -> None:
    settings = UpSettings(data_dir=Path("/tmp/orl-launch-test"), cores=2, pipeline_metrics_port=9400)
    launches = stack_launches(settings, {})
    ports = {name: launch.env.get("ORL_PIPELINE_METRICS_PORT") for name, launch in launches.items()}
    assert ports == {
        "serve": None,
        "pipeline": "9400",
        "pipeline-downstream": "9401",
        "train": None,
        "gate": None,
    }
    assert "ORL_PIPELINE_METRICS_PORT" not in stack_launches(UpSettings(cores=2), {})["pipeline"].env


def test_settings_reach_a_child_process_unchanged_through_its_environment() -> None:
    settings = PipelineSettings(
        data_dir=Path("/tmp/orl data"), api_key="secret", method="binary", judge_votes=5, tick_interval_s=0.5,
        at_least_one=False, role="vote_tally,sample_builder",
    )  # fmt: skip
    no_flags = argparse.Namespace()
    assert build_settings(PipelineSettings, no_flags, settings_env(settings)) == settings
    up = UpSettings(api_keys=("k1", "k2"), components=("serve", "train"), cores=3)
    assert build_settings(UpSettings, no_flags, settings_env(up)) == up


def test_a_comma_separated_role_runs_those_stages_in_topological_order() -> None:
    settings = PipelineSettings(method="binary", judge="user_reply", role="sample_builder,vote_tally")
    assert [s.name for s in build_stages(settings)] == ["vote_tally", "sample_builder"]
    with pytest.raises(ConfigError, match="comma-separated"):
        build_stages(dataclasses.replace(settings, role="vote_tally,nope"))


def test_a_stage_the_method_does_not_use_is_refused() -> None:
    settings = PipelineSettings(method="binary", judge="user_reply", role="teacher")
    with pytest.raises(ConfigError, match="binary does not use the stage"):
        build_stages(settings)


def test_opd_topk_reaches_the_teacher_stage_and_is_bounded() -> None:
    settings = PipelineSettings(
        method="opd", judge="user_reply", hint_judge="user_hint", role="teacher", opd_topk=8
    )
    (teacher,) = build_stages(settings)
    assert teacher.top_k == 8  # type: ignore[attr-defined]
    assert settings_env(settings)["ORL_OPD_TOPK"] == "8"
    with pytest.raises(ConfigError, match="--opd-topk"):
        build_stages(dataclasses.replace(settings, opd_topk=101))
