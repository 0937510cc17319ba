"""Turns what the server saw and did into events: RequestReceived, ResponseGenerated, SessionClosed.

Writes: the `requests`, `responses`, `sessions`, `next_states` and `policy_activations` topics of
the namespace (through the spool). Token ids and logprobs are recorded exactly as the backend
sampled them; text is never re-tokenized.

The chat path's events (RequestReceived, ResponseGenerated, SessionClosed) join the spool's group
commit: their methods return an awaitable that completes once the event is committed, and the
handler awaits it before it answers. The other events are committed before their method returns.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from orl.connectors.environment.api import Observation
from orl.connectors.environment.outcome_events import outcome_event
from orl.connectors.event_log.topic_policy import DEFAULT_MAX_RECORD_BYTES
from orl.schemas import event_constructors
from orl.schemas.codec import encode
from orl.schemas.event_types import Envelope, NextStateObserved
from orl.schemas.event_types import SamplingParams as SamplingRecord
from orl.schemas.events import EventOrigin
from orl.schemas.topics import topic_name
from orl.serving.openai_api import ApiError, ChatRequest, RolloutGroup
from orl.serving.policy.base import Generation, SamplingParams
from orl.serving.session_tracker import TurnAssignment
from orl.serving.spool import EventSpool

PRODUCER = "serving/0.1.0"


class _Committed:
    """The awaitable of an event that needs no waiting (capture is off)."""

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_NOTHING_TO_WAIT_FOR = _Committed()


def sampling_record(params: SamplingParams) -> SamplingRecord:
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "stop": list(params.stop),
        "seed": params.seed,
        "constraint": params.constraint,
    }


@dataclass
class EventRecorder:
    """Builds and spools the server's events. `enabled=False` records nothing (benchmarks only).
    An event over `max_record_bytes` is never spooled: the call raises a 413 ApiError instead."""

    spool: EventSpool
    namespace: str
    clock_ms: Callable[[], int]
    enabled: bool = True
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    spooled: int = 0
    _topics: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def request_received(
        self,
        request_id: str,
        turn: TurnAssignment,
        req: ChatRequest,
        params: SamplingParams,
        *,
        main: bool,
        client_id: str | None,
        group: RolloutGroup | None = None,
    ) -> Awaitable[None]:
        """Stage RequestReceived; await the result before acknowledging the request."""
        event = event_constructors.request_received(
            self._origin((request_id,), session_id=turn.session_id, turn_id=turn.turn_id),
            request_id=request_id,
            turn_kind="main" if main else "side",
            turn_index=turn.turn_index,
            previous_turn_id=turn.previous_turn_id,
            link_method=turn.link_method,
            messages_json=json.dumps(req.messages, ensure_ascii=False),
            tools_json=json.dumps(req.tools) if req.tools else None,
            tool_choice_json=json.dumps(req.tool_choice) if req.tool_choice is not None else None,
            sampling=sampling_record(params),
            model=req.model,
            stream=req.stream,
            client_id=client_id,
            group_id=group.group_id if group else None,
            group_size=group.size if group else None,
        )
        return self._stage("requests", event)

    def response_generated(
        self,
        request_id: str,
        turn: TurnAssignment,
        generation: Generation,
        params: SamplingParams,
        *,
        text: str,
        tool_calls: list[dict[str, Any]],
        model: str,
        policy_run: str,
        reasoning: str | None = None,
    ) -> Awaitable[None]:
        """Stage ResponseGenerated; await the result before sending the response. `text` is the
        reply's content (its answer), `reasoning` its reasoning block (None: none), `policy_run` the
        run whose version answered."""
        event = event_constructors.response_generated(
            self._origin((request_id,), session_id=turn.session_id, turn_id=turn.turn_id),
            request_id=request_id,
            prompt_token_ids=generation.prompt_token_ids,
            response_token_ids=generation.token_ids,
            response_logprobs=generation.logprobs,
            response_text=text,
            reasoning_text=reasoning,
            tool_calls_json=json.dumps(tool_calls) if tool_calls else None,
            finish_reason=generation.finish_reason,
            sampling=sampling_record(params),
            policy_version=generation.policy_version,
            policy_spans=[],
            latency_ms=generation.latency_ms,
            prompt_tokens=len(generation.prompt_token_ids),
            completion_tokens=len(generation.token_ids),
            model=model,
            policy_run=policy_run,
        )
        return self._stage("responses", event)

    def session_closed(
        self, session_id: str, last_turn_id: str | None, reason: str = "explicit"
    ) -> Awaitable[None]:
        """Stage SessionClosed; await the result before acknowledging the close."""
        event = event_constructors.session_closed(
            self._origin((session_id, last_turn_id, reason), session_id=session_id, turn_id=last_turn_id),
            reason=reason,
            last_turn_id=last_turn_id,
        )
        return self._stage("sessions", event)

    def next_state_observed(
        self, observation: Observation, *, session_id: str, turn_id: str, source: str
    ) -> NextStateObserved:
        """Spool what a connector observed after turn `turn_id` (feedback, a reward, a tool result); returns the event."""
        event = outcome_event(
            observation,
            session_id=session_id,
            turn_id=turn_id,
            source=source,
            namespace=self.namespace,
            producer=PRODUCER,
            occurred_at_ms=self.clock_ms(),
        )
        self._put("next_states", event)
        return event

    def policy_activated(
        self, server_id: str, run_id: str, version: int, uri: str, swap_latency_ms: float
    ) -> None:
        now_ms = self.clock_ms()
        event = event_constructors.policy_activated(
            self._origin((server_id, run_id, version, now_ms), occurred_at_ms=now_ms),
            server_id=server_id,
            run_id=run_id,
            version=version,
            uri=uri,
            swap_latency_ms=swap_latency_ms,
        )
        self._put("policy_activations", event)

    def policy_rejected(self, server_id: str, run_id: str, version: int, uri: str, reason: str) -> None:
        now_ms = self.clock_ms()
        event = event_constructors.policy_rejected(
            self._origin((server_id, run_id, version, now_ms), occurred_at_ms=now_ms),
            server_id=server_id,
            run_id=run_id,
            version=version,
            uri=uri,
            reason=reason,
        )
        self._put("policy_activations", event)

    def _origin(
        self,
        id_parts: tuple[object, ...],
        *,
        session_id: str | None = None,
        turn_id: str | None = None,
        occurred_at_ms: int | None = None,
    ) -> EventOrigin:
        """A server event's origin: namespace, producer, and the time of recording unless given."""
        return EventOrigin(
            namespace=self.namespace,
            producer=PRODUCER,
            occurred_at_ms=self.clock_ms() if occurred_at_ms is None else occurred_at_ms,
            id_parts=id_parts,
            session_id=session_id,
            turn_id=turn_id,
        )

    def _stage(self, topic: str, event: Mapping[str, Any]) -> Awaitable[None]:
        """Stage a server event for the spool's group commit."""
        if not self.enabled:
            return _NOTHING_TO_WAIT_FOR
        committed = self.spool.stage(self._topic(topic), _key(event), self._encoded(event))
        self.spooled += 1
        return committed

    def _put(self, topic: str, event: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        self.spool.put(self._topic(topic), _key(event), self._encoded(event))
        self.spooled += 1

    def _encoded(self, event: Mapping[str, Any]) -> bytes:
        """The event's bytes; 413 when they exceed the record limit (the log would refuse them)."""
        value = encode(event)
        if len(value) > self.max_record_bytes:
            event_type = event["envelope"]["event_type"]
            raise ApiError(
                413,
                f"the {event_type} event of this request would take {len(value)} bytes, over the server's "
                f"record limit of {self.max_record_bytes} (--max-record-bytes): send less content"
                + (" or ask for fewer tokens (max_tokens)" if event_type == "ResponseGenerated" else ""),
                code="record_too_large",
            )
        return value

    def _topic(self, topic: str) -> str:
        """The full topic name, validated once per topic rather than once per event."""
        full = self._topics.get(topic)
        if full is None:
            full = self._topics[topic] = topic_name(self.namespace, topic)
        return full


def _key(event: Mapping[str, Any]) -> bytes | None:
    """The record key: the session (a session's events stay in order), else the server."""
    envelope: Envelope = event["envelope"]
    key = envelope["session_id"] or event.get("server_id")
    return key.encode() if key else None
