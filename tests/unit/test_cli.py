"""`orl`'s command line: a sub-command loads its own settings module only, so it starts fast."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orl.cli import build_parser, chosen_command


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


def test_the_pipeline_command_imports_neither_torch_nor_transformers() -> None:
    probe = (
        "import sys\n"
        "from orl.cli import build_parser, chosen_command\n"
        "argv = ['pipeline', '--help']\n"
        "build_parser(flags_of=[chosen_command(argv)])\n"
        "print(sorted({'torch', 'transformers', 'matplotlib'} & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
