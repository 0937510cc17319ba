"""The config file (`--config orl.toml`, ORL_CONFIG): precedence, its checks, and what `orl settings` shows."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from orl.schemas.errors import ConfigError
from orl.serving.settings import ServeSettings
from orl.trainer.settings import TrainSettings

from orl.cli import build_parser, settings_of_every_command
from orl.demo.run import DemoSettings
from orl.settings_binding import read_config_file, resolve_settings
from orl.up import UpSettings, check_component_tables, stack_env, stack_launches

REPO = Path(__file__).resolve().parents[2]
SETTINGS_OF = settings_of_every_command()


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orl.toml"
    path.write_text(text, encoding="utf-8")
    return path


def train_args(*argv: str) -> argparse.Namespace:
    return build_parser(flags_of=["train"]).parse_args(["train", *argv])


def test_a_flag_beats_the_environment_which_beats_the_file_whose_table_beats_its_top_level(
    tmp_path: Path,
) -> None:
    file = read_config_file(
        config(tmp_path, 'precision = "fp32"\nbatch_size = 3\nlr = 0.1\n[train]\nbatch-size = 5\nlr = 0.2\n'),
        SETTINGS_OF,
    )
    settings, sources = resolve_settings(
        TrainSettings, train_args("--lr", "0.4"), {"ORL_TRAIN_BATCH_SIZE": "7"}, file, "train"
    )
    assert (settings.lr, sources["lr"]) == (0.4, "--lr")
    assert (settings.batch_size, sources["batch_size"]) == (7, "ORL_TRAIN_BATCH_SIZE")
    assert (settings.precision, sources["precision"]) == ("fp32", f"{file.path}: precision")
    assert sources["kind"] == "default"
    settings, sources = resolve_settings(TrainSettings, train_args(), {}, file, "train")
    assert (settings.batch_size, sources["batch_size"]) == (5, f"{file.path}: [train] batch_size")
    assert settings.lr == 0.2


def test_a_top_level_key_reaches_every_command_that_has_the_setting(tmp_path: Path) -> None:
    file = read_config_file(
        config(tmp_path, 'precision = "fp32"\n[train]\nprecision = "bf16"\n'), SETTINGS_OF
    )
    serve = build_parser(flags_of=["serve"]).parse_args(["serve"])
    assert resolve_settings(ServeSettings, serve, {}, file, "serve")[0].precision == "fp32"
    assert resolve_settings(TrainSettings, train_args(), {}, file, "train")[0].precision == "bf16"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("precison = 'fp32'\n", "'precison' is no setting (did you mean 'precision'?)"),
        ("[trian]\nlr = 1.0\n", "[trian] is no command"),
        ("[serve]\nlr = 1.0\n", "[serve] 'lr' is no setting"),
        ("judge_api_key = 'k'\n", "is a secret: give it as ORL_JUDGE_API_KEY"),
        ("[up]\nport = 'eighty'\n", "[up] port: cannot read 'eighty' as int"),
        ("[up]\nport = 80.5\n", "[up] port: 80.5 is not of type int"),
        ("[up]\ngate = 1\n", "[up] gate: 1 is not of type bool"),
        ("method = [\n", "config file"),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    path = config(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        file = read_config_file(path, SETTINGS_OF)
        for command, cls in SETTINGS_OF.items():
            args = build_parser(flags_of=[command]).parse_args([command])
            resolve_settings(cls, args, {}, file, command)
    assert message in str(caught.value) and str(path) in str(caught.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        read_config_file(tmp_path / "absent.toml", SETTINGS_OF)


def test_the_example_file_is_valid_for_every_command_and_for_orl_up(tmp_path: Path) -> None:
    file = read_config_file(REPO / "examples" / "orl.toml", SETTINGS_OF)
    required = {
        "ORL_API_KEY": "a-key"
    }  # orl rollout needs its server's key and the file must not hold secrets
    for command, cls in SETTINGS_OF.items():
        args = build_parser(flags_of=[command]).parse_args([command])
        resolve_settings(cls, args, required, file, command)  # no ConfigError
    up = resolve_settings(UpSettings, build_parser(flags_of=["up"]).parse_args(["up"]), {}, file, "up")[0]
    up = UpSettings(**{**up.__dict__, "data_dir": tmp_path})
    stack = stack_env(up)
    check_component_tables(file, SETTINGS_OF, stack_launches(up, {**os.environ, **stack}), stack)


def test_orl_up_refuses_a_component_table_setting_it_gives_every_component(tmp_path: Path) -> None:
    file = read_config_file(config(tmp_path, '[train]\nprecision = "fp32"\n'), SETTINGS_OF)
    up = UpSettings(data_dir=tmp_path)
    stack = stack_env(up)
    with pytest.raises(ConfigError, match=r"\[train\] precision: orl up sets ORL_PRECISION"):
        check_component_tables(file, SETTINGS_OF, stack_launches(up, {**os.environ, **stack}), stack)


def test_orl_settings_shows_each_value_with_its_source_and_hides_secrets(tmp_path: Path) -> None:
    path = config(tmp_path, "[train]\nlr = 0.003\n")
    env = {**os.environ, "ORL_S3_SECRET_KEY": "hunter2", "ORL_RUN_ID": "r7"}
    env.pop("ORL_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "orl.cli", "settings", "train", "--config", str(path)],
        capture_output=True, text=True, env=env, check=True, cwd=tmp_path,
    )  # fmt: skip
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:]}
    assert rows["lr"] == ["0.003", f"{path}:", "[train]", "lr"]
    assert rows["run_id"] == ["r7", "ORL_RUN_ID"]
    assert rows["s3_secret_key"] == ["***", "ORL_S3_SECRET_KEY"]
    assert rows["kind"] == ["lora", "default"]
    assert "hunter2" not in done.stdout + done.stderr


def test_a_command_started_with_a_config_file_hands_it_to_the_processes_it_starts(tmp_path: Path) -> None:
    path = config(tmp_path, "[train]\nlr = 0.003\n")
    probe = (
        "import os, sys\n"
        "from orl.cli import build_parser, load_config\n"
        f"load_config(build_parser(flags_of=['train']).parse_args(['train', '--config', {str(path)!r}]))\n"
        "print(os.environ['ORL_CONFIG'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ORL_CONFIG"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == str(path.resolve())


def test_a_choice_is_checked_once_where_it_is_read_from_a_flag_a_variable_or_the_file(tmp_path: Path) -> None:
    file = read_config_file(config(tmp_path, 'precision = "fp16"\n'), SETTINGS_OF)
    with pytest.raises(ConfigError, match=r": precision: 'fp16' is not one of auto \| bf16 \| fp32"):
        resolve_settings(TrainSettings, train_args(), {}, file, "train")
    with pytest.raises(ConfigError, match=r"ORL_PRECISION: 'bf61' is not one of .*\(did you mean 'bf16'\?\)"):
        resolve_settings(TrainSettings, train_args(), {"ORL_PRECISION": "bf61"}, None, "train")
    with pytest.raises(ConfigError, match=r"--kind: 'LoRA' is not one of lora \| full"):
        resolve_settings(TrainSettings, train_args("--kind", "LoRA"), {}, None, "train")
    demo = build_parser(flags_of=["demo"]).parse_args(["demo", "--methods", "binary,rl"])
    with pytest.raises(ConfigError, match=r"--methods: 'rl' is not one of binary \| opd \| combined"):
        resolve_settings(DemoSettings, demo, {}, None, "demo")
    settings, _ = resolve_settings(TrainSettings, train_args("--kind", "full"), {}, None, "train")
    assert settings.kind == "full"


def test_help_lists_a_choice_flags_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser(flags_of=["train"]).parse_args(["train", "--help"])
    assert "--kind {lora,full}" in capsys.readouterr().out
