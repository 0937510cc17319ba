"""`orl gate`'s command: the gate's runner, with the demo's scenarios as its optional prompt source.

`--gate-scenario student` evaluates on that scenario's gate prompts (disjoint from the sessions' and from
the demo's evaluation prompts, `orl.demo.scenarios`), and the scenario's
simulated user replies to each answer (seeded by prompt and sample), so the demo's rule judge
scores the gate's answers as it scores live ones. Without it the gate reads held-out sessions
from the log (`orl.gate.runner`).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from orl.demo.scenarios import get_scenario
from orl.demo.simulated_user import react
from orl.gate.runner import HeldOutPrompt, NextState, PromptSource, run_gate_loop
from orl.gate.settings import GateSettings


def scenario_user(name: str) -> NextState:
    """The demo scenario's simulated user replying to an answer (seeded by prompt and sample)."""
    scenario = get_scenario(name)

    def reply(prompt: HeldOutPrompt, answer: str, sample_index: int) -> dict[str, Any]:
        rng = random.Random(f"{prompt.prompt_id}/{sample_index}")
        return {"role": "user", "content": react(scenario, prompt.text, answer, rng).text}

    return reply


def scenario_prompts(name: str, count: int) -> list[HeldOutPrompt]:
    """The first `count` of the scenario's gate prompts, as the gate asks them."""
    prompts = get_scenario(name).gate_prompts[:count]
    return [HeldOutPrompt(f"{name}:{i}", [{"role": "user", "content": p}]) for i, p in enumerate(prompts)]


def scenario_source(name: str) -> PromptSource:
    """The scenario's gate prompts and simulated user; ConfigError for an unknown scenario."""
    get_scenario(name)
    return PromptSource(lambda count: scenario_prompts(name, count), scenario_user(name))


def gate_source(settings: GateSettings) -> PromptSource | None:
    """The prompt source `--gate-scenario` names (None: held-out sessions of the log)."""
    return scenario_source(settings.gate_scenario) if settings.gate_scenario else None


def run_gate(settings: GateSettings) -> int:
    asyncio.run(run_gate_loop(settings, source=gate_source(settings)))
    return 0
