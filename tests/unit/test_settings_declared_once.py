"""Each setting has one declaration: no two settings classes declare the same environment variable.

Deployables compose their settings from shared groups (`ConnectionSettings`, `RunSettings`,
`ServerClientSettings`, `PrecisionSettings`, `ThreadSettings`, `ServerAccessSettings`, `StackSettings`,
`SignalSettings`, `JudgeEndpointSettings`, `HoldoutSettings`, ...), so a setting two commands need is
inherited, not re-declared (issue 45: the last one declared twice, ORL_HOLDOUT_SHARE, is shared since
stop 57, its default resolved by `HoldoutSettings.held_out`).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from orl.cli import settings_of_every_command


def declaring_classes() -> dict[str, set[str]]:
    """Environment variable -> the settings classes that declare (not inherit) a field bound to it."""
    declared: dict[str, set[str]] = defaultdict(set)
    for cls in settings_of_every_command().values():
        for f in dataclasses.fields(cls):
            if env := f.metadata.get("env"):
                owner = next(c for c in cls.__mro__ if f.name in c.__dict__.get("__annotations__", {}))
                declared[env].add(f"{owner.__module__}.{owner.__qualname__}")
    return declared


def test_no_two_settings_classes_declare_the_same_environment_variable() -> None:
    twice = {env: sorted(owners) for env, owners in declaring_classes().items() if len(owners) > 1}
    assert not twice, f"declared in more than one settings class (compose a shared group instead): {twice}"
