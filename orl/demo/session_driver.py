"""The demo's client side: the simulated user's sessions and the held-out evaluation, over HTTP.

Talks to a running `orl serve` like any user would (OpenAI chat completions). A training session is
the user's question, the policy's answer, and the user's scripted reaction sent as the next message
(with `X-Session-Done`), which the pipeline turns into the answer's next state. Evaluation asks the
held-out prompts as side turns (recorded, never judged, never trained on) and scores the first
response with the scenario's scorer.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from dataclasses import dataclass
from typing import Any

import httpx

from orl.demo.scenarios import Scenario
from orl.demo.simulated_user import react
from orl.schemas.errors import OrlError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.7
    max_tokens: int = 96


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of the held-out prompts: per-prompt scores, style and relevance rates, mean words."""

    scores: list[list[float]]
    style: float  # share of answers passing every check but relevance (`ScoreBreakdown.style`)
    relevance: float
    words: float
    examples: list[tuple[str, str]]


class DemoClient:
    def __init__(
        self,
        base_url: str,
        api_key: str,
        admin_key: str,
        sampling: Sampling,
        concurrency: int = 8,
        restate_length: bool = False,
        eval_concurrency: int = 16,
    ):
        self.base_url = base_url.rstrip("/")
        self.sampling = sampling
        self.restate_length = restate_length  # the simulated user's redo repeats the word limit
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self._admin = {"Authorization": f"Bearer {admin_key}"}
        self._limit = asyncio.Semaphore(concurrency)  # a round's sessions
        self._eval_limit = asyncio.Semaphore(eval_concurrency)  # held-out answers: the server's batch
        self._http = httpx.AsyncClient(timeout=600)

    async def close(self) -> None:
        await self._http.aclose()

    async def chat(
        self,
        messages: list[dict[str, str]],
        headers: dict[str, str],
        *,
        seed: int,
        max_tokens: int | None = None,
    ) -> str:
        """The answer's text."""
        return await self._answer(messages, headers, seed, max_tokens, self._limit)

    async def chat_usage(
        self,
        messages: list[dict[str, str]],
        headers: dict[str, str],
        *,
        seed: int,
        max_tokens: int | None = None,
    ) -> int:
        """The number of tokens the server generated for the answer (for benchmarks)."""
        completion = await self._complete(messages, headers, seed, max_tokens, self._limit)
        return int(completion["usage"]["completion_tokens"])

    async def _answer(
        self,
        messages: list[dict[str, str]],
        headers: dict[str, str],
        seed: int,
        max_tokens: int | None,
        limit: asyncio.Semaphore,
    ) -> str:
        completion = await self._complete(messages, headers, seed, max_tokens, limit)
        return str(completion["choices"][0]["message"]["content"] or "")

    async def _complete(
        self,
        messages: list[dict[str, str]],
        headers: dict[str, str],
        seed: int,
        max_tokens: int | None,
        limit: asyncio.Semaphore,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": "orl-policy",
            "messages": messages,
            "seed": seed,
            "temperature": self.sampling.temperature,
            "max_tokens": max_tokens or self.sampling.max_tokens,
        }
        async with limit:
            response = await self._http.post(
                f"{self.base_url}/v1/chat/completions", json=body, headers={**self._auth, **headers}
            )
        if response.status_code != 200:
            raise OrlError(
                f"the demo's chat request failed: HTTP {response.status_code} {response.text[:300]}"
            )
        completion: dict[str, Any] = response.json()
        return completion

    async def session(self, scenario: Scenario, prompt: str, session_id: str, seed: int) -> bool:
        """One training session; True if the user was satisfied with the answer."""
        question = [{"role": "user", "content": prompt}]
        answer = await self.chat(question, {"X-Session-Id": session_id}, seed=seed)
        reaction = react(scenario, prompt, answer, random.Random(seed), self.restate_length)
        follow_up = [
            *question,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": reaction.text},
        ]
        # The reply to the reaction is not part of the experiment: one token closes the session.
        await self.chat(
            follow_up, {"X-Session-Id": session_id, "X-Session-Done": "true"}, seed=seed, max_tokens=1
        )
        return reaction.satisfied

    async def sessions(
        self, scenario: Scenario, prompts: list[str], prefix: str, seed: int, seed_label: str
    ) -> int:
        """Run sessions `<prefix>-<i>` concurrently; returns how many users were satisfied.

        Each session's sampling seed comes from (`seed`, `seed_label`, i) only, so a run repeated
        with the same seed sends the same seeds whatever its namespace is called."""
        satisfied = await asyncio.gather(
            *(
                self.session(scenario, prompt, f"{prefix}-{i}", _seed(seed, seed_label, i))
                for i, prompt in enumerate(prompts)
            )
        )
        return sum(satisfied)

    async def evaluate(
        self, scenario: Scenario, prompts: tuple[str, ...], samples_per_prompt: int
    ) -> Evaluation:
        """Score the first response to each held-out prompt, with the same seeds at every evaluation."""

        async def one(prompt: str, j: int) -> tuple[str, str]:
            answer = await self._answer(
                [{"role": "user", "content": prompt}],
                {"X-Turn-Type": "side"},
                _seed(0, prompt, j),
                None,
                self._eval_limit,
            )
            return prompt, answer

        pairs = await asyncio.gather(*(one(p, j) for p in prompts for j in range(samples_per_prompt)))
        breakdowns = [scenario.scorer(p, a) for p, a in pairs]
        scores = [
            [b.score for b in breakdowns[i : i + samples_per_prompt]]
            for i in range(0, len(breakdowns), samples_per_prompt)
        ]
        return Evaluation(
            scores=scores,
            style=sum(b.style for b in breakdowns) / len(breakdowns),
            relevance=sum(b.relevance for b in breakdowns) / len(breakdowns),
            words=sum(b.words for b in breakdowns) / len(breakdowns),
            examples=list(pairs[: min(4, len(pairs))]),
        )

    async def policy_version(self) -> int:
        return int((await self._served_policy())["policy_version"])

    async def run_version(self, run_id: str) -> int:
        """The version of tenant run `run_id` the server answers with (0: none yet, the main policy)."""
        return int((await self._served_policy())["tenant_runs"].get(run_id) or 0)

    async def _served_policy(self) -> dict[str, Any]:
        """GET /admin/policy."""
        response = await self._http.get(f"{self.base_url}/admin/policy", headers=self._admin)
        response.raise_for_status()
        policy: dict[str, Any] = response.json()
        return policy

    async def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            try:
                if (await self._http.get(f"{self.base_url}/readyz")).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
        raise OrlError(f"the demo server at {self.base_url} was not ready after {timeout_s:.0f} s")


def _seed(base: int, label: str, index: int) -> int:
    digest = hashlib.sha256(f"{base}|{label}|{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF
