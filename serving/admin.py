"""Admin endpoints (admin key only): which policy is served, pin a version, unpin, roll back.

Pin, unpin and rollback act on the main run, or on a tenant's own run named by "run" in the body
(`{"run": "live.alice"}`, --tenant-adapters): each tenant run has its own rollback."""

from __future__ import annotations

from collections.abc import Sequence

from orl.connectors.event_log.base import EventLogError
from orl.schemas.errors import CheckpointError
from orl.serving.checkpoint_follower import CheckpointFollower
from orl.serving.openai_api import ApiError, bad_request, json_object
from orl.serving.request_guards import read_body
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

MAX_BODY_BYTES = 4096  # {"version": n} and nothing else


def admin_routes(
    follower: CheckpointFollower, tenant_followers: Sequence[CheckpointFollower] = ()
) -> list[Route]:
    """Pin, unpin and roll back the main run or a tenant run; GET /admin/policy also lists the tenant
    runs' versions (--tenant-adapters; null: none of its versions is served yet, the tenant gets the
    main policy)."""
    by_run = {f.run_id: f for f in (follower, *tenant_followers)}

    async def request_run(request: Request) -> tuple[dict[str, object], CheckpointFollower]:
        """The body (empty: {}) and the follower of the run it names (none: the main run's)."""
        raw = await read_body(request, MAX_BODY_BYTES)
        body = json_object(raw) if raw.strip() else {}
        run = body.get("run", follower.run_id)
        if not isinstance(run, str) or run not in by_run:
            known = ", ".join(repr(name) for name in by_run)
            raise bad_request(
                f"'run' must name a run this server follows ({known}), not {run!r}", param="run"
            )
        return body, by_run[run]

    async def policy(request: Request) -> Response:
        tenant_runs = {f.run_id: f.backend.version_of(f.backend_run) for f in tenant_followers}
        return JSONResponse({**_status(follower), "tenant_runs": tenant_runs})

    async def pin(request: Request) -> Response:
        body, follower = await request_run(request)
        if "version" not in body:
            raise bad_request('body must be {"version": <int>}', param="version")
        version = body["version"]
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise bad_request("'version' must be a positive integer", param="version")
        try:
            activated = await follower.pin(version)
        except CheckpointError as error:
            raise bad_request(str(error), param="version", code="checkpoint_unavailable") from error
        except EventLogError as error:  # the published versions are on the log, which cannot be read now
            raise ApiError(
                503,
                f"the event log cannot be read to check v{version} against its publication: {error}; retry later",
                code="log_unavailable",
                error_type="server_error",
            ) from error
        return JSONResponse(
            {**_status(follower), "activated": activated}, status_code=200 if activated else 409
        )

    async def unpin(request: Request) -> Response:
        _, follower = await request_run(request)
        follower.unpin()
        return JSONResponse(_status(follower))

    async def rollback(request: Request) -> Response:
        _, follower = await request_run(request)
        try:
            await follower.rollback()
        except CheckpointError as error:
            raise bad_request(str(error), code="nothing_to_roll_back") from error
        return JSONResponse(_status(follower))

    return [
        Route("/admin/policy", policy, methods=["GET"]),
        Route("/admin/pin", pin, methods=["POST"]),
        Route("/admin/unpin", unpin, methods=["POST"]),
        Route("/admin/rollback", rollback, methods=["POST"]),
    ]


def _status(follower: CheckpointFollower) -> dict[str, object]:
    """The run's served version (a tenant run: 0 while none of its versions is loaded)."""
    return {
        "run_id": follower.run_id,
        "policy_version": follower.served_version,
        "pinned": follower.pinned,
        "served_versions": [ref.version for ref in follower.history],
    }
