"""Sampling rules the server and the trainer must agree on, or the trainer's logprobs would not be
those the server sampled from."""

from __future__ import annotations


def effective_temperature(temperature: float) -> float:
    """The temperature logprobs are taken at: the sampled one, and T = 1 for greedy decoding (T = 0)."""
    return temperature if temperature > 0 else 1.0
