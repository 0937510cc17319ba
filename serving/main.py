"""`orl serve`: wires the policy backend, the recorder (spool -> event log) and the HTTP app, then serves.

Reads: nothing at start but the model folder; while running, the checkpoints topic (hot swap).
Writes: requests, responses, sessions, policy_activations (through the spool).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import uvicorn
from orl.compute.machine import CoreBoard, available_cores, resolved_numerics
from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.metrics import Metrics
from orl.connectors.model_files import resolve_model
from orl.connectors.object_store.factory import open_object_store
from orl.schemas.codec import installed_data_keys
from orl.schemas.errors import ConfigError
from orl.schemas.ids import tenant_run
from orl.schemas.topics import topic_name
from orl.serving.admin import admin_routes
from orl.serving.app import ServerState, build_app
from orl.serving.capture import EventRecorder
from orl.serving.checkpoint_follower import CheckpointFollower
from orl.serving.header_deadline import header_deadline_protocol
from orl.serving.policy.base import PolicyBackend
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.session_tracker import SessionTracker
from orl.serving.settings import ServeSettings
from orl.serving.spool import EventSpool, SpoolDrainer
from orl.serving.tenancy import key_id

# How long an idle keep-alive connection stays open. uvicorn's default, 5 s, equals the expiry of
# httpx's pool (the openai SDK's and the demo's client): a request sent on a pooled connection just as
# the server closes it fails with a read error (it cost a 32-step demo run). Well above the clients'.
KEEP_ALIVE_S = 75

logger = logging.getLogger(__name__)


def check_settings(settings: ServeSettings) -> None:
    client_keys = settings.client_keys()
    if not client_keys:
        raise ConfigError(
            "no API key: set --api-keys / ORL_API_KEYS or --tenant-keys / ORL_TENANT_KEYS (orl never serves "
            "without authentication)"
        )
    if set(settings.api_keys) & set(settings.named_tenants().values()):
        raise ConfigError("a named tenant's key (--tenant-keys) must not be in --api-keys too")
    if not settings.admin_key:
        raise ConfigError("no admin key: set --admin-key / ORL_ADMIN_KEY")
    if settings.admin_key in client_keys:
        raise ConfigError("--admin-key must differ from every client key (--api-keys, --tenant-keys)")
    if settings.internal_key and settings.internal_key in (*client_keys, settings.admin_key):
        raise ConfigError("--internal-key must differ from --admin-key and from every client key")
    if settings.threads < 0:
        raise ConfigError(f"--threads must be >= 0, not {settings.threads}")
    if settings.max_concurrent_requests <= 0:
        raise ConfigError(f"--max-concurrent-requests must be > 0, not {settings.max_concurrent_requests}")
    if settings.spool_max_bytes <= 0:
        raise ConfigError(f"--spool-max-bytes must be > 0, not {settings.spool_max_bytes}")
    if settings.header_timeout_s <= 0:
        raise ConfigError(f"--header-timeout-s must be > 0, not {settings.header_timeout_s}")
    if settings.tenant_adapters and not settings.named_tenants():
        raise ConfigError(
            "--tenant-adapters answers each named tenant with its own run: name them with --tenant-keys"
        )


def build_backend(settings: ServeSettings) -> tuple[PolicyBackend, ChatTemplate]:
    model_dir = resolve_model(settings.model, settings.model_cache_dir)
    template = ChatTemplate.from_dir(model_dir)
    if settings.backend == "sglang":
        from orl.serving.policy.sglang_backend import SGLangBackend

        if not settings.sglang_url:
            raise ConfigError("--backend sglang needs --sglang-url / ORL_SGLANG_URL")
        backend: PolicyBackend = SGLangBackend(
            settings.sglang_url,
            api_key=settings.sglang_api_key or None,
            model_name=settings.served_model_name,
            tokenizer_dir=model_dir,
        )
        return backend, template
    from orl.serving.policy.transformers_backend import TransformersBackend

    backend = TransformersBackend(
        model_dir,
        model_name=settings.served_model_name,
        autocast_dtype=resolved_numerics(settings.precision, "cpu").autocast_dtype,
        max_batch_size=settings.max_batch_size,
        prefix_cache_bytes=settings.prefix_cache_mib << 20,
        core_board=CoreBoard(settings.data_dir / "cores", settings.threads or available_cores()),
    )
    return backend, template


@dataclass
class RunningServer:
    state: ServerState
    drainer: SpoolDrainer
    log: EventLog
    follower: CheckpointFollower
    background: asyncio.Task[None]  # connects the log, drains the spool, follows checkpoints: never ends
    tenant_followers: list[CheckpointFollower]  # --tenant-adapters: one per named tenant's own run


@asynccontextmanager
async def running_server(
    settings: ServeSettings, backend: PolicyBackend | None = None, template: ChatTemplate | None = None
) -> AsyncIterator[RunningServer]:
    """Everything `orl serve` runs, minus the HTTP listener: tests drive `build_app(state)` directly."""
    check_settings(settings)
    name_tenants(settings)
    if backend is None or template is None:
        backend, template = build_backend(settings)
    log = open_event_log(settings.effective_log_url(), settings.topic_policy(), client_id="orl-serve")
    spool = EventSpool(
        settings.data_dir / f"spool-{settings.server_id}.db",
        sync=settings.spool_sync,
        max_bytes=settings.spool_max_bytes,
    )
    metrics = Metrics()
    drainer = SpoolDrainer(spool, log, metrics=metrics)
    spool.on_committed = drainer.wake
    recorder = EventRecorder(
        spool,
        settings.namespace,
        clock_ms=lambda: int(time.time() * 1000),
        enabled=settings.capture,
        max_record_bytes=settings.max_record_bytes,
    )
    store = open_object_store(
        settings.effective_store_url(),
        access_key=settings.s3_access_key or None,
        secret_key=settings.s3_secret_key or None,
    )

    def follower_of(run_id: str, tenant: bool) -> CheckpointFollower:
        return CheckpointFollower(
            backend,
            store,
            recorder,
            metrics,
            run_id,
            settings.server_id,
            settings.data_dir / "served-checkpoints",
            log,
            settings.namespace,
            promoted_only=settings.follow_promoted,
            tenant_run=tenant,
        )

    follower = follower_of(settings.run_id, tenant=False)
    tenant_runs = own_tenant_runs(settings)
    tenant_followers = [follower_of(run, tenant=True) for run in sorted(set(tenant_runs.values()))]
    state = ServerState(
        settings,
        backend,
        template,
        recorder,
        metrics,
        tracker=SessionTracker(stored_next_turn_index=spool.next_turn_index),
        admin_routes=admin_routes(follower, tenant_followers),
        drainer=drainer,
        follower=follower if settings.follow_checkpoints else None,  # not ready before it caught up
        tenant_runs=tenant_runs,
    )
    await backend.start()
    background = asyncio.create_task(_background(log, settings, drainer, [follower, *tenant_followers]))
    try:
        state.ready = True
        yield RunningServer(state, drainer, log, follower, background, tenant_followers)
    finally:
        state.ready = False
        background.cancel()
        await asyncio.gather(background, return_exceptions=True)
        await backend.close()
        await log.close()
        spool.close()


def own_tenant_runs(settings: ServeSettings) -> dict[str, str]:
    """With --tenant-adapters, the run that answers each named tenant's client key (by key id): the
    tenant's own (orl.schemas.ids.tenant_run); empty without."""
    if not settings.tenant_adapters:
        return {}
    return {
        key_id(key.encode("utf-8", "surrogatepass")): tenant_run(settings.run_id, name)
        for name, key in settings.named_tenants().items()
    }


def name_tenants(settings: ServeSettings) -> None:
    """Record each named tenant's client key id in the key store, so that `orl forget --tenant NAME`
    finds its sessions without the key (the key store keeps no key, only its id)."""
    keys = installed_data_keys()
    if keys is None:
        return
    for name, key in settings.named_tenants().items():
        keys.name_tenant(key_id(key.encode("utf-8", "surrogatepass")), name)


async def _background(
    log: EventLog, settings: ServeSettings, drainer: SpoolDrainer, followers: list[CheckpointFollower]
) -> None:
    """Connect to the log (retrying while it is down: requests are answered meanwhile), then drain the
    spool and follow checkpoints forever."""
    delay = 0.5
    while True:
        try:
            await log.start()
            await create_catalog_topics(log, settings.namespace, settings.topic_partitions)
            warning = await log.power_cut_warning(topic_name(settings.namespace, "requests"))
            break
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - any connection failure: keep spooling and retry
            drainer.problem = f"the event log is not reachable yet: {type(error).__name__}: {error}"
            logger.warning("%s; retrying in %.1f s", drainer.problem, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    drainer.problem = None
    if warning is not None:
        logger.warning("durability: %s", warning)
    tasks = [drainer.run()]
    if settings.follow_checkpoints:
        tasks.extend(follower.follow() for follower in followers)
    await asyncio.gather(*tasks)


def serve(settings: ServeSettings) -> int:
    """Entry point of `orl serve`."""
    check_settings(settings)

    async def main() -> int:
        async with running_server(settings) as server:
            config = uvicorn.Config(
                build_app(server.state),
                host=settings.host,
                port=settings.port,
                log_level="warning",
                access_log=False,
                timeout_keep_alive=KEEP_ALIVE_S,
                http=header_deadline_protocol(settings.header_timeout_s),
            )
            logger.info(
                "serving %s on http://%s:%d/v1", settings.served_model_name, settings.host, settings.port
            )
            return await _serve_until_background_ends(uvicorn.Server(config), server.background)

    return asyncio.run(main())


async def _serve_until_background_ends(http: uvicorn.Server, background: asyncio.Task[None]) -> int:
    """Serve HTTP until uvicorn stops (0) or the background task ends, which it never does while
    the server is healthy (1: the spool no longer drains, so the supervisor must restart us)."""
    listening = asyncio.create_task(http.serve())
    await asyncio.wait({listening, background}, return_when=asyncio.FIRST_COMPLETED)
    if not background.done():
        return 0
    error = None if background.cancelled() else background.exception()
    logger.critical(
        "the spool drain and checkpoint follower task ended (%r): the server stops so that its "
        "supervisor restarts it",
        error,
        exc_info=error,
    )
    http.should_exit = True
    await listening
    return 1
