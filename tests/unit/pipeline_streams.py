"""Helpers for pipeline tests: realistic event streams, and a tiny in-memory driver of the processors.

`Conversation` plays an OpenAI client talking to orl's server and records the events serving
would write (RequestReceived, ResponseGenerated, SessionClosed). The vote / hint / teacher builders
play the judge and teacher effect stages. `run_processor` feeds events to one processor;
`PipelineDriver` routes every emit to the stages that read its topic (per orl.pipeline.processors.topology),
with scripted judge and teacher effects, so a recorded stream can run end to end without a runtime.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from orl.pipeline.effects.judging import (
    build_hint_judge_messages,
    build_reward_judge_messages,
    parse_hint_vote,
    parse_reward_vote,
)
from orl.pipeline.effects.rule_judges import outcome_judge
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Emit, Processor
from orl.pipeline.processors.event_building import (
    Event,
    event_type_of,
    occurred_at_of,
    session_id_of,
    turn_id_of,
)
from orl.pipeline.processors.next_state_text import render_response
from orl.pipeline.processors.registry import PURE_PROCESSORS
from orl.pipeline.processors.topology import STAGES
from orl.schemas.events import make_event
from orl.schemas.topics import record_key, topic_for_event

NAMESPACE = "test"
SERVING = "serving/0.1.0"
JUDGE = "pipeline.judge/1"
T0_MS = 1_700_000_000_000


def sampling(temperature: float = 0.7) -> dict[str, Any]:
    return {
        "temperature": temperature,
        "top_p": 1.0,
        "max_tokens": 512,
        "stop": [],
        "seed": None,
        "constraint": None,
    }


def token_ids(text: str) -> list[int]:
    """A stand-in tokenizer: one id per word, stable across runs."""
    return [int(hashlib.sha256(word.encode()).hexdigest()[:6], 16) % 50000 for word in text.split()] or []


def logprobs_for(ids: list[int]) -> list[float]:
    return [-0.05 - (token % 7) / 10 for token in ids]


@dataclass
class Turn:
    turn_id: str
    request: Event
    response: Event | None


@dataclass
class Conversation:
    """One session as a client drives it; `events` collects what serving would write, in order."""

    session_id: str
    namespace: str = NAMESPACE
    now_ms: int = T0_MS
    messages: list[dict[str, Any]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    turn_count: int = 0
    last_main_turn_id: str | None = None
    group_id: str | None = None  # a rollout group (X-Group-Id / X-Group-Size), carried on every request
    group_size: int | None = None

    def tick(self, ms: int = 1000) -> int:
        self.now_ms += ms
        return self.now_ms

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def tool_result(self, call_id: str, text: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def turn(
        self,
        response_text: str,
        *,
        kind: str = "main",
        tool_calls: list[dict[str, Any]] | None = None,
        temperature: float = 0.7,
        policy_version: int = 0,
        respond: bool = True,
        emit: bool = True,
    ) -> Turn:
        """One LLM call: a request with the messages so far and (if `respond`) its response.

        A side turn (memory flush) sends its own messages and does not change the conversation.
        """
        index = self.turn_count
        self.turn_count += 1
        turn_id = f"{self.session_id}-t{index}"
        messages = (
            list(self.messages) if kind == "main" else [{"role": "user", "content": "summarise memory"}]
        )
        request = request_event(self, turn_id, index, messages, kind, temperature)
        response = None
        if respond:
            response = response_event(self, turn_id, request["request_id"], messages, response_text, tool_calls,
                                      temperature, policy_version)  # fmt: skip
        if kind == "main":
            self.last_main_turn_id = turn_id
        if kind == "main" and respond:
            assistant: dict[str, Any] = {"role": "assistant", "content": response_text}
            if tool_calls:
                assistant["tool_calls"] = tool_calls
            self.messages.append(assistant)
        if emit:
            self.events.extend(event for event in (request, response) if event is not None)
        return Turn(turn_id, request, response)

    def verdict(self, reward: float, turn_id: str | None = None) -> Event:
        """A connector's task verdict (outcome kind "task") on the last main turn, as an agent posts it."""
        turn_id = turn_id or self.last_main_turn_id
        event = make_event(
            "NextStateObserved", namespace=self.namespace, producer="serving/0.1.0", occurred_at_ms=self.tick(),
            id_parts=(self.session_id, "verdict", reward), session_id=self.session_id, turn_id=turn_id,
            source="connector:task", role="environment", content=f"task verdict: reward {reward:+g}",
            messages_json=None, outcome={"kind": "task", "reward": reward, "exit_code": None, "passed": None,
                                         "failed": None, "errors": None, "thumbs": None, "detail_json": None},
        )  # fmt: skip
        self.events.append(event)
        return event

    def close(self, last_turn_id: str | None = None, *, name_last_turn: bool = True) -> Event:
        """SessionClosed as serving writes it: naming the session's last main turn unless told not to."""
        if last_turn_id is None and name_last_turn:
            last_turn_id = self.last_main_turn_id
        event = make_event(
            "SessionClosed", namespace=self.namespace, producer=SERVING, occurred_at_ms=self.tick(),
            id_parts=(self.session_id, "explicit"), session_id=self.session_id, reason="explicit",
            last_turn_id=last_turn_id,
        )  # fmt: skip
        self.events.append(event)
        return event


def task_session(
    session_id: str,
    process: list[list[str]],
    outcome: float | None,
    group: tuple[str, int] | None = None,
    namespace: str = NAMESPACE,
) -> Conversation:
    """A tool-using session: one calculator call per step but the last, which answers; then the verdict."""
    c = Conversation(
        session_id, namespace, group_id=group[0] if group else None, group_size=group[1] if group else None
    )
    c.say("What is (2 + 3) * 4?")
    for index in range(len(process) - 1):
        call_id = f"{session_id}-call{index}"
        c.turn("", tool_calls=[tool_call(call_id, "calculate", {"expression": "(2 + 3) * 4"})])
        c.tool_result(call_id, "20")
    c.turn("The answer is 20.")
    if outcome is not None:
        c.verdict(outcome)
    c.close()
    return c


def request_event(
    conversation: Conversation, turn_id: str, index: int, messages: list[Any], kind: str, temperature: float
) -> Event:
    request_id = f"req-{turn_id}"
    return make_event(
        "RequestReceived", namespace=conversation.namespace, producer=SERVING,
        occurred_at_ms=conversation.tick(), id_parts=(request_id,), session_id=conversation.session_id,
        turn_id=turn_id, request_id=request_id, turn_kind=kind, turn_index=index, previous_turn_id=None,
        link_method="header", messages_json=json.dumps(messages), tools_json=None, tool_choice_json=None,
        sampling=sampling(temperature), model="smollm2", stream=False, client_id=None,
        group_id=conversation.group_id, group_size=conversation.group_size,
    )  # fmt: skip


def response_event(
    conversation: Conversation, turn_id: str, request_id: str, messages: list[Any], text: str,
    tool_calls: list[dict[str, Any]] | None, temperature: float, policy_version: int,
) -> Event:  # fmt: skip
    prompt_ids = token_ids(" ".join(str(m.get("content")) for m in messages))
    response_ids = token_ids(
        text + (" " + json.dumps(tool_calls) if tool_calls else "")
    )  # tool-call markup is tokens too
    return make_event(
        "ResponseGenerated", namespace=conversation.namespace, producer=SERVING,
        occurred_at_ms=conversation.tick(), id_parts=(request_id, "response"), session_id=conversation.session_id,
        turn_id=turn_id, request_id=request_id, prompt_token_ids=prompt_ids, response_token_ids=response_ids,
        response_logprobs=logprobs_for(response_ids), response_text=text,
        tool_calls_json=json.dumps(tool_calls) if tool_calls else None,
        finish_reason="tool_calls" if tool_calls else "stop", sampling=sampling(temperature),
        policy_version=policy_version, policy_spans=[], latency_ms=12.5, prompt_tokens=len(prompt_ids),
        completion_tokens=len(response_ids), model="smollm2", policy_run="live",
    )  # fmt: skip


def tool_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def vote_event(
    next_state: Event, vote_index: int, raw_output: str, *, hint_vote: bool = False,
    judge_kind: str = "llm", judge_id: str = "prm", prompt_text: str = "prompt",
) -> Event:  # fmt: skip
    """A JudgeVoteCast (or HintVoteCast) on `next_state`, its score parsed from `raw_output`."""
    fields: dict[str, Any] = {}
    if hint_vote:
        score, hint, error = parse_hint_vote(raw_output)
        fields["hint"] = hint
    else:
        score, error = parse_reward_vote(raw_output)
    return make_event(
        "HintVoteCast" if hint_vote else "JudgeVoteCast", namespace=next_state["envelope"]["namespace"],
        producer=JUDGE, occurred_at_ms=occurred_at_of(next_state) + 100 + vote_index,
        id_parts=(next_state["envelope"]["event_id"], judge_id, "cfg-1", vote_index),
        session_id=session_id_of(next_state), turn_id=turn_id_of(next_state), judge_id=judge_id,
        judge_kind=judge_kind, judge_config_version="cfg-1", model="judge-model", model_version="1",
        vote_index=vote_index, prompt_sha256=hashlib.sha256(prompt_text.encode()).hexdigest(),
        prompt_text=prompt_text, sampling=sampling(0.6), raw_output=raw_output, score=score, parse_error=error,
        latency_ms=50.0, prompt_tokens=100, completion_tokens=20,
        next_state_event_id=next_state["envelope"]["event_id"], **fields,
    )  # fmt: skip


def teacher_event(
    hint_selected: Event,
    response: Event,
    *,
    shift: float = 0.3,
    kind: str = "frozen_reference",
    top_k: int = 0,
) -> Event:
    """The teacher's scores: the response logprobs shifted; with `top_k`, per position the sampled token
    first (at its teacher logprob) and top_k - 1 neighbouring ids one nat apart each."""
    logprobs = [lp + shift for lp in response["response_logprobs"]]
    top_ids = [[token + j for j in range(top_k)] for token in response["response_token_ids"]]
    top_logprobs = [[lp - j for j in range(top_k)] for lp in logprobs]
    return make_event(
        "TeacherScored", namespace=hint_selected["envelope"]["namespace"], producer="pipeline.teacher/1",
        occurred_at_ms=occurred_at_of(hint_selected) + 50, id_parts=(hint_selected["envelope"]["event_id"],),
        session_id=session_id_of(hint_selected), turn_id=turn_id_of(hint_selected),
        hint_event_id=hint_selected["envelope"]["event_id"], teacher_kind=kind,
        teacher_prompt_token_ids=[1, 2, 3, *response["prompt_token_ids"]],
        response_token_ids=list(response["response_token_ids"]), teacher_logprobs=logprobs,
        policy_version=response["policy_version"], temperature=response["sampling"]["temperature"],
        teacher_top_ids=top_ids if top_k else None, teacher_top_logprobs=top_logprobs if top_k else None,
    )  # fmt: skip


def run_processor(
    processor: Processor, events: list[Event], config: PipelineConfig, states: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[Emit]]:
    """Feed `events` in order to one processor; returns the states by session and every emit."""
    states = {} if states is None else states
    emits: list[Emit] = []
    for event in events:
        key = record_key(event) or ""
        new_state, out = processor.process(states.get(key), event, config)
        if new_state is not None:  # the state as a runtime restores it from its changelog
            codec = processor.state_codec
            new_state = codec.from_bytes(codec.to_bytes(new_state))
        if new_state is None:
            states.pop(key, None)
        else:
            states[key] = new_state
        emits.extend(out)
    return states, emits


def tick_processor(
    processor: Processor, states: dict[str, Any], now_ms: int, config: PipelineConfig
) -> list[Emit]:
    emits: list[Emit] = []
    for key in sorted(states):
        new_state, out = processor.on_tick(states[key], now_ms, config)
        if new_state is None:
            del states[key]
        else:
            states[key] = new_state
        emits.extend(out)
    return emits


def of_type(emits: list[Emit], event_type: str) -> list[Event]:
    return [emit.event for emit in emits if event_type_of(emit.event) == event_type]


@dataclass
class ScriptedEffects:
    """Judge and teacher stand-ins: raw judge outputs per turn id, as recorded."""

    reward_outputs: dict[str, list[str]]
    hint_outputs: dict[str, list[str]]
    default_reward_output: str = "Neutral. \\boxed{0}"
    default_hint_output: str = "Nothing to learn. \\boxed{-1}"
    teacher_top_k: int = 0  # > 0: the teacher also returns top-K rows (top-K distillation)
    outcome_judge_id: str | None = None  # also cast the `outcome` rule judge's vote (step_outcome rule)
    hints: bool = True  # cast hint votes
    requests: dict[str, Event] = field(default_factory=dict)
    responses: dict[str, Event] = field(default_factory=dict)

    def on_event(self, topic: str, event: Event) -> list[Emit]:
        event_type = event_type_of(event)
        if event_type == "RequestReceived":
            self.requests[turn_id_of(event) or ""] = event
        elif event_type == "ResponseGenerated":
            self.responses[turn_id_of(event) or ""] = event
        elif event_type == "NextStateObserved":
            return self.judge(event)
        elif event_type == "HintSelected":
            response = self.responses[turn_id_of(event) or ""]
            return [Emit("teacher_scores", teacher_event(event, response, top_k=self.teacher_top_k))]
        return []

    def judge(self, next_state: Event) -> list[Emit]:
        turn_id = turn_id_of(next_state) or ""
        request, response = self.requests[turn_id], self.responses[turn_id]
        request_messages = json.loads(request["messages_json"])
        shown = render_response(response["response_text"], response["tool_calls_json"])
        reward_prompt = json.dumps(build_reward_judge_messages(request_messages, shown, next_state))
        hint_prompt = json.dumps(build_hint_judge_messages(request_messages, shown, next_state))
        emits = []
        for index, raw in enumerate(self.reward_outputs.get(turn_id, [self.default_reward_output] * 3)):
            emits.append(Emit("judge_votes", vote_event(next_state, index, raw, prompt_text=reward_prompt)))
        if self.outcome_judge_id is not None:
            score, explanation = outcome_judge(request_messages, shown, dict(next_state))
            raw = f"{explanation} \\boxed{{{score}}}" if score is not None else explanation
            vote = vote_event(next_state, 0, raw, judge_kind="rule", judge_id=self.outcome_judge_id)
            emits.append(Emit("judge_votes", vote))
        if not self.hints:
            return emits
        for index, raw in enumerate(self.hint_outputs.get(turn_id, [self.default_hint_output] * 3)):
            vote = vote_event(next_state, index, raw, hint_vote=True, prompt_text=hint_prompt)
            emits.append(Emit("hints", vote))
        return emits


@dataclass
class PipelineDriver:
    """Runs the pure processors and scripted effects over a stream, routing emits by topic."""

    config: PipelineConfig
    effects: ScriptedEffects
    states: dict[str, dict[str, Any]] = field(default_factory=lambda: {name: {} for name in PURE_PROCESSORS})
    log: list[Emit] = field(default_factory=list)

    def feed(self, topic: str, event: Event) -> None:
        queue = [Emit(topic, event)]
        while queue:
            emit = queue.pop(0)
            for stage in STAGES:
                if emit.topic in stage.inputs and stage.name in PURE_PROCESSORS:
                    _, out = run_processor(
                        PURE_PROCESSORS[stage.name], [emit.event], self.config, self.states[stage.name]
                    )
                    self.log.extend(out)
                    queue.extend(out)
            out = self.effects.on_event(emit.topic, emit.event)
            self.log.extend(out)
            queue.extend(out)

    def tick(self, now_ms: int) -> None:
        for name, processor in PURE_PROCESSORS.items():
            for emit in tick_processor(processor, self.states[name], now_ms, self.config):
                self.log.append(emit)
                self.feed(emit.topic, emit.event)

    def feed_all(self, events: list[Event]) -> None:
        for event in events:
            self.feed(topic_for_event(event_type_of(event)), event)
