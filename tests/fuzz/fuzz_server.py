"""The fuzzed server's settings, shared by the fuzz modules (tests/fuzz/conftest.py builds the server).

`build_app` over the zero-cost echo backend, the real SmolLM2 tokenizer, a real spool file and
recorder, admin routes over an empty local checkpoint store, and one webhook mapping.
"""

from __future__ import annotations

from typing import Any

API_KEY, ADMIN_KEY, METRICS_KEY = "fuzz-api-key", "fuzz-admin-key", "fuzz-metrics-key"
INTERNAL_KEY = "fuzz-internal-key"
MAX_BODY_BYTES = 1_000_000
BODY_TIMEOUT_S = 2.0
WEBHOOKS = {
    "ticket": {"session_id": "$.session", "turn_id": "$.turn", "content": "$.text", "reward": "$.score"}
}
BODY_ROUTES: dict[str, dict[str, Any]] = {  # a valid body for each route that reads one
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/v1/orl/score": {"messages": [{"role": "user", "content": "hi"}], "response_token_ids": [1, 2]},
    "/v1/feedback": {"session_id": "s", "turn_id": "s/t0", "thumbs": 1},
    "/v1/rewards": {"session_id": "s", "turn_id": "s/t0", "reward": 1.0},
    "/v1/observations": {"session_id": "s", "turn_id": "s/t0", "source": "ci", "content": "ok"},
    "/v1/webhooks/ticket": {"session": "s", "turn": "s/t0", "text": "ok"},
    "/v1/sessions/start": {"task_id": "t"},
    "/admin/pin": {"version": 1},
}


def key_for(path: str) -> str:
    """The key a route takes: admin routes the admin key, /metrics the metrics key, the teacher's scoring
    the internal key, the rest the API key."""
    if path.startswith("/admin/"):
        return ADMIN_KEY
    return {"/metrics": METRICS_KEY, "/v1/orl/score": INTERNAL_KEY}.get(path, API_KEY)
