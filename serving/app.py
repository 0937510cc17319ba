"""The HTTP surface of `orl serve`: OpenAI chat completions that record every turn as events.

Routes: POST /v1/chat/completions (plain and server-sent events), POST /v1/responses (OpenAI's
Responses API on the same turn: `orl.serving.responses_api`), GET /v1/models,
POST /v1/sessions/{id}/end, POST /v1/orl/score (teacher logprobs for the pipeline: the internal key
only, `orl.serving.tenancy`), GET /healthz,
/readyz, /metrics, /openapi.json (`orl.serving.openapi`: every route, no key needed), the ingest routes
and /admin/* (admin key). Unknown routes and methods get OpenAI-shaped 404 / 405 bodies; every other
error goes through the one error policy (`orl.serving.request_guards`), a failing stream ends with an
SSE error event. Writes RequestReceived, ResponseGenerated and
SessionClosed through the recorder; reads nothing from the log itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import struct
import time
import urllib.parse
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from orl.connectors.metrics import Metrics
from orl.serving.capture import EventRecorder
from orl.serving.checkpoint_follower import CheckpointFollower
from orl.serving.ingest import ingest_routes
from orl.serving.openai_api import (
    ApiError,
    ChatRequest,
    RolloutGroup,
    bad_request,
    error_body,
    json_object,
    parse_chat_request,
    parse_rollout_group,
    parse_score_request,
    session_header,
)
from orl.serving.openapi import openapi_document
from orl.serving.policy.base import (
    MAIN_RUN,
    Generation,
    GenerationStream,
    PolicyBackend,
    PolicyError,
    SamplingParams,
)
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.reasoning import CLOSE as REASONING_CLOSE
from orl.serving.reasoning import ReasoningStart, ReasoningStream, reasoning_start, split_reasoning
from orl.serving.request_guards import ConcurrencyLimit, FinalErrorHandler, as_api_error, guard, read_body
from orl.serving.responses_api import (
    ResponseEvents,
    ResponsesRequest,
    error_event,
    output_items,
    parse_responses_request,
    response_object,
    stored_messages,
)
from orl.serving.session_tracker import SessionTracker, TurnAssignment
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool, SpoolDrainer, StoredConversation
from orl.serving.tenancy import check_session_owner, request_key_id, require_internal_key
from orl.serving.tool_calls import CLOSE as TOOL_CALL_CLOSE
from orl.serving.tool_calls import (
    REQUIRED_CALL_PREFIX,
    ForcedCallStream,
    PlainReplyStream,
    ReplyDelta,
    ReplyStream,
    RequiredCallStream,
    ToolCallSplitter,
    forced_call,
    forced_call_prefix,
    merged_tool_calls,
    parse_reply,
    required_call,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class ServerState:
    settings: ServeSettings
    backend: PolicyBackend
    template: ChatTemplate
    recorder: EventRecorder
    metrics: Metrics
    tracker: SessionTracker = field(default_factory=SessionTracker)
    ready: bool = False
    admin_routes: list[Route] = field(default_factory=list)
    drainer: SpoolDrainer | None = None  # None: nothing drains the spool here (tests of the app)
    follower: CheckpointFollower | None = None  # None: this server does not follow checkpoints
    tenant_runs: dict[str, str] = field(default_factory=dict)  # client key id -> its tenant's own run
    # Rendering and tokenising prompts: one thread of its own, so a long prompt never stalls the event
    # loop (other requests' streams, health checks), and the tokenizer is never called from two threads.
    tokenizing: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="orl-tokenize")
    )

    def run_for(self, request: Request) -> str:
        """The run that answers a request: its tenant's own (--tenant-adapters), else the main policy."""
        return self.tenant_runs.get(request_key_id(request), MAIN_RUN)

    async def off_loop(self, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` on the tokenizing thread."""
        return await asyncio.get_running_loop().run_in_executor(
            self.tokenizing, functools.partial(work, *args)
        )

    def not_ready_reason(self) -> str | None:
        """Why /readyz answers 503 (starting or stopping, the newest checkpoint not loaded yet, the
        spool over its cap or not draining)."""
        if not self.ready:
            return "the server is starting or stopping"
        if self.follower is not None and not self.follower.caught_up:
            return "loading the newest published checkpoint (read from the event log once it is reachable)"
        full = self.recorder.spool.full_reason()
        if full is not None:
            return full
        return self.drainer.problem if self.drainer is not None else None


def build_app(state: ServerState) -> Starlette:
    api = _ApiHandlers(state)
    chat_keys = (*state.settings.client_keys(), state.settings.internal_key)  # the judge and teacher chat too
    routes = [
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/readyz", api.readyz, methods=["GET"]),
        Route("/openapi.json", api.openapi, methods=["GET"]),
        Route(
            "/metrics",
            guard(api.metrics, (state.settings.metrics_key,)) if state.settings.metrics_key else api.metrics,
            methods=["GET"],
        ),
        Route("/v1/models", guard(api.models, chat_keys), methods=["GET"]),
        Route("/v1/chat/completions", guard(api.chat, chat_keys), methods=["POST"]),
        Route("/v1/responses", guard(api.responses, chat_keys), methods=["POST"]),
        Route(
            "/v1/sessions/{session_id}/end",
            guard(api.end_session, state.settings.client_keys()),
            methods=["POST"],
        ),
        Route("/v1/orl/score", guard(api.score, chat_keys), methods=["POST"]),  # the internal key only
        *ingest_routes(state),
        *[
            Route(r.path, guard(r.endpoint, (state.settings.admin_key,)), methods=r.methods)
            for r in state.admin_routes
        ],
    ]
    return Starlette(
        routes=routes,
        middleware=[
            Middleware(FinalErrorHandler),  # the last word: no plain-text 500, no dropped connection
            Middleware(ConcurrencyLimit, limit=state.settings.max_concurrent_requests),
        ],
        exception_handlers={HTTPException: _http_error},
    )


async def _http_error(request: Request, error: Exception) -> Response:
    """Starlette's own refusals (no such route, wrong method) in OpenAI's error shape."""
    assert isinstance(error, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
    return JSONResponse(
        error_body(str(error.detail), "invalid_request_error", code=code),
        status_code=error.status_code,
        headers=error.headers,
    )


class _ApiHandlers:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.settings = state.settings

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(self.state))

    async def readyz(self, request: Request) -> Response:
        reason = self.state.not_ready_reason()
        body: dict[str, Any] = {"ready": reason is None, "policy_version": self.state.backend.policy_version}
        if reason is not None:
            body["reason"] = reason
        return JSONResponse(body, status_code=200 if reason is None else 503)

    async def metrics(self, request: Request) -> Response:
        self.state.metrics.set("policy_version", self.state.backend.policy_version)
        self.state.metrics.set("spool_depth", self.state.recorder.spool.depth())
        return Response(self.state.metrics.exposition(), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request) -> Response:
        name = self.settings.served_model_name
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "orl",
                        "policy_version": self.state.backend.policy_version,
                    }
                ],
            }
        )

    async def end_session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        check_session_owner(self.state.recorder.spool, session_id, request)
        last_turn_id = self.state.tracker.last_main_turn(session_id)  # the pipeline ends this turn
        was_open = self.state.tracker.close(session_id)
        await self.state.recorder.session_closed(session_id, last_turn_id)
        return JSONResponse({"session_id": session_id, "closed": True, "was_open": was_open})

    async def chat(self, request: Request) -> Response:
        started = time.perf_counter()
        self.state.recorder.spool.refuse_if_full()  # 503: the event log has not taken what is spooled
        req = parse_chat_request(
            await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s),
            max_tokens_limit=self.settings.max_tokens_limit,
        )
        if req.n > 1:
            return await self._choices(request, req, started)
        turn_call, prompt_ids = await self._begin(request, req, "chatcmpl-" + uuid.uuid4().hex, started)
        stream = self.state.backend.generate_stream(prompt_ids, turn_call.params, self.state.run_for(request))
        if req.stream:
            await turn_call.spooled()  # the 200 and the first bytes go out only once the request is spooled
            return StreamingResponse(
                _ending_in_an_error_event(turn_call.sse(stream), turn_call.request_id, _chat_error_event),
                media_type="text/event-stream",
                headers=turn_call.headers(),
            )
        generations = await _unless_client_leaves(request, [stream])
        if generations is None:
            return turn_call.abandoned()
        body = await turn_call.finish(generations[0])
        return JSONResponse(body, headers=turn_call.headers())

    async def _choices(self, request: Request, req: ChatRequest, started: float) -> Response:
        """n > 1: each choice is the one turn of a new session, and the n sessions are one rollout group
        (the completion's id), so the pipeline normalises their rewards together. A given seed seeds
        choice i with seed + i. The client's next request links, by its messages, to the session of the
        choice it continues."""
        for header in ("x-session-id", "x-group-id", "x-group-size"):
            if request.headers.get(header):
                raise bad_request(
                    f"n > 1 makes its choices a rollout group of new sessions: send no {header}", param="n"
                )
        completion_id = "chatcmpl-" + uuid.uuid4().hex
        group = RolloutGroup(completion_id, req.n)
        prompt = await self.state.off_loop(self._prompt, req)  # one prompt for every choice
        turns = [
            self._open_turn(
                request, req, f"{completion_id}-{index}", started, prompt, choices=group, choice=index
            )
            for index in range(req.n)
        ]
        run = self.state.run_for(request)
        streams = [self.state.backend.generate_stream(prompt.ids, turn.params, run) for turn in turns]
        generations = await _unless_client_leaves(request, streams)
        if generations is None:
            return turns[0].abandoned()
        bodies = [await turn.finish(generation) for turn, generation in zip(turns, generations, strict=True)]
        choices = [{**body["choices"][0], "index": index} for index, body in enumerate(bodies)]
        prompt_tokens = bodies[0]["usage"]["prompt_tokens"]  # one prompt, as OpenAI counts it
        completion_tokens = sum(body["usage"]["completion_tokens"] for body in bodies)
        reasoning_tokens = sum(b["usage"]["completion_tokens_details"]["reasoning_tokens"] for b in bodies)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }
        sessions = ",".join(_header_value(turn.turn.session_id) for turn in turns)
        return JSONResponse(
            {**bodies[0], "id": completion_id, "choices": choices, "usage": usage},
            headers={"x-group-id": completion_id, "x-session-ids": sessions},
        )

    async def responses(self, request: Request) -> Response:
        """POST /v1/responses: the Responses API's request as a chat turn, its reply as a Response."""
        started = time.perf_counter()
        spool = self.state.recorder.spool
        spool.refuse_if_full()
        wanted = parse_responses_request(
            json_object(await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s))
        )
        owner = request_key_id(request)
        continued: StoredConversation | None = None
        if wanted.previous_response_id:
            found = spool.stored_conversation(wanted.previous_response_id, owner)
            if found is None:
                raise ApiError(
                    404,
                    f"previous response {wanted.previous_response_id!r} not found: this server keeps a "
                    "response for the API key that created it, unless it was created with store: false",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            continued = found
        previous = continued.messages if continued else []
        req = wanted.chat_request(previous, max_tokens_limit=self.settings.max_tokens_limit)
        if continued is not None:  # the turn joins the previous response's session
            req = dataclasses.replace(req, session_id=continued.session_id)
        response_id = "resp_" + uuid.uuid4().hex
        turn_call, prompt_ids = await self._begin(
            request, req, response_id, started, continues=continued.turn_id if continued else None
        )
        if wanted.store:
            turn_call.keep = functools.partial(_stage_response, spool, wanted, turn_call, owner)
        reply = _ResponseReply(wanted, response_id, int(time.time()), self.settings.served_model_name)
        stream = self.state.backend.generate_stream(prompt_ids, turn_call.params, self.state.run_for(request))
        if req.stream:
            await turn_call.spooled()
            return StreamingResponse(
                _ending_in_an_error_event(reply.sse(turn_call, stream), response_id, _responses_error_event),
                media_type="text/event-stream",
                headers=turn_call.headers(),
            )
        generations = await _unless_client_leaves(request, [stream])
        if generations is None:
            return turn_call.abandoned()
        return JSONResponse(reply.of(await turn_call.finish(generations[0])), headers=turn_call.headers())

    async def _begin(
        self,
        request: Request,
        req: ChatRequest,
        request_id: str,
        started: float,
        *,
        continues: str | None = None,
    ) -> tuple[_Turn, list[int]]:
        """Tokenise a checked request's prompt and open its turn (`_open_turn`): the turn to serve, and
        the prompt's token ids."""
        prompt = await self.state.off_loop(self._prompt, req)
        turn = self._open_turn(request, req, request_id, started, prompt, continues=continues)
        return turn, prompt.ids

    def _open_turn(
        self,
        request: Request,
        req: ChatRequest,
        request_id: str,
        started: float,
        prompt: _Prompt,
        *,
        choices: RolloutGroup | None = None,
        choice: int = 0,
        continues: str | None = None,
    ) -> _Turn:
        """Link a request to its session and turn and stage RequestReceived. `choices`: the rollout group
        of the request's n choices, and this is choice `choice`, in a new session of its own, seeded with
        seed + choice. `continues`: the turn this one follows (a stored response's), also after a restart
        of the server."""
        main = _turn_type(request, self.settings.default_turn_type) == "main"
        group = choices or parse_rollout_group(
            request.headers.get("x-group-id"), request.headers.get("x-group-size")
        )
        params = self._sampling(req, len(prompt.ids))
        if params.seed is not None and choice:
            params = dataclasses.replace(params, seed=(params.seed + choice + 2**63) % 2**64 - 2**63)
        header_session = session_header(request.headers.get("x-session-id"))
        named, _ = self.state.tracker.explicit_session(
            header_session, req.session_id, req.user, req.prompt_cache_key
        )
        if named is not None:  # 403 for a session another key opened
            check_session_owner(self.state.recorder.spool, named, request)
        turn = self.state.tracker.assign(
            req.messages,
            header_session=header_session,
            body_session=req.session_id,
            user=req.user,
            cache_key=req.prompt_cache_key,
            main=main,
            owner=request_key_id(request),
            new_session=choices is not None,
            continues=continues,
        )
        if turn.link_method == "new":  # committed with this turn's events
            self.state.recorder.spool.stage_session_owner(turn.session_id, turn.owner)
        # committed with this turn's events: a restarted server continues the session's numbering
        self.state.recorder.spool.stage_turn_index(turn.session_id, turn.turn_index + 1)
        spooled = self.state.recorder.request_received(
            request_id, turn, req, params, main=main, client_id=req.user, group=group
        )
        done = _truthy(request.headers.get("x-session-done"))
        return _Turn(
            self.state, req, turn, request_id, params, main, done, started, [spooled], prompt.reasoning
        )

    async def score(self, request: Request) -> Response:
        require_internal_key(request, self.settings.internal_key)
        raw = await read_body(request, self.settings.max_body_bytes, self.settings.body_timeout_s)
        req = parse_score_request(raw, vocab_size=len(self.state.template.tokenizer))
        try:
            prompt_ids = await self.state.off_loop(self.state.template.render, req.messages, req.tools)
        except PolicyError as error:
            raise bad_request(str(error), param="messages") from error
        if len(prompt_ids) + len(req.response_token_ids) > self.state.backend.context_window:
            raise bad_request(
                "prompt plus response exceed the context window", code="context_length_exceeded"
            )
        version = self.state.backend.policy_version
        body: dict[str, Any] = {
            "prompt_token_ids": prompt_ids,
            "policy_version": 0 if req.use_base else version,
        }
        backend = self.state.backend
        if req.top_k and not backend.supports_top_k:
            raise bad_request(
                f"top_k needs a backend that returns top-K logprobs (transformers or sglang); this server "
                f"runs {type(backend).__name__}",
                param="top_k",
            )
        if req.top_k:
            scores = await backend.score_top_k(
                prompt_ids, req.response_token_ids, req.temperature, req.top_k, use_base=req.use_base
            )
            body.update(logprobs=scores.logprobs, top_ids=scores.top_ids, top_logprobs=scores.top_logprobs)
        else:
            body["logprobs"] = await backend.score(
                prompt_ids, req.response_token_ids, req.temperature, use_base=req.use_base
            )
        return JSONResponse(body)

    def _prompt(self, req: ChatRequest) -> _Prompt:
        """The request's prompt token ids, and where its reply may start reasoning. A constrained
        turn (a forced or required tool call, a response_format) does not reason: a block the
        generation prompt opened is closed empty in the prompt, so the constraint holds from the
        reply's first token."""
        try:
            text = self.state.template.render_text(
                req.messages, req.tools if req.tool_choice != "none" else None
            )
        except PolicyError as error:
            raise bad_request(str(error), param="messages") from error
        reasoning = reasoning_start(self.state.template.source, text)
        forced = req.forced_tool()
        if forced or req.required_call() or req.constraint is not None:
            if reasoning == "prompt":
                text += REASONING_CLOSE + "\n\n"
            reasoning = "none"
        if forced:
            text += forced_call_prefix(forced, constrained=req.constrained_call())
        elif req.required_call():
            text += REQUIRED_CALL_PREFIX
        ids = list(self.state.template.tokenizer(text, add_special_tokens=False)["input_ids"])
        window = self.state.backend.context_window
        if len(ids) >= window:
            raise bad_request(
                f"the prompt has {len(ids)} tokens; this model's context window is {window}",
                param="messages",
                code="context_length_exceeded",
            )
        return _Prompt(ids, reasoning)

    def _sampling(self, req: ChatRequest, prompt_tokens: int) -> SamplingParams:
        room = self.state.backend.context_window - prompt_tokens
        wanted = req.max_tokens or self.settings.default_max_tokens
        if req.max_tokens and req.max_tokens > room:
            raise bad_request(
                f"max_tokens {req.max_tokens} exceeds the {room} tokens left in the context window "
                f"after a {prompt_tokens}-token prompt",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=min(wanted, room),
            stop=req.stop + _one_call_stop(req),
            seed=req.seed,
            constraint=req.constraint,
        )


def _one_call_stop(req: ChatRequest) -> tuple[str, ...]:
    """The stop that ends a reply at its first complete tool call, for parallel_tool_calls false: the
    call parses without its closing tag (orl.serving.tool_calls)."""
    if req.parallel_tool_calls or not req.may_call_tools():
        return ()
    return (TOOL_CALL_CLOSE,)


@dataclass(frozen=True)
class _Prompt:
    ids: list[int]
    reasoning: ReasoningStart  # where the reply may start a reasoning block (orl.serving.reasoning)


@dataclass
class _Turn:
    """One chat turn after validation: produces the reply and records it."""

    state: ServerState
    req: ChatRequest
    turn: TurnAssignment
    request_id: str
    params: SamplingParams
    main: bool
    session_done: bool
    started: float
    events: list[Awaitable[None]]  # this turn's events, staged for the spool's group commit
    reasoning: ReasoningStart
    # called with the reply's message just before its ResponseGenerated is staged (a stored response)
    keep: Callable[[dict[str, Any]], None] | None = None
    body: dict[str, Any] = field(default_factory=dict)  # the chat completion, once `finish` has built it

    def headers(self) -> dict[str, str]:
        """The turn's ids as response headers: percent-encoded (UTF-8) outside printable ASCII, and
        `%` itself, since a header value is Latin-1 (a session named by a non-ASCII `user`)."""
        return {
            "x-session-id": _header_value(self.turn.session_id),
            "x-turn-id": _header_value(self.turn.turn_id),
        }

    def abandoned(self) -> Response:
        """A 499 for a client that left before its reply: nothing was generated to record."""
        self.state.metrics.count("chat_completions_abandoned", turn_kind="main" if self.main else "side")
        return Response(status_code=499)

    async def spooled(self) -> None:
        """Wait until this turn's events are committed to the spool: only then may it be answered."""
        for committed in self.events:
            await committed
        self.events.clear()

    async def finish(self, generation: Generation) -> dict[str, Any]:
        """Record the response (and a requested session end), then build the reply body.

        The events are committed before the session tracker learns of the response, as when each
        event was written on its own: a spool failure fails the request and changes nothing else.
        A request whose own commit already failed gets its error before its response is staged:
        else the response could be committed by a later group, for a turn answered with a 503.
        """
        for committed in self.events:
            if isinstance(committed, asyncio.Future) and committed.done():
                committed.result()  # raises the SpoolError of the failed commit
        reasoning, text, tool_calls = self._reply(generation)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        if self.keep is not None:
            self.keep(message)
        self.events.append(
            self.state.recorder.response_generated(
                self.request_id,
                self.turn,
                generation,
                self.params,
                text=text or "",
                tool_calls=tool_calls,
                model=self.state.settings.served_model_name,
                policy_run=generation.policy_run or self.state.settings.run_id,
                reasoning=reasoning,
            )
        )
        await self.spooled()
        if self.main:
            self.state.tracker.record_response(self.turn, self.req.messages, message)
        if self.session_done:
            last_turn_id = self.state.tracker.last_main_turn(self.turn.session_id)
            self.state.tracker.close(self.turn.session_id)
            self.events.append(self.state.recorder.session_closed(self.turn.session_id, last_turn_id))
            await self.spooled()
        self._count(generation)
        self.body = {
            "id": self.request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.state.settings.served_model_name,
            "system_fingerprint": f"v{generation.policy_version}",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": self._logprobs(generation) if self.req.logprobs else None,
                    "finish_reason": "tool_calls" if tool_calls else generation.finish_reason,
                }
            ],
            "usage": _usage(generation, await self._reasoning_tokens(generation, reasoning)),
        }
        return self.body

    async def sse(self, stream: GenerationStream) -> AsyncGenerator[bytes, None]:
        """The reply as chat.completion.chunk server-sent events, then [DONE]."""
        yield _sse(self._chunk({"role": "assistant", "content": ""}, None))
        async with aclosing(self.deltas(stream)) as deltas:
            async for delta in deltas:
                for chunk in self._delta_chunks(delta):
                    yield chunk
        body = self.body
        last = self._chunk({}, body["choices"][0]["finish_reason"])
        last["choices"][0]["logprobs"] = body["choices"][0]["logprobs"]  # all of them, in the last chunk
        yield _sse(last)
        if self.req.include_usage:
            yield _sse({**self._chunk({}, None), "choices": [], "usage": body["usage"]})
        yield b"data: [DONE]\n\n"

    async def deltas(self, stream: GenerationStream) -> AsyncGenerator[ReplyDelta, None]:
        """The reply as it is generated: content, and each tool call once it is whole. When the last
        delta is out, `finish` has recorded the reply and `self.body` holds it.

        What may be shown when is `orl.serving.tool_calls`' decision; the deltas add up to the
        message that `finish` records (checked here: a mismatch is logged and counted).
        """
        reply = self._reply_stream()
        generated: list[str] = []
        shown: list[ReplyDelta] = []
        try:
            async for step in stream:
                # the first token: prefill is done, which a prefix-cache hit shortens (the client may see it later)
                if not generated:
                    self.state.metrics.observe(
                        "time_to_first_token_seconds", time.perf_counter() - self.started
                    )
                generated.append(step.text)
                shown.append(reply.feed(step.text))
                yield shown[-1]
            generation = stream.generation
        finally:
            await stream.aclose()
        fed = "".join(generated)
        tail = [reply.feed(generation.text[len(fed) :])] if generation.text.startswith(fed) else []
        tail.append(reply.finish())  # the text held back to the end, and an unclosed last call
        body = await self.finish(generation)
        for delta in tail:
            yield delta
        shown.extend(tail)
        self._check_streamed(shown, body["choices"][0]["message"])

    def _reply_stream(self) -> ReplyStream:
        forced = self.req.forced_tool()
        if forced:
            return ForcedCallStream(forced, self.request_id, constrained=self.req.constrained_call())
        if self.req.required_call():
            return RequiredCallStream(self.request_id)
        if not self.req.may_call_tools():
            return ReasoningStream(PlainReplyStream(), self.reasoning)
        return ReasoningStream(ToolCallSplitter(self.request_id), self.reasoning)

    def _delta_chunks(self, delta: ReplyDelta) -> list[bytes]:
        chunks = []
        if delta.reasoning:
            chunks.append(_sse(self._chunk({"reasoning_content": delta.reasoning}, None)))
        if delta.content:
            chunks.append(_sse(self._chunk({"content": delta.content}, None)))
        if delta.tool_calls:
            chunks.append(_sse(self._chunk({"tool_calls": list(delta.tool_calls)}, None)))
        return chunks

    def _check_streamed(self, shown: list[ReplyDelta], message: dict[str, Any]) -> None:
        """Log and count a stream that does not add up to the recorded message (a bug, never expected)."""
        content = "".join(delta.content for delta in shown)
        reasoning = "".join(delta.reasoning for delta in shown)
        calls = merged_tool_calls(call for delta in shown for call in delta.tool_calls)
        if (
            content != (message["content"] or "")
            or reasoning != message.get("reasoning_content", "")
            or calls != message.get("tool_calls", [])
        ):
            logger.error(
                "request %s: the streamed reply differs from the recorded one (%d vs %d content chars, "
                "%d vs %d tool calls)",
                self.request_id,
                len(content),
                len(message["content"] or ""),
                len(calls),
                len(message.get("tool_calls", [])),
            )
            self.state.metrics.count("stream_reply_mismatches")

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.state.settings.served_model_name,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    def _logprobs(self, generation: Generation) -> dict[str, Any]:
        """OpenAI's `logprobs` of a choice: every sampled token (the end-of-turn token too, as
        recorded) with the logprob orl records for it, from the distribution it sampled from (as the
        event holds it: an Avro float, 32 bits)."""
        template = self.state.template
        content = []
        for token_id, logprob in zip(generation.token_ids, generation.logprobs, strict=True):
            raw = template.token_bytes(token_id)
            text = raw.decode("utf-8", errors="replace")
            recorded = struct.unpack("<f", struct.pack("<f", logprob))[0]
            content.append({"token": text, "logprob": recorded, "bytes": list(raw), "top_logprobs": []})
        return {"content": content, "refusal": None}

    def _reply(self, generation: Generation) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """The reply's reasoning (None: no block), content and tool calls."""
        forced = self.req.forced_tool()
        if forced:
            parsed = forced_call(
                forced, generation.text, self.request_id, constrained=self.req.constrained_call()
            )
            return None, parsed.content, parsed.tool_calls
        if self.req.required_call():
            parsed = required_call(generation.text, self.request_id)
            return None, parsed.content, parsed.tool_calls
        split = split_reasoning(generation.text, self.reasoning)
        if not self.req.may_call_tools():
            return split.reasoning, split.answer, []
        parsed = parse_reply(split.answer, self.request_id)
        return split.reasoning, parsed.content, parsed.tool_calls

    async def _reasoning_tokens(self, generation: Generation, reasoning: str | None) -> int:
        """How many of the reply's tokens are its reasoning block: up to the one that completes
        `</think>` (all of them when the block never closed)."""
        if reasoning is None:
            return 0
        template, ids = self.state.template, generation.token_ids

        def closed_by(count: int) -> bool:
            return REASONING_CLOSE in template.decode(ids[:count], skip_special_tokens=False)

        def first_closing_prefix() -> int:
            low, high = 1, len(ids)  # the shortest prefix whose text holds the marker
            if not ids or not closed_by(high):
                return len(ids)
            while low < high:
                middle = (low + high) // 2
                low, high = (low, middle) if closed_by(middle) else (middle + 1, high)
            return low

        return await self.state.off_loop(first_closing_prefix)

    def _count(self, generation: Generation) -> None:
        metrics = self.state.metrics
        metrics.count(
            "chat_completions",
            turn_kind="main" if self.main else "side",
            finish_reason=generation.finish_reason,
        )
        metrics.count("completion_tokens", len(generation.token_ids))
        metrics.observe("request_latency_seconds", time.perf_counter() - self.started)


async def _unless_client_leaves(request: Request, streams: list[GenerationStream]) -> list[Generation] | None:
    """The finished generations, or None once the client has closed its connection: a client that
    timed out (a judge, then retrying) must not leave the model generating for nobody. Streamed
    replies stop the same way (Starlette closes their generator on disconnect)."""
    finished = asyncio.ensure_future(asyncio.gather(*(stream.result() for stream in streams)))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((finished, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        left = not finished.done()
        if left:  # the client left (or this handler was cancelled): stop generating
            finished.cancel()
            for stream in streams:
                await stream.aclose()
    return None if left else finished.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (the body has been read, so nothing else can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _ending_in_an_error_event(
    chunks: AsyncGenerator[bytes, None], request_id: str, error_event: Callable[[dict[str, Any]], bytes]
) -> AsyncIterator[bytes]:
    """A stream that fails after its 200 went out: the error policy's body as a last SSE event (what
    OpenAI's SDKs raise as an APIError), then the end of the stream. A client that leaves cancels
    the stream (not an Exception), which ends it without an event."""
    async with aclosing(chunks):
        try:
            async for chunk in chunks:
                yield chunk
        except Exception as error:  # the error policy logs and answers it
            yield error_event(as_api_error(error, f"request {request_id} (streaming)").body())


def _chat_error_event(body: dict[str, Any]) -> bytes:
    return _sse(body)


def _responses_error_event(body: dict[str, Any]) -> bytes:
    return _typed_sse(error_event(body))


@dataclass(frozen=True)
class _ResponseReply:
    """One Responses API turn's reply: the chat completion `_Turn.finish` records, as a Response."""

    request: ResponsesRequest
    response_id: str
    created_at: int
    model: str

    def of(self, completion: dict[str, Any]) -> dict[str, Any]:
        choice = completion["choices"][0]
        logprobs = choice["logprobs"]["content"] if choice["logprobs"] else None
        return response_object(
            self.request,
            self.response_id,
            self.created_at,
            self.model,
            output=output_items(self.response_id, choice["message"], logprobs),
            finish_reason=choice["finish_reason"],
            usage=completion["usage"],
        )

    async def sse(self, turn: _Turn, stream: GenerationStream) -> AsyncGenerator[bytes, None]:
        """The reply as the Responses API's typed events, from response.created to response.completed."""
        in_progress = response_object(
            self.request,
            self.response_id,
            self.created_at,
            self.model,
            output=[],
            finish_reason=None,
            usage=None,
        )
        events = ResponseEvents(in_progress)
        for event in events.start():
            yield _typed_sse(event)
        async with aclosing(turn.deltas(stream)) as deltas:
            async for delta in deltas:
                for event in events.feed(delta):
                    yield _typed_sse(event)
        for event in events.finish(self.of(turn.body)):
            yield _typed_sse(event)


def _stage_response(
    spool: EventSpool, request: ResponsesRequest, turn: _Turn, owner: str, message: dict[str, Any]
) -> None:
    """Keep a stored response (its input and reply) with the turn's events, for previous_response_id."""
    spool.stage_response(
        turn.request_id,
        owner,
        (turn.turn.session_id, turn.turn.turn_id),
        request.previous_response_id,
        stored_messages(request, message),
    )


def _usage(generation: Generation, reasoning_tokens: int) -> dict[str, Any]:
    prompt, completion = len(generation.prompt_token_ids), len(generation.token_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def _header_value(text: str) -> str:
    return urllib.parse.quote(text, safe=_HEADER_SAFE)


def _typed_sse(event: dict[str, Any]) -> bytes:
    """A Responses API event: its type as the SSE event name, the event as its data."""
    return f"event: {event['type']}\n".encode() + _sse(event)


def _turn_type(request: Request, default: str) -> str:
    value = (request.headers.get("x-turn-type") or default).lower()
    if value not in ("main", "side"):
        raise bad_request(f"X-Turn-Type must be 'main' or 'side'; got {value!r}", param="X-Turn-Type")
    return value


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")
