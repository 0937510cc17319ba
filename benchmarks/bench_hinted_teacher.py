"""How good is the OPD teacher of a demo scenario? The base model with the hint, scored like the policy.

On-Policy Distillation can only pull the policy toward what the teacher (the base model with the
user's hint appended, `orl.pipeline.effects.teacher_stage.messages_with_hint`) would write. If the
teacher itself rarely satisfies the user, no amount of training on its logprobs reaches the target.
This script measures it on a scenario's gate prompts (held out from the sessions), N samples each, with the server's backend:

- base: the base model's answer, scored by the scenario's scorer (the demo's step-0 figure);
- user hint: the base answer goes to the simulated user; when it asks for a redo, the pipeline's own
  extractor (`user_hint`) takes the hint from that reply and the base model answers again with it.
  This is the teacher the pipeline builds (a satisfied answer has no hint, and its base answer counts);
- full hint: the same with the scenario's complete preference (`Scenario.hint`) as the hint.

    .venv/bin/python -m benchmarks.bench_hinted_teacher [--scenarios student,teacher] [--samples 2]

Loads the shipped SmolLM2-135M (converted once into the model cache); writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import time

import torch
from orl.compute.machine import describe_machine
from orl.connectors.settings import ConnectionSettings
from orl.gate.scoring import ScoreBreakdown
from orl.pipeline.effects.reply_rules import user_hint_extractor
from orl.pipeline.effects.teacher_stage import messages_with_hint
from orl.serving.policy.base import SamplingParams
from orl.serving.policy.transformers_backend import TransformersBackend

from orl.demo.scenarios import Scenario, get_scenario
from orl.demo.simulated_user import react
from orl.up import prepare_model_once

TEMPERATURE = 0.7


async def answer(
    backend: TransformersBackend, messages: list[dict[str, str]], seed: int, max_tokens: int
) -> str:
    ids = backend.chat_template.render(messages)
    generation = await backend.generate(
        ids, SamplingParams(temperature=TEMPERATURE, max_tokens=max_tokens, seed=seed)
    )
    return backend.chat_template.decode(generation.token_ids)


async def one_item(
    backend: TransformersBackend, scenario: Scenario, prompt: str, seed: int, max_tokens: int
) -> tuple[ScoreBreakdown, ScoreBreakdown | None, ScoreBreakdown]:
    """(base, user-hint teacher or None when the user was satisfied, full-hint teacher) for one sample."""
    question = [{"role": "user", "content": prompt}]
    base = await answer(backend, question, seed, max_tokens)
    reaction = react(scenario, prompt, base, random.Random(seed))
    _, hint, _ = user_hint_extractor(question, base, {"role": "user", "content": reaction.text})
    user_hinted = None
    if hint is not None:
        user_hinted = scenario.scorer(
            prompt, await answer(backend, messages_with_hint(question, hint), seed, max_tokens)
        )
    full = await answer(backend, messages_with_hint(question, scenario.hint), seed, max_tokens)
    return scenario.scorer(prompt, base), user_hinted, scenario.scorer(prompt, full)


async def measure(
    backend: TransformersBackend, scenario: Scenario, samples: int, max_tokens: int
) -> list[str]:
    """Markdown rows: base, user-hint teacher and full-hint teacher scores, and what their answers miss."""
    items = await asyncio.gather(
        *(
            one_item(backend, scenario, prompt, 1000 * j + scenario.prompts.index(prompt), max_tokens)
            for prompt in scenario.gate_prompts
            for j in range(samples)
        )
    )
    # A satisfied base answer gets no hint: the pipeline's teacher is then not asked, and the answer counts as is.
    kinds = {
        "base": [base for base, _, _ in items],
        "user hint": [user if user is not None else base for base, user, _ in items],
        "full hint": [full for _, _, full in items],
    }
    rows = []
    for kind, breakdowns in kinds.items():
        missed = collections.Counter(v for b in breakdowns for v in b.violations)
        miss = ", ".join(f"{v} {n}" for v, n in missed.most_common()) or "-"
        score = sum(b.score for b in breakdowns) / len(breakdowns)
        rows.append(f"| {scenario.name} | {kind} | {score:.2f} | {miss} |")
    redo = sum(user is not None for _, user, _ in items)
    rows.append(f"| {scenario.name} | (base answers the user asked to redo) | {redo} of {len(items)} | |")
    return rows


async def main_async(args: argparse.Namespace) -> None:
    model_dir = prepare_model_once(ConnectionSettings())
    backend = TransformersBackend(
        model_dir, autocast_dtype=torch.bfloat16 if args.precision == "bf16" else None
    )
    await backend.start()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {describe_machine()}, {args.precision}")
    print("| scenario | teacher | score | what its answers miss (count) |\n|---|---|---|---|")
    try:
        for name in args.scenarios.split(","):
            started = time.perf_counter()
            for row in await measure(backend, get_scenario(name.strip()), args.samples, args.max_tokens):
                print(row, flush=True)
            print(f"({name}: {time.perf_counter() - started:.0f} s)", flush=True)
    finally:
        await backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default="student,teacher")
    parser.add_argument("--samples", type=int, default=2, help="answers per gate prompt")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
