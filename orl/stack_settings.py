"""The settings of a whole stack on one machine, shared by `orl up` and `orl demo`: the cores its torch
processes share and whether the promotion gate runs. Declared once here."""

from __future__ import annotations

from dataclasses import dataclass

from orl.connectors.settings import setting


@dataclass(frozen=True)
class StackSettings:
    cores: int = setting(
        0,
        "ORL_CORES",
        "CPU cores the stack's torch processes share (0: every core this process may use). Each uses them "
        "all while it computes alone, a fair share while others compute.",
    )
    gate: bool = setting(
        True,
        "ORL_GATE",
        "Promotion gate (--no-gate: off): `orl gate` scores every trained version against the served one on "
        "held-out prompts before servers may serve it; a held version is never served, the trainer goes back "
        "to the promoted weights, and the trainer never trains on the held-out sessions.",
    )
