"""The teacher effect stage: logprobs of the exact response tokens under the hint-enhanced prompt.

Reads: requests, responses (to remember each turn), hints (HintSelected). Writes: teacher_scores
(TeacherScored). The teacher context is the turn's original messages with the hint appended to the
last user message; the scoring call is the server's POST /v1/orl/score, which renders that context
with the policy's chat template and scores the response suffix only. `teacher_kind` picks the
teacher: "frozen_reference" (the base model plus the hint; what OpenClaw-RL's never-updated PRM
engine actually is) or "live_policy" (the served policy plus the hint). The default is the frozen
reference: in the CPU prototype OPD with the live teacher collapsed at LoRA lr 5e-4 while the frozen
teacher did not (shared/reference/learnability.md). With `top_k` > 0 (`--opd-topk`, ORL_OPD_TOPK) the
call also asks for each response position's K most likely token ids and their logprobs, recorded as
`teacher_top_ids` / `teacher_top_logprobs` for top-K distillation (OpenClaw-RL's --distill-topk).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
from orl.pipeline.effects.contract import EffectCall, PlanResult
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import (
    Event,
    event_id_of,
    event_type_of,
    turn_id_of,
)
from orl.pipeline.processors.state_codec import StateCodec
from orl.pipeline.processors.turn_memory import (
    TURN_MEMORY_STATE,
    TurnMemory,
    add_trigger,
    forget_if_idle,
    remember_turn_event,
    seen_first,
    take_ready_triggers,
)
from orl.schemas.event_constructors import teacher_scored
from orl.schemas.event_types import Envelope, HintSelected
from orl.schemas.events import EventOrigin
from orl.schemas.messages import content_text

logger = logging.getLogger(__name__)
PRODUCER = "pipeline.teacher/1"
RETENTION_MS = 6 * 3600 * 1000
HINT_HEADER = "\n\n[user's hint / instruction]\n"


def messages_with_hint(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The teacher context: a copy of the messages with the hint appended to the last user message."""
    enhanced = copy.deepcopy(messages)
    for message in reversed(enhanced):
        if message.get("role") == "user":
            message["content"] = content_text(message.get("content")) + HINT_HEADER + hint
            return enhanced
    return [*enhanced, {"role": "user", "content": HINT_HEADER.lstrip() + hint}]


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _numbers(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    )


def teacher_reply(data: Any, response_tokens: int) -> dict[str, Any]:
    """The server's scoring reply, checked against what a TeacherScored event needs; ValueError
    naming what is wrong (so a misbehaving endpoint fails this turn's scoring, never the process)."""
    if not isinstance(data, dict):
        raise ValueError(f"not a JSON object: {str(data)[:200]}")
    if not _ints(data.get("prompt_token_ids")):
        raise ValueError("prompt_token_ids is not a list of token ids")
    logprobs = data.get("logprobs")
    if not (isinstance(logprobs, list) and _numbers(logprobs) and len(logprobs) == response_tokens):
        raise ValueError(f"logprobs is not {response_tokens} numbers (one per response token)")
    version = data.get("policy_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"policy_version {version!r} is not a version number")
    for name, check in (("top_ids", _ints), ("top_logprobs", _numbers)):
        rows = data.get(name)
        if rows is not None and not (
            isinstance(rows, list) and len(rows) == response_tokens and all(check(row) for row in rows)
        ):
            raise ValueError(f"{name} is not one list per response token")
    return data


@dataclass
class TeacherStage:
    server_url: str
    api_key: str
    teacher_kind: str = "frozen_reference"
    top_k: int = 0  # 0: token-level teacher logprobs only
    timeout_s: float = 120.0
    retries: int = 3
    name: str = "teacher"
    inputs: tuple[str, ...] = ("requests", "responses", "hints")
    outputs: tuple[str, ...] = ("teacher_scores",)
    state_codec: StateCodec = TURN_MEMORY_STATE
    failures: int = 0
    _client: httpx.AsyncClient | None = field(default=None, repr=False)

    def plan(self, state: TurnMemory | None, event: Event, config: PipelineConfig) -> PlanResult:
        memory = seen_first(state, event, config.seen_window)
        if memory is None:
            return state, []  # redelivered
        turn_id = turn_id_of(event)
        if event_type_of(event) == "HintSelected" and turn_id is not None:
            selected = cast(HintSelected, event)
            trigger = {
                "hint": selected["hint"],
                "hint_event_id": event_id_of(selected),
                "envelope": selected["envelope"],
            }
            memory = add_trigger(memory, turn_id, trigger)
        else:
            memory = remember_turn_event(memory, event)
        memory, turn, hints = take_ready_triggers(memory, turn_id)
        return memory, [EffectCall("teacher", {"turn": turn, **hint}) for hint in hints]

    def on_tick(
        self, state: TurnMemory, now_ms: int, config: PipelineConfig
    ) -> tuple[TurnMemory | None, list[Emit]]:
        return forget_if_idle(state, now_ms, RETENTION_MS), []

    async def perform(self, call: EffectCall) -> list[Emit]:
        turn, hint = call.payload["turn"], call.payload["hint"]
        envelope: Envelope = call.payload["envelope"]  # the HintSelected's, kept in the trigger
        body = {
            "messages": messages_with_hint(turn["messages"], hint),
            "tools": turn.get("tools"),
            "response_token_ids": turn["response_token_ids"],
            "temperature": turn["temperature"],
            "use_base": self.teacher_kind == "frozen_reference",
        }
        if self.top_k:
            body["top_k"] = self.top_k
        scored = await self._score(body)
        if scored is None:
            # No event: the sample builder's settle timeout rejects the turn, and the failure is counted.
            self.failures += 1
            return []
        origin = EventOrigin(
            namespace=envelope["namespace"],
            producer=PRODUCER,
            occurred_at_ms=envelope["occurred_at"],
            # top_k only when set: token-level events keep the ids they always had
            id_parts=(
                call.payload["hint_event_id"],
                self.teacher_kind,
                *((str(self.top_k),) if self.top_k else ()),
            ),
            session_id=envelope["session_id"],
            turn_id=envelope["turn_id"],
        )
        event = teacher_scored(
            origin,
            hint_event_id=call.payload["hint_event_id"],
            teacher_kind=self.teacher_kind,
            teacher_prompt_token_ids=scored["prompt_token_ids"],
            response_token_ids=turn["response_token_ids"],
            teacher_logprobs=scored["logprobs"],
            policy_version=int(scored["policy_version"]),
            temperature=turn["temperature"],
            teacher_top_ids=scored.get("top_ids") if self.top_k else None,
            teacher_top_logprobs=scored.get("top_logprobs") if self.top_k else None,
        )
        if self.top_k and event["teacher_top_ids"] is None:
            # A server without top_k support: the turn still trains, token-level (the trainer falls back).
            logger.warning("teacher server ignored top_k=%d for turn %s", self.top_k, envelope["turn_id"])
        return [Emit("teacher_scores", dict(event))]

    async def _score(self, body: dict[str, Any]) -> dict[str, Any] | None:
        url = f"{self.server_url.rstrip('/')}/orl/score"
        headers = {"Authorization": f"Bearer {self.api_key}"}
        for attempt in range(self.retries + 1):
            try:
                response = await self._http().post(url, json=body, headers=headers, timeout=self.timeout_s)
                if response.status_code == 200:
                    return teacher_reply(response.json(), len(body["response_token_ids"]))
                logger.warning(
                    "teacher scoring failed: HTTP %d %s", response.status_code, response.text[:300]
                )
                if response.status_code < 500:
                    return None  # our request is wrong: retrying will not help
            except ValueError as error:  # not JSON, or not the scoring reply: retrying will not help
                logger.warning("teacher scoring failed: the reply is malformed (%s)", error)
                return None
            except httpx.HTTPError as error:
                logger.warning(
                    "teacher scoring failed (%s: %s), attempt %d", type(error).__name__, error, attempt + 1
                )
            await asyncio.sleep(min(5.0, 0.5 * 2**attempt))
        return None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient()
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
