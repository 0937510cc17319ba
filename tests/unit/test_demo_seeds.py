"""orl.demo.run's seeds: `--seeds N` runs seeds --seed .. --seed+N-1, each in its own namespace."""

from __future__ import annotations

import itertools
import json

import pytest
from orl.schemas.errors import ConfigError

from orl.cli import build_parser
from orl.demo.run import (
    DemoSettings,
    _namespace,
    demo_seeds,
    orl_environment,
    prompt_stream,
    recorded_settings,
    round_prompts,
    run_demo,
    run_time_text,
)
from orl.demo.scenarios import STUDENT
from orl.settings_binding import build_settings


def parsed(argv: list[str], environ: dict[str, str]) -> DemoSettings:
    args = build_parser().parse_args(["demo", *argv])
    settings = build_settings(args._settings_cls, args, environ)
    assert isinstance(settings, DemoSettings)
    return settings


def test_seeds_start_at_the_first_seed() -> None:
    assert demo_seeds(DemoSettings()) == [0]
    assert demo_seeds(DemoSettings(seed=7, seeds=3)) == [7, 8, 9]


def test_seeds_is_a_flag_and_an_environment_variable() -> None:
    assert parsed([], {}).seeds == 1
    assert parsed(["--seeds", "3", "--seed", "2"], {}).seeds == 3
    assert parsed([], {"ORL_DEMO_SEEDS": "5"}).seeds == 5


def test_quick_keeps_the_seeds_it_is_given() -> None:
    assert DemoSettings(quick=True).effective().seeds == 1
    assert DemoSettings(quick=True, seeds=2).effective().seeds == 2


def test_fewer_than_one_seed_is_a_config_error_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--seeds"):
        run_demo(DemoSettings(seeds=0))


def test_every_seed_and_method_gets_its_own_namespace() -> None:
    names = {_namespace("20260101-120000", seed, m) for seed in (0, 1) for m in ("binary", "opd", "combined")}
    assert len(names) == 6
    assert _namespace("20260101-120000", 1, "combined") == "demo-20260101-120000-s1-combined"


def test_the_seed_orders_the_training_prompts() -> None:
    def first(seed: int) -> list[str]:
        return list(itertools.islice(prompt_stream(STUDENT, seed), 20))

    assert first(0) == first(0)
    assert first(0) != first(1)


def test_the_progress_line_estimates_what_is_left_at_the_pace_so_far() -> None:
    assert run_time_text(90.0, 0, 48) == "2 min so far"  # no step done: no estimate yet
    assert run_time_text(600.0, 4, 48) == "10 min so far, about 110 min left"
    assert run_time_text(2880.0, 48, 48) == "48 min so far"


def test_results_record_the_orl_variables_a_run_inherits_but_no_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ORL_TRAIN_OPD_ADVANTAGE_CLIP", "2")
    monkeypatch.setenv("ORL_S3_SECRET_KEY", "hunter2")
    monkeypatch.setenv("ORL_S3_ACCESS_KEY", "admin")
    monkeypatch.setenv("OTHER_TOOL_SETTING", "1")
    recorded = orl_environment()
    assert recorded["ORL_TRAIN_OPD_ADVANTAGE_CLIP"] == "2"
    assert not {"ORL_S3_SECRET_KEY", "ORL_S3_ACCESS_KEY", "OTHER_TOOL_SETTING"} & set(recorded)


def test_no_setting_declared_secret_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded variables leave out every variable a command declares secret (`setting(secret=True)`)."""
    import dataclasses
    import importlib

    from orl.cli import COMMANDS

    secrets = set()
    for command in COMMANDS:
        module, _, name = command.settings.partition(":")
        for f in dataclasses.fields(getattr(importlib.import_module(module), name)):
            if f.metadata.get("secret"):
                secrets.add(f.metadata["env"])
    assert "ORL_S3_SECRET_KEY" in secrets and "ORL_METRICS_KEY" in secrets
    for env in secrets:
        monkeypatch.setenv(env, "hunter2")
    assert not secrets & set(orl_environment())


def test_a_round_asks_each_prompt_sessions_per_prompt_times() -> None:
    assert round_prompts(iter("abcdefgh"), 8, 2) == ["a", "a", "b", "b", "c", "c", "d", "d"]
    assert round_prompts(iter("abcdefgh"), 4, 1) == ["a", "b", "c", "d"]
    assert parsed(["--sessions-per-prompt", "4"], {}).sessions_per_prompt == 4


def test_sessions_per_prompt_must_divide_the_batch() -> None:
    with pytest.raises(ConfigError, match="--sessions-per-prompt"):
        run_demo(DemoSettings(batch_size=16, sessions_per_prompt=3))


def test_results_record_every_setting_that_shapes_a_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORL_TRAIN_PROMPT_BASELINE", "true")
    recorded = recorded_settings(DemoSettings(sessions_per_prompt=2, seed=3, seeds=2, port=9999))
    assert recorded["sessions_per_prompt"] == 2 and recorded["seeds"] == [3, 4]
    assert recorded["environment"]["ORL_TRAIN_PROMPT_BASELINE"] == "true"
    assert "port" not in recorded and "data_dir" not in recorded  # plumbing, not what was measured
    json.dumps(recorded)  # results.json holds it
