"""Binds settings dataclasses to command-line flags, environment variables and the config file.

Precedence: a flag given on the command line, else the environment variable, else the config file
(`--config orl.toml` or ORL_CONFIG), else the default. This is the only place that reads
`os.environ` for settings.

The config file (TOML) describes a whole stack. A key at the top level is a setting of every command
that has it (`precision = "fp32"` reaches the server, the trainer and the gate); a table named after
a command (`[train]`) holds settings of that command only and beats the top level. Keys are the
settings' names (`judge_url`, or `judge-url` as on the command line). A key no command knows, a
table no command has, a value of the wrong type and a secret are refused, naming the file and key:
secrets stay in the environment, where `orl up` gives each component only its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import logging
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orl.connectors.settings import masked
from orl.schemas.errors import ConfigError

T = TypeVar("T")
CONFIG_ENV = "ORL_CONFIG"
DEFAULT = "default"  # the source of a setting nobody gave


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_settings_arguments(
    parser: argparse.ArgumentParser, settings_cls: type, show_advanced: bool = True
) -> int:
    """One flag per settings field; the help text shows the environment variable and the default.
    Unless `show_advanced`, the help leaves out the fields marked advanced (they still parse); returns
    how many it left out."""
    hidden = 0
    for f in dataclasses.fields(settings_cls):
        env = f.metadata.get("env", "")
        kind = _field_type(settings_cls, f.name)
        default = "***" if f.metadata.get("secret") else f.default
        help_text = f"{f.metadata.get('help', '')} [env {env}; default {default}]"
        if f.metadata.get("advanced") and not show_advanced:
            help_text, hidden = argparse.SUPPRESS, hidden + 1
        if kind is bool:
            parser.add_argument(
                flag_name(f.name),
                dest=f.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else ()
            metavar = "{" + ",".join(choices) + "}" if choices else env or None
            parser.add_argument(flag_name(f.name), dest=f.name, default=None, help=help_text, metavar=metavar)
        if f.metadata.get("positional"):
            parser.add_argument(
                _positional_dest(f.name), nargs="?", default=None, metavar=f.name.upper(),
                help=f"The same as {flag_name(f.name)}.",
            )  # fmt: skip
    return hidden


def _positional_dest(field_name: str) -> str:
    return f"{field_name}_positional"


def build_settings(
    settings_cls: type[T],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    config: ConfigFile | None = None,
    command: str = "",
) -> T:
    """The frozen settings object from flags, then environment, then `config`'s values for `command`,
    then defaults; ConfigError names a bad value and where it came from."""
    return resolve_settings(settings_cls, args, environ, config, command)[0]


def resolve_settings(
    settings_cls: type[T],
    args: argparse.Namespace,
    environ: Mapping[str, str],
    config: ConfigFile | None = None,
    command: str = "",
) -> tuple[T, dict[str, str]]:
    """`build_settings`, and where each setting came from: its flag, its variable, the file and key, or
    'default'."""
    from_file = config.values_for(command) if config else {}
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in dataclasses.fields(settings_cls):  # type: ignore[arg-type]
        raw, source = _given(args, f.name)
        env = f.metadata.get("env")
        if raw is None and env and env in environ:
            raw, source = environ[env], env
        if raw is None and f.name in from_file:
            raw, source = from_file[f.name]
        if raw is None:
            sources[f.name] = DEFAULT
            continue
        sources[f.name] = source
        if raw == "" and _optional(settings_cls, f.name):
            values[f.name] = None  # an empty value unsets an optional setting (e.g. ORL_TRAIN_LR=)
            continue
        values[f.name] = _convert(_field_type(settings_cls, f.name), raw, source)
    return settings_cls(**values), sources


@dataclass(frozen=True)
class ConfigFile:
    """An orl.toml, read and checked against every command's settings."""

    path: Path
    shared: Mapping[str, Any]  # top-level keys: every command that has the setting
    tables: Mapping[str, Mapping[str, Any]]  # command -> its own keys

    def values_for(self, command: str) -> dict[str, tuple[Any, str]]:
        """setting name -> (value, where it was written) for `command`: its table over the top level."""
        values = {name: (value, f"{self.path}: {name}") for name, value in self.shared.items()}
        for name, value in self.tables.get(command, {}).items():
            values[name] = (value, f"{self.path}: [{command}] {name}")
        return values


def read_config_file(path: Path, settings_of: Mapping[str, type]) -> ConfigFile:
    """`path` read as TOML and checked against `settings_of` (command name -> its settings class)."""
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: no such file") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"config file {path}: {error}") from error
    fields_of = {command: _fields_by_name(cls) for command, cls in settings_of.items()}
    every_field = {name: f for fields in fields_of.values() for name, f in fields.items()}
    shared: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {}
    for key, value in document.items():
        if isinstance(value, dict):
            if key not in fields_of:
                raise ConfigError(f"{path}: [{key}] is no command (commands: {', '.join(sorted(fields_of))})")
            tables[key] = {
                _checked_key(path, f"[{key}] ", name, fields_of[key]): item for name, item in value.items()
            }
        else:
            shared[_checked_key(path, "", key, every_field)] = value
    return ConfigFile(path, shared, tables)


def config_path(args: argparse.Namespace, environ: Mapping[str, str]) -> Path | None:
    """The config file named by --config, else by ORL_CONFIG, else none."""
    given = getattr(args, "config", None) or environ.get(CONFIG_ENV)
    return Path(given).expanduser().resolve() if given else None


def config_from_environment(settings_of: Mapping[str, type]) -> ConfigFile | None:
    """The config file ORL_CONFIG names (the one `orl` was started with: `main` exports it), or None."""
    path = config_path(argparse.Namespace(), os.environ)
    return read_config_file(path, settings_of) if path else None


def effective_settings(
    settings_cls: type, command: str, settings_of: Mapping[str, type]
) -> list[tuple[str, str, str]]:
    """(name, value, source) of every setting `orl <command>` would start with here (environment, the
    config file, defaults; no flags), secrets masked."""
    config = config_from_environment(settings_of)
    settings: Any
    settings, sources = resolve_settings(settings_cls, argparse.Namespace(), os.environ, config, command)
    shown = masked(settings)
    return [(name, shown[name], sources[name]) for name in shown]


def _fields_by_name(settings_cls: type) -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(settings_cls)}  # type: ignore[arg-type]


def _checked_key(path: Path, where: str, key: str, known: Mapping[str, dataclasses.Field[Any]]) -> str:
    name = key.replace("-", "_")
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{path}: {where}{key!r} is no setting{hint}")
    f = known[name]
    if f.metadata.get("secret"):
        raise ConfigError(
            f"{path}: {where}{key!r} is a secret: give it as {f.metadata['env']} in the environment, "
            "not in the file (orl up gives each component only the secrets it needs)"
        )
    return name


def _given(args: argparse.Namespace, name: str) -> tuple[Any, str]:
    """The value given on the command line for a field (its flag or its positional form) and its source."""
    flagged, positional = getattr(args, name, None), getattr(args, _positional_dest(name), None)
    if flagged is not None and positional is not None and flagged != positional:
        raise ConfigError(f"{flag_name(name)} {flagged!r} and the argument {positional!r} disagree: give one")
    if positional is not None:
        return positional, name.upper()
    return flagged, flag_name(name)


def log_settings(logger: logging.Logger, settings: object) -> None:
    logger.info("effective settings: %s", " ".join(f"{k}={v}" for k, v in masked(settings).items()))


def _field_type(settings_cls: type, name: str) -> Any:
    hint = typing.get_type_hints(settings_cls)[name]
    if isinstance(hint, types.UnionType):  # `X | None`: convert to X
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def _optional(settings_cls: type, name: str) -> bool:
    hint = typing.get_type_hints(settings_cls)[name]
    return isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint)


def _convert(kind: Any, raw: Any, source: str) -> Any:
    """A flag's or variable's string, or a config file's TOML value, as the field's type."""
    if not isinstance(raw, str):
        return _converted_value(kind, raw, source)
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if typing.get_origin(kind) is typing.Literal:
            return _choice(kind, raw, source)
        if kind in (int, float, Path, str):
            return kind(raw)
        if typing.get_origin(kind) is tuple:
            return _items(kind, [part.strip() for part in raw.split(",") if part.strip()], source)
    except ValueError as error:
        raise ConfigError(f"{source}: cannot read {raw!r} as {getattr(kind, '__name__', kind)}") from error
    raise ConfigError(f"{source}: unsupported setting type {kind}")


def _converted_value(kind: Any, value: Any, source: str) -> Any:
    """A TOML value (bool, int, float, list) as the field's type; ConfigError on a mismatch."""
    if typing.get_origin(kind) is typing.Literal and isinstance(value, str):
        return _choice(kind, value, source)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if (
        typing.get_origin(kind) is tuple
        and isinstance(value, list)
        and all(isinstance(v, str) for v in value)
    ):
        return _items(kind, value, source)
    if kind in (str, Path) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return kind(str(value))
    name = getattr(kind, "__name__", str(kind))
    raise ConfigError(f"{source}: {value!r} is not of type {name}")


def _items(kind: Any, values: list[str], source: str) -> tuple[str, ...]:
    """A tuple setting's items, each checked when the tuple's items are a Literal's choices."""
    item = typing.get_args(kind)[0]
    if typing.get_origin(item) is typing.Literal:
        return tuple(_choice(item, value, source) for value in values)
    return tuple(values)


def _choice(kind: Any, value: str, source: str) -> str:
    """`value` if it is one of the Literal `kind`'s choices; else ConfigError listing them."""
    choices = typing.get_args(kind)
    if value in choices:
        return value
    close = difflib.get_close_matches(value, choices, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"{source}: {value!r} is not one of {' | '.join(choices)}{hint}")
