"""The judge effect stage: each reward judge's m votes and the hint judge's m votes on every next state of a main turn.

Reads: requests, responses (to remember each turn), next_states. Writes: judge_votes
(JudgeVoteCast), hints (HintVoteCast). An LLM judge is any OpenAI-compatible chat endpoint (by
default orl's own server; its calls are marked as side turns so they never become samples); a rule
judge is a Python callable found by name (`orl.pipeline.effects.rule_judges`). Each vote records what the
judge saw (prompt text and hash), how it sampled (seed), its raw words and the parsed score, or
why it failed: a failing judge yields failed votes, never silence.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
from orl.connectors.metrics import Metrics
from orl.pipeline.effects.contract import EffectCall, PlanResult
from orl.pipeline.effects.judging import (
    JudgeConfig,
    ParseWatch,
    build_hint_judge_messages,
    build_reward_judge_messages,
    judge_user_message,
    parse_hint_vote,
    parse_reward_vote,
    vote_seed,
)
from orl.pipeline.effects.rule_judges import HintExtractor, RuleJudge
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit
from orl.pipeline.processors.event_building import (
    Event,
    event_id_of,
    event_type_of,
    occurred_at_of,
    session_id_of,
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
from orl.schemas.errors import ConfigError
from orl.schemas.event_constructors import hint_vote_cast, judge_vote_cast
from orl.schemas.event_types import NextStateObserved, SamplingParams
from orl.schemas.events import EventOrigin
from orl.schemas.ids import side_session

logger = logging.getLogger(__name__)
PRODUCER = "pipeline.judge/1"
RETENTION_MS = 6 * 3600 * 1000
RULE_TIMEOUT_S = 30.0
HINT = "hint"  # the hint judge's key among the config versions (reward judges are keyed by judge id)
INLINE_RULE_CPU_S = 0.01
INLINE_RULE_WALL_S = 0.1


def chat_reply(data: Any) -> tuple[str, dict[str, int]]:
    """(the message's text, its token usage) from a chat completion body; a ValueError for any other
    shape, so that a misbehaving endpoint gives a failed vote (with the reason), never a crash. A
    usage of the wrong shape is left out (it only feeds the vote's token counts). ValueError names
    what is wrong."""
    try:
        content = data["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError) as error:
        raise ValueError(f"not a chat completion: {str(data)[:200]}") from error
    if content is not None and not isinstance(content, str):
        raise ValueError(f"message content is {type(content).__name__}, not text")
    usage = data.get("usage") if isinstance(data, dict) else None
    counts = {}
    if isinstance(usage, dict):
        for name in ("prompt_tokens", "completion_tokens"):
            value = usage.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31:
                counts[name] = value
    return content or "", counts


@dataclass
class JudgeStage:
    """Every reward judge casts its votes on every next state (several judges at once: e.g. an LLM
    process judge and the `outcome` rule judge), the hint judge its hint votes. A rule judge's
    callable is in `rule_judges` under its judge id."""

    reward_judges: tuple[JudgeConfig, ...]
    hint_judge: JudgeConfig | None
    api_key: str = ""
    rule_judges: dict[str, RuleJudge] = field(default_factory=dict)
    hint_extractor: HintExtractor | None = None
    concurrency: int = 4
    name: str = "judge"
    inputs: tuple[str, ...] = ("requests", "responses", "next_states")
    outputs: tuple[str, ...] = ("judge_votes", "hints")
    state_codec: StateCodec = TURN_MEMORY_STATE  # the judge keeps no token ids (remember_turn_event)
    _client: httpx.AsyncClient | None = field(default=None, repr=False)
    # Rule judges run inline until one call is slow (see _rule_vote); the versions are hashed once.
    _rule_inline: bool = field(default=True, repr=False)
    _config_versions: dict[str, str] = field(default_factory=dict, repr=False)
    # per LLM judge id: how many of its votes failed to parse (a log warning when most of the recent do)
    parse_watches: dict[str, ParseWatch] = field(default_factory=dict, repr=False)
    # judge_votes{judge_id, parsed} and judge_recent_unparsed_fraction{judge_id} (the last 20 LLM votes)
    metrics: Metrics = field(default_factory=Metrics, repr=False)

    def __post_init__(self) -> None:
        ids = [judge.judge_id for judge in self.reward_judges]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"reward judges need distinct ids; got {ids}")
        for judge in self.reward_judges:
            if judge.kind == "rule" and judge.judge_id not in self.rule_judges:
                raise ConfigError(f"rule judge {judge.judge_id!r} has no callable in rule_judges")
            self._config_versions[judge.judge_id] = judge.config_version
        if self.hint_judge is not None:
            self._config_versions[HINT] = self.hint_judge.config_version

    def plan(self, state: TurnMemory | None, event: Event, config: PipelineConfig) -> PlanResult:
        memory = seen_first(state, event, config.seen_window)
        if memory is None:
            return state, []  # redelivered
        turn_id = turn_id_of(event)
        if event_type_of(event) == "NextStateObserved" and turn_id is not None:
            memory = add_trigger(memory, turn_id, _next_state_view(cast(NextStateObserved, event)))
        else:
            memory = remember_turn_event(memory, event, keep_tokens=False)
        # A side turn's request is never remembered: its next states wait until retention drops them.
        memory, turn, next_states = take_ready_triggers(memory, turn_id)
        judges = [("reward", judge) for judge in self.reward_judges]
        if self.hint_judge is not None:
            judges.append(("hint", self.hint_judge))
        calls = [
            EffectCall(
                purpose,
                {"turn": turn, "next_state": next_state, "vote_index": index, "judge_id": judge.judge_id},
            )
            for next_state in next_states
            for purpose, judge in judges
            for index in range(judge.m)
        ]
        return memory, calls

    def on_tick(
        self, state: TurnMemory, now_ms: int, config: PipelineConfig
    ) -> tuple[TurnMemory | None, list[Emit]]:
        return forget_if_idle(state, now_ms, RETENTION_MS), []

    async def perform(self, call: EffectCall) -> list[Emit]:
        judge = self._judge(call.kind, call.payload["judge_id"])
        turn, next_state, index = call.payload["turn"], call.payload["next_state"], call.payload["vote_index"]
        seed = vote_seed(next_state["turn_id"], index, judge.seed_base)
        started = time.perf_counter()
        if judge.kind == "rule":
            prompt_text = judge_user_message(turn["messages"], turn["response_text"], next_state)
            raw, usage = await self._rule_vote(call.kind, judge.judge_id, turn, next_state)
        else:
            builder = build_reward_judge_messages if call.kind == "reward" else build_hint_judge_messages
            messages = builder(turn["messages"], turn["response_text"], next_state)
            prompt_text = json.dumps(messages, ensure_ascii=False)
            raw, usage = await self._llm_vote(
                judge, messages, seed, side_session(next_state["session_id"], "judge")
            )
        latency_ms = (time.perf_counter() - started) * 1000
        return [
            self._vote_event(call.kind, judge, next_state, index, seed, prompt_text, raw, usage, latency_ms)
        ]

    async def _llm_vote(
        self, judge: JudgeConfig, messages: list[dict[str, str]], seed: int, session_id: str
    ) -> tuple[str, dict]:
        """The judge's raw words; a failure after the bounded retries is returned as an error marker.
        `session_id` names the call's session (orl's server records it as a side turn there)."""
        body = {
            "model": judge.model or "judge",
            "messages": messages,
            "temperature": judge.temperature,
            "top_p": judge.top_p,
            "max_tokens": judge.max_tokens,
            "seed": seed % (2**31),
        }
        headers = {"X-Turn-Type": "side", "X-Session-Id": session_id}
        if self.api_key:  # an outside judge without a key of its own gets no Authorization header
            headers["Authorization"] = f"Bearer {self.api_key}"
        last_error = ""
        for attempt in range(judge.retries + 1):
            try:
                response = await self._http().post(
                    f"{judge.endpoint_url.rstrip('/')}/chat/completions",
                    json=body,
                    headers=headers,
                    timeout=judge.timeout_s,
                )
                if response.status_code == 200:
                    return chat_reply(response.json())
                last_error = f"HTTP {response.status_code}: {response.text[:300]}"
            except (httpx.HTTPError, ValueError) as error:  # ValueError: not JSON, or no chat completion
                last_error = f"{type(error).__name__}: {error}"
            await asyncio.sleep(min(2.0, 0.2 * 2**attempt))
        return _FAILED + last_error, {}

    def _judge(self, kind: str, judge_id: str) -> JudgeConfig:
        if kind == "hint":
            assert self.hint_judge is not None
            return self.hint_judge
        for judge in self.reward_judges:
            if judge.judge_id == judge_id:
                return judge
        raise ConfigError(
            f"no reward judge {judge_id!r} in this stage (it has {[j.judge_id for j in self.reward_judges]})"
        )

    async def _rule_vote(
        self, kind: str, judge_id: str, turn: dict[str, Any], next_state: dict[str, Any]
    ) -> tuple[str, dict]:
        args = (turn["messages"], turn["response_text"], next_state)
        try:
            if kind == "reward":
                score, explanation = await self._call_rule(self.rule_judges[judge_id], args)
                return json.dumps({"score": score, "explanation": explanation}), {}
            assert self.hint_extractor is not None
            score, hint, explanation = await self._call_rule(self.hint_extractor, args)
            return json.dumps({"score": score, "hint": hint, "explanation": explanation}), {}
        except (
            TimeoutError,
            ValueError,
            TypeError,
            RuntimeError,
        ) as error:  # a plugin failing is a failed vote
            return _FAILED + f"rule judge raised {type(error).__name__}: {error}", {}

    async def _call_rule(self, rule: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """A rule judge's verdict. Inline while rules are fast (a thread hop costs ~50-100 us, a typical
        rule a few us); after one slow call (over INLINE_RULE_CPU_S of CPU, or INLINE_RULE_WALL_S of wall
        time: it waited on something), in a worker thread with a timeout, so a slow plugin cannot stall
        the event loop and with it every stage of the process. CPU time is the main test because wall
        time also counts the time the process was not scheduled on a busy machine."""
        if not self._rule_inline:
            return await asyncio.wait_for(asyncio.to_thread(rule, *args), RULE_TIMEOUT_S)
        started_s, started_cpu_s = time.perf_counter(), time.thread_time()
        result = rule(*args)
        wall_s, cpu_s = time.perf_counter() - started_s, time.thread_time() - started_cpu_s
        if cpu_s > INLINE_RULE_CPU_S or wall_s > INLINE_RULE_WALL_S:
            self._rule_inline = False
            logger.warning(
                "rule judge took %.3f s (%.3f s CPU): later calls run in a worker thread", wall_s, cpu_s
            )
        return result

    def _count_vote(self, judge: JudgeConfig, error: str | None) -> None:
        self.metrics.count(
            "judge_votes", judge_id=judge.judge_id, parsed="false" if error is not None else "true"
        )
        if judge.kind == "llm":
            watch = self.parse_watches.setdefault(judge.judge_id, ParseWatch())
            warning = watch.record(judge.judge_id, error)
            self.metrics.set(
                "judge_recent_unparsed_fraction", watch.recent_fraction(), judge_id=judge.judge_id
            )
            if warning:
                logger.warning(warning)

    def _vote_event(
        self,
        kind: str,
        judge: JudgeConfig,
        next_state: dict[str, Any],
        index: int,
        seed: int,
        prompt_text: str,
        raw: str,
        usage: dict,
        latency_ms: float,
    ) -> Emit:
        score, hint, error = _parse(kind, judge, raw)
        version_key = HINT if kind == "hint" else judge.judge_id
        self._count_vote(judge, error)
        origin = EventOrigin(
            namespace=next_state["namespace"],
            producer=PRODUCER,
            occurred_at_ms=next_state["occurred_at"],
            id_parts=(next_state["event_id"], self._config_versions[version_key], kind, str(index)),
            session_id=next_state["session_id"],
            turn_id=next_state["turn_id"],
        )
        sampling: SamplingParams = {
            "temperature": judge.temperature,
            "top_p": judge.top_p,
            "max_tokens": judge.max_tokens,
            "stop": [],
            "seed": seed,
            "constraint": None,
        }
        prompt_sha256 = hashlib.sha256(prompt_text.encode()).hexdigest()
        prompt_tokens = int(usage.get("prompt_tokens", 0))
        completion_tokens = int(usage.get("completion_tokens", 0))
        if kind == "reward":
            vote = judge_vote_cast(
                origin,
                judge_id=judge.judge_id,
                judge_kind=judge.kind,
                judge_config_version=self._config_versions[version_key],
                model=judge.model or None,
                model_version=None,
                vote_index=index,
                prompt_sha256=prompt_sha256,
                prompt_text=prompt_text,
                sampling=sampling,
                raw_output=raw,
                score=score,
                parse_error=error,
                latency_ms=latency_ms,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                next_state_event_id=next_state["event_id"],
            )
            return Emit("judge_votes", dict(vote))
        hint_vote = hint_vote_cast(
            origin,
            judge_id=judge.judge_id,
            judge_kind=judge.kind,
            judge_config_version=self._config_versions[version_key],
            model=judge.model or None,
            model_version=None,
            vote_index=index,
            prompt_sha256=prompt_sha256,
            prompt_text=prompt_text,
            sampling=sampling,
            raw_output=raw,
            score=score,
            parse_error=error,
            latency_ms=latency_ms,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            next_state_event_id=next_state["event_id"],
            hint=hint,
        )
        return Emit("hints", dict(hint_vote))

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(limits=httpx.Limits(max_connections=self.concurrency))
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


_FAILED = "[judge call failed] "


def _parse(kind: str, judge: JudgeConfig, raw: str) -> tuple[int | None, str | None, str | None]:
    if raw.startswith(_FAILED):
        return None, None, raw[len(_FAILED) :]
    if judge.kind == "rule":
        verdict = json.loads(raw)
        score = verdict.get("score")
        valid = (-1, 0, 1) if kind == "reward" else (-1, 1)
        error = None if score in valid else f"rule judge returned score {score!r}"
        return (score if error is None else None), verdict.get("hint"), error
    if kind == "reward":
        score, error = parse_reward_vote(raw)
        return score, None, error
    return parse_hint_vote(raw)


def _next_state_view(event: NextStateObserved) -> dict[str, Any]:
    """The next state as judges and vote events need it (JSON-serialisable)."""
    return {
        "event_id": event_id_of(event),
        "namespace": event["envelope"]["namespace"],
        "session_id": session_id_of(event),
        "turn_id": turn_id_of(event),
        "occurred_at": occurred_at_of(event),
        "role": event["role"],
        "content": event["content"],
        "source": event["source"],
        "outcome": event.get("outcome"),
    }
