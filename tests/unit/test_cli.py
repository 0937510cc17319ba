"""`orl`'s command line: a sub-command loads its own settings module only, so it starts fast, and its
`--help` lists the flags of a first run (`--help-all` every one)."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys

import pytest

from orl.cli import COMMANDS, HELP_ALL, build_parser, chosen_command, main
from orl.settings_binding import flag_name


@pytest.mark.parametrize(
    ("argv", "chosen"),
    [
        (["serve", "--port", "8000"], "serve"),
        (["--log-level", "DEBUG", "pipeline"], "pipeline"),
        (["--log-level", "up", "topics"], "topics"),  # "up" is --log-level's value here
        (["--log", "DEBUG", "train"], "train"),  # argparse's abbreviation of --log-level
        (["--log-level=DEBUG", "serve"], "serve"),
        (["--help"], None),
        ([], None),
        (["bogus", "serve"], None),  # argparse refuses "bogus"
    ],
)
def test_the_chosen_command_is_the_first_argument_naming_one(argv: list[str], chosen: str | None) -> None:
    assert chosen_command(argv) == chosen


def test_a_parser_for_one_command_has_that_commands_flags_only() -> None:
    parser = build_parser(flags_of=["topics"])
    args = parser.parse_args(["topics", "--namespace", "n1"])
    assert args.command == "topics" and args.namespace == "n1"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--port", "8000"])  # serve's flags were not added


def heavy_modules_imported_by(code: str, heavy: tuple[str, ...]) -> list[str]:
    """Which of the `heavy` modules a fresh interpreter has imported after running `code`."""
    probe = f"import sys\n{code}\nprint(sorted({set(heavy)!r} & set(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return ast.literal_eval(out.strip())


def test_the_pipeline_command_imports_neither_torch_nor_transformers() -> None:
    code = (
        "from orl.cli import build_parser, chosen_command\n"
        "argv = ['pipeline', '--help']\n"
        "build_parser(flags_of=[chosen_command(argv)])"
    )
    assert heavy_modules_imported_by(code, ("torch", "transformers", "matplotlib")) == []


def flags_in(help_text: str) -> set[str]:
    """The long options an argparse help text lists (each at the start of its own line)."""
    return {line.split()[0].rstrip(",") for line in help_text.splitlines() if line.startswith("  --")}


@pytest.mark.parametrize("command", [command.name for command in COMMANDS])
def test_help_lists_at_most_25_flags_and_help_all_lists_every_setting(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    helps = {}
    for option in ("--help", HELP_ALL):
        with pytest.raises(SystemExit) as exited:
            main([command, option])
        assert exited.value.code == 0
        helps[option] = capsys.readouterr().out
    short, full = flags_in(helps["--help"]), flags_in(helps[HELP_ALL])
    settings_cls = build_parser(flags_of=[command]).parse_args([command])._settings_cls
    every_setting = {flag_name(f.name) for f in dataclasses.fields(settings_cls)}
    assert len(short) <= 25, sorted(short)
    assert every_setting <= full and short <= full
    hidden = len(every_setting - short)
    assert (f"{hidden} more flags, for tuning: orl {command} {HELP_ALL}" in helps["--help"]) == (hidden > 0)


def test_a_flag_left_out_of_help_still_parses() -> None:
    args = build_parser(flags_of=["train"]).parse_args(["train", "--eps-high", "0.3"])
    assert args.eps_high == "0.3"


def test_reading_every_commands_settings_imports_neither_torch_nor_transformers() -> None:
    """What a config file is checked against, in every process that is given one."""
    code = "from orl.cli import settings_of_every_command\nsettings_of_every_command()"
    assert heavy_modules_imported_by(code, ("torch", "transformers")) == []
