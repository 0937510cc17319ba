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
from typing import Any, cast

from orl.connectors.environment.api import Observation
from orl.connectors.environment.outcome_events import outcome_event
from orl.connectors.event_log.topic_policy import DEFAULT_MAX_RECORD_BYTES
from orl.schemas.codec import encode
from orl.schemas.event_types import Envelope, NextStateObserved
from orl.schemas.events import make_event
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


def sampling_record(params: SamplingParams) -> dict[str, Any]:
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_tokens,
        "stop": list(params.stop),
        "seed": params.seed,
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
        return self._stage(
            "requests",
            "RequestReceived",
            [request_id],
            session_id=turn.session_id,
            turn_id=turn.turn_id,
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
    ) -> Awaitable[None]:
        """Stage ResponseGenerated; await the result before sending the response."""
        return self._stage(
            "responses",
            "ResponseGenerated",
            [request_id],
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            request_id=request_id,
            prompt_token_ids=generation.prompt_token_ids,
            response_token_ids=generation.token_ids,
            response_logprobs=generation.logprobs,
            response_text=text,
            tool_calls_json=json.dumps(tool_calls) if tool_calls else None,
            finish_reason=generation.finish_reason,
            sampling=sampling_record(params),
            policy_version=generation.policy_version,
            policy_spans=[],
            latency_ms=generation.latency_ms,
            prompt_tokens=len(generation.prompt_token_ids),
            completion_tokens=len(generation.token_ids),
            model=model,
        )

    def session_closed(
        self, session_id: str, last_turn_id: str | None, reason: str = "explicit"
    ) -> Awaitable[None]:
        """Stage SessionClosed; await the result before acknowledging the close."""
        return self._stage(
            "sessions",
            "SessionClosed",
            [session_id, last_turn_id, reason],
            session_id=session_id,
            turn_id=last_turn_id,
            reason=reason,
            last_turn_id=last_turn_id,
        )

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
        return cast(NextStateObserved, event)

    def policy_activated(
        self, server_id: str, run_id: str, version: int, uri: str, swap_latency_ms: float
    ) -> None:
        self._policy_event(
            "PolicyActivated", server_id, run_id, version, uri, swap_latency_ms=swap_latency_ms
        )

    def policy_rejected(self, server_id: str, run_id: str, version: int, uri: str, reason: str) -> None:
        self._policy_event("PolicyRejected", server_id, run_id, version, uri, reason=reason)

    def _policy_event(
        self, event_type: str, server_id: str, run_id: str, version: int, uri: str, **fields: Any
    ) -> None:
        now_ms = self.clock_ms()
        self._record(
            "policy_activations",
            event_type,
            [server_id, run_id, version, now_ms],
            occurred_at_ms=now_ms,
            server_id=server_id,
            run_id=run_id,
            version=version,
            uri=uri,
            **fields,
        )

    def _record(
        self,
        topic: str,
        event_type: str,
        id_parts: list[Any],
        occurred_at_ms: int | None = None,
        **fields: Any,
    ) -> None:
        """Build a server event and commit it to the spool now."""
        self._put(topic, self._event(event_type, id_parts, occurred_at_ms, fields))

    def _stage(self, topic: str, event_type: str, id_parts: list[Any], **fields: Any) -> Awaitable[None]:
        """Build a server event and stage it for the spool's group commit."""
        event = self._event(event_type, id_parts, None, fields)
        if not self.enabled:
            return _NOTHING_TO_WAIT_FOR
        committed = self.spool.stage(self._topic(topic), _key(event), self._encoded(event))
        self.spooled += 1
        return committed

    def _event(
        self, event_type: str, id_parts: list[Any], occurred_at_ms: int | None, fields: dict[str, Any]
    ) -> dict[str, Any]:
        """A server event: namespace, producer, and the time of recording unless given."""
        return make_event(
            event_type,
            namespace=self.namespace,
            producer=PRODUCER,
            occurred_at_ms=self.clock_ms() if occurred_at_ms is None else occurred_at_ms,
            id_parts=id_parts,
            **fields,
        )

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
