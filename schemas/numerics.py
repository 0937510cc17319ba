"""The numerics a torch forward may be asked to run in: a setting of the server, the trainer and the gate,
and compute/machine.py's input. Weights stay fp32 in every one."""

from __future__ import annotations

import typing
from typing import Literal

Precision = Literal["auto", "bf16", "fp32"]  # auto: bf16 autocast where the CPU or GPU runs it natively
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
