"""`orl`: one console script, one sub-command per deployable or tool.

Each sub-command names a settings class (its flags and environment variables) and a run function,
imported only when that sub-command runs so `orl --help` stays fast. Logging is configured here and
nowhere else.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from orl import __version__
from orl.schemas.errors import OrlError
from orl.settings_binding import (
    CONFIG_ENV,
    ConfigFile,
    add_settings_arguments,
    build_settings,
    config_path,
    log_settings,
    read_config_file,
)
from orl.supervised import exit_with_supervisor

logger = logging.getLogger("orl")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    settings: str  # "module:Class"
    run: str  # "module:function", called with the settings object (and parsed args), returns an exit code


COMMANDS: tuple[Command, ...] = (
    Command(
        "serve",
        "Run the OpenAI-compatible policy server that records every turn.",
        "orl.serving.settings:ServeSettings",
        "orl.serving.main:serve",
    ),
    Command(
        "pipeline",
        "Run the stream processors that turn recorded turns into scored samples.",
        "orl.pipeline.runtime.settings:PipelineSettings",
        "orl.pipeline.runtime.main:run",
    ),
    Command(
        "train",
        "Consume samples, train (LoRA or full), publish verified checkpoints.",
        "orl.trainer.settings:TrainSettings",
        "orl.trainer.main:train",
    ),
    Command(
        "gate",
        "Promote a published checkpoint to the servers only if it scores no worse than the promoted one on held-out prompts.",
        "orl.gate.settings:GateSettings",
        "orl.gate_scenarios:run_gate",
    ),
    Command(
        "up",
        "Start the embedded stack (server, pipeline, trainer) as supervised local processes.",
        "orl.up:UpSettings",
        "orl.up:up",
    ),
    Command(
        "demo",
        "Watch the loop learn on a CPU: a simulated user, Binary RL vs OPD vs Combined, with a report.",
        "orl.demo.run:DemoSettings",
        "orl.demo.main:demo",
    ),
    Command(
        "replay",
        "Re-run the pipeline over recorded history (a namespace, its archive or OpenClaw-RL records) into a new namespace.",
        "orl.history:ReplaySettings",
        "orl.history:run_replay",
    ),
    Command(
        "audit",
        "Show the whole chain behind any id (turn, vote, reward, sample, step, checkpoint) or a session's checkpoints.",
        "orl.history:AuditSettings",
        "orl.history:run_audit",
    ),
    Command(
        "forget",
        "Erase a session's or a client key's data: destroy its data keys (every copy of its payloads becomes "
        "unreadable), list the checkpoints derived from it, and with --retrain train a new run without it.",
        "orl.forget:ForgetSettings",
        "orl.forget:forget",
    ),
    Command(
        "export",
        "Write a namespace's events as JSON lines, or as Parquet files with typed columns.",
        "orl.history:ExportSettings",
        "orl.history:run_export",
    ),
    Command(
        "archive",
        "Copy a namespace's topics to the object store as Avro files (or --restore them onto the log).",
        "orl.history:ArchiveSettings",
        "orl.history:run_archive",
    ),
    Command(
        "samples",
        "List the newest training samples and rejections.",
        "orl.samples:SamplesSettings",
        "orl.samples:list_samples",
    ),
    Command(
        "report",
        "Is the model improving? Per policy version: judged reward, feedback, relevance, KL, activations.",
        "orl.report:ReportSettings",
        "orl.report:run_report",
    ),
    Command(
        "rollout",
        "Run agents through an environment's tasks (tool, terminal, plugins) against the server, in groups.",
        "orl.rollout:RolloutSettings",
        "orl.rollout:run_rollout",
    ),
    Command(
        "topics",
        "Create every topic of a namespace on the event log.",
        "orl.admin:AdminSettings",
        "orl.admin:create_topics",
    ),
    Command(
        "spool",
        "List the recorded events each server's spool set aside because the log refused them for good.",
        "orl.admin:AdminSettings",
        "orl.admin:list_set_aside",
    ),
    Command(
        "model",
        "Prepare the base model (convert the shipped SmolLM2 once), or export a trained version: "
        "`orl model export --version V --format hf|gguf`.",
        "orl.model_export:ModelSettings",
        "orl.model_export:run_model",
    ),
    Command(
        "settings",
        "Print the settings a command would start with here, each with its source (secrets masked).",
        "orl.admin:ShowSettings",
        "orl.admin:print_settings",
    ),
    Command(
        "status",
        "Show where the stack stands: each process, the spools, the versions published, gated and served, the last sample.",
        "orl.status:StatusSettings",
        "orl.status:show_status",
    ),
)


HELP_ALL = "--help-all"


def _load(path: str) -> object:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def chosen_command(argv: Sequence[str], commands: Sequence[Command] = COMMANDS) -> str | None:
    """The sub-command named on this command line, as argparse reads it (global options, their
    abbreviations and values included), or None (`orl --help`, none given, or an unknown one)."""
    probe = argparse.ArgumentParser(prog="orl", add_help=False, exit_on_error=False)
    add_global_options(probe)
    probe.add_argument("command", nargs="?")
    # the command's own flags (`orl model export --version 3`), which are not the global --version
    probe.add_argument("command_args", nargs=argparse.REMAINDER)
    try:
        known, _ = probe.parse_known_args(argv)
    except argparse.ArgumentError:
        return None  # the whole parser reports it
    return known.command if known.command in {command.name for command in commands} else None


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """`--version` and `--log-level`, the options before the sub-command."""
    parser.add_argument("--version", action="version", version=f"orl {__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("ORL_LOG_LEVEL", "INFO"),
        help="Logging level [env ORL_LOG_LEVEL; default INFO]",
    )


def build_parser(
    commands: Sequence[Command] = COMMANDS,
    flags_of: Collection[str] | None = None,
    show_advanced: bool = False,
) -> argparse.ArgumentParser:
    """The whole command line, with the flags of the sub-commands in `flags_of` (None: every one).
    `main` passes only the chosen one, so that a command imports its own settings module and not
    every other one's (some import torch and transformers: seconds each). The help lists the flags
    marked advanced only with `show_advanced` (`--help-all`)."""
    parser = argparse.ArgumentParser(
        prog="orl", description="Train a self-hosted LLM agent from its own live use."
    )
    add_global_options(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in commands:
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        if flags_of is not None and command.name not in flags_of:
            continue
        settings_cls = _load(command.settings)
        assert isinstance(settings_cls, type)
        sub.add_argument(
            "--config",
            default=None,
            metavar=CONFIG_ENV,
            help=f"A TOML file of settings for the whole stack (examples/orl.toml) [env {CONFIG_ENV}]",
        )
        hidden = add_settings_arguments(sub, settings_cls, show_advanced)
        sub.add_argument(HELP_ALL, action="help", help="Show every flag, the advanced ones too, and exit.")
        if hidden:
            sub.epilog = f"{hidden} more flags, for tuning: orl {command.name} {HELP_ALL}"
        sub.set_defaults(_command=command, _settings_cls=settings_cls)
    return parser


def settings_of_every_command(commands: Sequence[Command] = COMMANDS) -> dict[str, type]:
    """command name -> its settings class: what a config file is checked against."""
    loaded = {command.name: _load(command.settings) for command in commands}
    return {name: cls for name, cls in loaded.items() if isinstance(cls, type)}


def load_config(args: argparse.Namespace) -> ConfigFile | None:
    """The config file this command line or ORL_CONFIG names, checked against every command, or None.
    Its path is exported as ORL_CONFIG, so every process this one starts reads the same file."""
    path = config_path(args, os.environ)
    if path is None:
        return None
    os.environ[CONFIG_ENV] = str(path)
    return read_config_file(path, settings_of_every_command())


def main(argv: Sequence[str] | None = None) -> int:
    # Before torch loads (the commands import it lazily): idle OpenMP threads sleep instead of spinning
    # on the cores that another torch process of the stack needs (compute/machine.py has the numbers).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    argv = sys.argv[1:] if argv is None else argv
    chosen = chosen_command(argv)
    parser = build_parser(flags_of=[chosen] if chosen else [], show_advanced=HELP_ALL in argv)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per HTTP call drowns the progress output
    command: Command = args._command
    exit_with_supervisor()  # a component started by `orl up` / `orl demo` dies with it
    try:
        config = load_config(args)
        settings = build_settings(args._settings_cls, args, os.environ, config, command.name)
        log_settings(logger, settings)
        run: Callable[[object], int | None] = _load(command.run)  # type: ignore[assignment]
        with key_store_of(settings):
            return int(run(settings) or 0)
    except OrlError as error:
        print(f"orl {command.name}: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


@contextlib.contextmanager
def key_store_of(settings: object) -> Iterator[None]:
    """Seal the payloads the command writes, and open sealed ones, with the deployment's key store
    (orl.schemas.sealing) while it runs: every command that reaches the log gets it here, and
    nowhere else (the process's keys before it are back after it: tests call `main` in-process)."""
    from orl.connectors.key_store import KeyStore
    from orl.connectors.settings import ConnectionSettings
    from orl.schemas.codec import install_data_keys, installed_data_keys

    path = settings.effective_key_store() if isinstance(settings, ConnectionSettings) else None
    if path is None:
        yield
        return
    previous, keys = installed_data_keys(), KeyStore(path)
    install_data_keys(keys)
    try:
        yield
    finally:
        install_data_keys(previous)
        keys.close()


if __name__ == "__main__":
    sys.exit(main())
