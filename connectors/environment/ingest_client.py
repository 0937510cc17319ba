"""A small client of orl's ingest routes, for agents that run connectors on their side.

`IngestClient(base_url, api_key)` posts what a connector observed (POST /v1/observations), a reward
(/v1/rewards), feedback (/v1/feedback) and starts and ends sessions (/v1/sessions/...). A 4xx
answer raises `IngestError` carrying the server's reason. Writes nothing itself: the server puts
the events on `next_states` / `sessions`.
"""

from __future__ import annotations

from typing import Any

import httpx
from orl.connectors.environment.api import Observation
from orl.connectors.environment.outcome_events import observation_to_json
from orl.schemas.errors import OrlError


class IngestError(OrlError):
    """The ingest server refused a report; `status` is its HTTP status, the message its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class IngestClient:
    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 30.0) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/").removesuffix("/v1"),
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
        )

    def __enter__(self) -> IngestClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def start_session(self, task_id: str | None = None) -> str:
        return str(self._post("/v1/sessions/start", {"task_id": task_id} if task_id else {})["session_id"])

    def end_session(self, session_id: str) -> dict[str, Any]:
        return self._post(f"/v1/sessions/{session_id}/end", {})

    def observation(
        self, observation: Observation, *, session_id: str, source: str, turn_id: str | None = None
    ) -> dict[str, Any]:
        body = {
            "session_id": session_id,
            "turn_id": turn_id,
            "source": source,
            **observation_to_json(observation),
        }
        return self._post("/v1/observations", body)

    def reward(
        self, reward: float, *, session_id: str, turn_id: str | None = None, **detail: Any
    ) -> dict[str, Any]:
        body = {"session_id": session_id, "turn_id": turn_id, "reward": reward, "detail": detail or None}
        return self._post("/v1/rewards", body)

    def feedback(
        self,
        *,
        session_id: str,
        turn_id: str | None = None,
        thumbs: int | None = None,
        text: str | None = None,
    ) -> dict[str, Any]:
        body = {"session_id": session_id, "turn_id": turn_id, "thumbs": thumbs, "text": text}
        return self._post("/v1/feedback", body)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self._http.post(path, json={k: v for k, v in body.items() if v is not None})
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise IngestError(response.status_code, message)
        result: dict[str, Any] = response.json()
        return result
