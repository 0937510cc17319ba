"""HTTP ingest: feedback, rewards, connector observations, webhooks and session start.

Routes (same bearer keys as the OpenAI surface; `ingest_routes(state)` is registered by
`orl.serving.app.build_app`):

- POST /v1/feedback      {session_id, turn_id?, thumbs?: 1|-1, text?}: a user's verdict or
  correction; a NextStateObserved with source "feedback", role "user", content the text, outcome
  kind "thumbs" when thumbs is given.
- POST /v1/rewards       {session_id, turn_id?, reward, detail?}: an explicit reward (AReaL's
  set_reward); source "reward", outcome kind "reward".
- POST /v1/observations  {session_id, turn_id?, source, role?, content, outcome?, messages?}:
  what any connector observed (what `orl.connectors.environment.outcome_events.observation_to_json`
  writes).
- POST /v1/webhooks/{name}  arbitrary JSON, mapped by the named webhook mapping (source
  "webhook:<name>").
- POST /v1/sessions/start   {task_id?}: a fresh session id for the client to send as X-Session-Id
  (AReaL's start_session; POST /v1/sessions/{id}/end closes it).

Without turn_id, the session's last main turn (as this server assigned it) is the target. Every
malformed payload gets a 4xx JSON body naming the field. Writes next_states through the recorder.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orl.connectors.environment.api import Observation, Outcome
from orl.connectors.environment.outcome_events import (
    PayloadError,
    check_source,
    content_value,
    finite_number,
    observation_from_json,
    optional_str,
    required_str,
    thumbs_value,
)
from orl.connectors.environment.webhook import WebhookMapping, load_webhook_mappings
from orl.serving.openai_api import ApiError, bad_request, json_object
from orl.serving.request_guards import Handler, guard, read_body
from orl.serving.spool import SpoolFull
from orl.serving.tenancy import check_session_owner, request_key_id
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from orl.serving.app import ServerState

logger = logging.getLogger(__name__)


def ingest_routes(state: ServerState, webhooks: Mapping[str, WebhookMapping] | None = None) -> list[Route]:
    """The ingest routes, guarded by the server's API keys.

    `webhooks` defaults to the mappings in the file named by the `webhooks_file` setting (none
    when the setting is absent or empty).
    """
    if webhooks is None:
        path = state.settings.webhooks_file
        webhooks = load_webhook_mappings(path) if path else {}
    handlers = _IngestHandlers(state, dict(webhooks))
    keys = state.settings.client_keys()
    return [
        Route(path, guard(_rejections_counted(state, path, handler), keys), methods=["POST"])
        for path, handler in (
            ("/v1/feedback", handlers.feedback),
            ("/v1/rewards", handlers.reward),
            ("/v1/observations", handlers.observation),
            ("/v1/webhooks/{name}", handlers.webhook),
            ("/v1/sessions/start", handlers.start_session),
        )
    ]


def _rejections_counted(state: ServerState, route: str, handler: Handler) -> Handler:
    """PayloadError -> 400 naming the field, a full spool -> 503; every rejection is counted with its reason."""

    async def handle(request: Request) -> Response:
        try:
            state.recorder.spool.refuse_if_full()  # 503 (the server's error policy), counted here
            return await handler(request)
        except SpoolFull:
            state.metrics.count("ingest_rejected", route=route, reason="spool_full")
            raise
        except PayloadError as error:
            state.metrics.count("ingest_rejected", route=route, reason="invalid_payload")
            raise bad_request(str(error), param=error.field) from error
        except ApiError as error:
            state.metrics.count("ingest_rejected", route=route, reason=error.code or str(error.status))
            raise

    return handle


METRIC_SOURCES = ("feedback", "reward", "webhook")  # any other source is counted as "observation"


def _metric_source(source: str) -> str:
    """The `source` label of a next state: one of a fixed few (a client-chosen source would grow the
    metric's label set without bound)."""
    kind = source.split(":")[0]
    return kind if kind in METRIC_SOURCES else "observation"


class _IngestHandlers:
    def __init__(self, state: ServerState, webhooks: dict[str, WebhookMapping]) -> None:
        self.state = state
        self.webhooks = webhooks

    async def feedback(self, request: Request) -> Response:
        body = await self._body(request)
        thumbs = thumbs_value(body.get("thumbs"))
        text = body.get("text")
        if thumbs is None and text is None:
            raise PayloadError("give 'thumbs' (1 or -1), 'text' (a correction), or both", "thumbs")
        if text is not None:
            text = content_value(text, "text")
        content = text if text is not None else f"(the user gave a thumbs {'up' if thumbs == 1 else 'down'})"
        outcome = Outcome(kind="thumbs", thumbs=thumbs) if thumbs is not None else None
        return self._record(
            request, body, "feedback", Observation(content=content, role="user", outcome=outcome)
        )

    async def reward(self, request: Request) -> Response:
        body = await self._body(request)
        if body.get("reward") is None:  # null too: a reward of nothing is not a reward of 0
            raise PayloadError("'reward' is required (a finite number)", "reward")
        reward = finite_number(body["reward"], "reward")
        detail = body.get("detail")
        if detail is not None and not isinstance(detail, dict):
            raise PayloadError("'detail' must be an object", "detail")
        observation = Observation(
            content=f"(the environment reported a reward of {reward:g})",
            role="environment",
            outcome=Outcome(kind="reward", reward=reward, detail=detail),
        )
        return self._record(request, body, "reward", observation)

    async def observation(self, request: Request) -> Response:
        body = await self._body(request)
        source = check_source(body.get("source"))
        return self._record(request, body, source, observation_from_json(body))

    async def webhook(self, request: Request) -> Response:
        name = request.path_params["name"]
        mapping = self.webhooks.get(name)
        if mapping is None:
            known = ", ".join(sorted(self.webhooks)) or "none configured"
            raise ApiError(404, f"no webhook named {name!r} (known: {known})", code="unknown_webhook")
        target = mapping.apply(await self._body(request))
        return self._recorded(
            request, target.session_id, target.turn_id, f"webhook:{name}", target.observation
        )

    async def start_session(self, request: Request) -> Response:
        body = await self._body(request, allow_empty=True)
        task_id = optional_str(body, "task_id")
        session_id = self.state.tracker.new_session_id()
        self.state.recorder.spool.stage_session_owner(session_id, request_key_id(request))
        self.state.recorder.spool.commit()
        logger.info("session %s started (task %s)", session_id, task_id)
        return JSONResponse(
            {"session_id": session_id, "task_id": task_id, "headers": {"X-Session-Id": session_id}}
        )

    async def _body(self, request: Request, *, allow_empty: bool = False) -> dict[str, Any]:
        raw = await read_body(request, self.state.settings.max_body_bytes, self.state.settings.body_timeout_s)
        if allow_empty and not raw:
            return {}
        return json_object(raw)

    def _record(
        self, request: Request, body: dict[str, Any], source: str, observation: Observation
    ) -> Response:
        session_id = required_str(body, "session_id")
        return self._recorded(request, session_id, optional_str(body, "turn_id"), source, observation)

    def _recorded(
        self, request: Request, session_id: str, turn_id: str | None, source: str, observation: Observation
    ) -> Response:
        check_session_owner(self.state.recorder.spool, session_id, request)
        turn_id = turn_id or self._last_main_turn(session_id)
        event = self.state.recorder.next_state_observed(
            observation, session_id=session_id, turn_id=turn_id, source=source
        )
        self.state.metrics.count("next_states_ingested", source=_metric_source(source))
        return JSONResponse(
            {
                "event_id": event["envelope"]["event_id"],
                "session_id": session_id,
                "turn_id": turn_id,
                "source": source,
            },
            status_code=202,
        )

    def _last_main_turn(self, session_id: str) -> str:
        turn_id = self.state.tracker.last_main_turn(session_id)
        if turn_id is None:
            raise ApiError(
                409,
                f"no main turn is known for session {session_id!r} (never seen, or already ended): "
                "pass 'turn_id'",
                param="turn_id",
                code="unknown_turn",
            )
        return str(turn_id)
