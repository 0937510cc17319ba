"""Binds settings dataclasses to command-line flags and environment variables.

Precedence: a flag given on the command line, else the environment variable, else the default.
This is the only place that reads `os.environ` for settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from orl.connectors.settings import masked
from orl.schemas.errors import ConfigError

T = TypeVar("T")


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def add_settings_arguments(parser: argparse.ArgumentParser, settings_cls: type) -> None:
    """One flag per settings field; the help text shows the environment variable and the default."""
    for f in dataclasses.fields(settings_cls):
        env = f.metadata.get("env", "")
        kind = _field_type(settings_cls, f.name)
        default = "***" if f.metadata.get("secret") else f.default
        help_text = f"{f.metadata.get('help', '')} [env {env}; default {default}]"
        if kind is bool:
            parser.add_argument(
                flag_name(f.name),
                dest=f.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag_name(f.name), dest=f.name, default=None, help=help_text, metavar=env or None
            )
        if f.metadata.get("positional"):
            parser.add_argument(
                _positional_dest(f.name), nargs="?", default=None, metavar=f.name.upper(),
                help=f"The same as {flag_name(f.name)}.",
            )  # fmt: skip


def _positional_dest(field_name: str) -> str:
    return f"{field_name}_positional"


def build_settings(settings_cls: type[T], args: argparse.Namespace, environ: Mapping[str, str]) -> T:
    """The frozen settings object from flags, then environment, then defaults; ConfigError names a bad value."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(settings_cls):  # type: ignore[arg-type]
        raw, source = _given(args, f.name)
        env = f.metadata.get("env")
        if raw is None and env and env in environ:
            raw, source = environ[env], env
        if raw is None:
            continue
        if raw == "" and _optional(settings_cls, f.name):
            values[f.name] = None  # an empty value unsets an optional setting (e.g. ORL_TRAIN_LR=)
            continue
        values[f.name] = _convert(_field_type(settings_cls, f.name), raw, source)
    return settings_cls(**values)


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
    if not isinstance(raw, str):
        return raw
    try:
        if kind is bool:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if kind in (int, float, Path, str):
            return kind(raw)
        if typing.get_origin(kind) is tuple:
            return tuple(part.strip() for part in raw.split(",") if part.strip())
    except ValueError as error:
        raise ConfigError(f"{source}: cannot read {raw!r} as {getattr(kind, '__name__', kind)}") from error
    raise ConfigError(f"{source}: unsupported setting type {kind}")
