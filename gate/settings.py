"""Settings of `orl gate` (every field is a flag and an environment variable): the pipeline's judge
settings (the run's own judge) and the gate's. Kept apart from gate/runner.py, which imports torch, so
that reading a config file or `orl gate --help` does not."""

from __future__ import annotations

from dataclasses import dataclass

from orl.connectors.settings import (
    HoldoutSettings,
    PrecisionSettings,
    RunSettings,
    TenantSettings,
    ThreadSettings,
    setting,
)
from orl.pipeline.runtime.settings import PipelineSettings


@dataclass(frozen=True)
class GateSettings(
    PipelineSettings, RunSettings, TenantSettings, PrecisionSettings, ThreadSettings, HoldoutSettings
):
    """The pipeline's judge settings (the run's own judge) and the gate's."""

    gate_prompts: int = setting(16, "ORL_GATE_PROMPTS", "Held-out prompts per evaluation (the newest).")
    gate_samples: int = setting(2, "ORL_GATE_SAMPLES", "Answers per prompt and version (paired seeds).")
    gate_margin: float = setting(
        0.1,
        "ORL_GATE_MARGIN",
        "How far below the promoted version a candidate's approval or relevance may fall and still be promoted.",
    )
    gate_scenario: str = setting(
        "",
        "ORL_GATE_SCENARIO",
        "Evaluate on a demo scenario's gate prompts (which its sessions and the demo's evaluation never ask) "
        "with its simulated user (student | teacher; empty: held-out sessions of the log).",
    )
    gate_max_tokens: int = setting(
        128, "ORL_GATE_MAX_TOKENS", "Longest answer the gate generates.", advanced=True
    )
    gate_seed: int = setting(
        0, "ORL_GATE_SEED", "Seed of the gate's sampling (with the prompt and sample index).", advanced=True
    )
    gate_temperature: float = setting(
        0.7, "ORL_GATE_TEMPERATURE", "Sampling temperature of the gate's answers.", advanced=True
    )
