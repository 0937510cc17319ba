"""The trainer's side of the core board: its torch threads follow the fair share layer by layer.

A training step on a CPU runs for seconds per phase (forwards, backward). Re-fitting the threads
only between phases left the trainer on every core for seconds after a server on the same machine
started generating, with more threads than cores. Hooks on every decoder layer re-fit them before
each layer's forward and before its backward (a hook on the layer's output gradient), so the share
changes within one layer's time. Reads and writes nothing but the board (`orl.compute.machine`).
"""

from __future__ import annotations

from typing import Any

from orl.compute.machine import CoreBoard
from torch import Tensor, nn


def fit_threads_every_layer(module: nn.Module, board: CoreBoard) -> int:
    """Install the hooks on every `*DecoderLayer` of `module`; returns how many layers got them."""

    def before_forward(layer: nn.Module, args: Any) -> None:
        board.fit_threads()

    def before_backward(grad: Tensor) -> None:
        board.fit_threads()

    def after_forward(layer: nn.Module, args: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        if isinstance(hidden, Tensor) and hidden.requires_grad:
            hidden.register_hook(before_backward)

    layers = [m for m in module.modules() if type(m).__name__.endswith("DecoderLayer")]
    for layer in layers:
        layer.register_forward_pre_hook(before_forward)
        layer.register_forward_hook(after_forward)
    return len(layers)
