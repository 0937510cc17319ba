"""`orl forget`: erase a session's or a tenant's data from an immutable log by destroying its data keys.

Every event that names a session is sealed with that session's data key (orl.schemas.sealing), and
so are the processors' session states and the server's stored Responses API conversations. `orl
forget --session S` (or `--tenant NAME`: every session of a named tenant; `--client-key KEY`: every
session the client key KEY opened) destroys those keys
in the key store (orl.connectors.key_store). From then on every copy of those payloads is
unreadable, wherever it went: the log, its archives, exports, replays, spools and changelogs.
Readers skip such events and say how many (`orl export` writes their envelopes with
`"payload_forgotten": true`); ids, order and lineage stay.

Before the keys go, the command lists what was derived from the data (`orl audit --session`): the
samples, the training steps that consumed them and the checkpoints those steps published, which
still carry what was learned. `--retrain` then replays the namespace (what can still be read) into
a new namespace and replaces each of those runs with a new one trained there from the base model on
what it trained on, less the forgotten sessions (`retrain_plan`): a tenant's own run on her sessions
left, a shared run on every session but those of the named tenants it never trained on.
Reads and writes: the key store; reads the namespace (audit index, samples and train steps) and,
with --retrain, writes a new namespace and its checkpoints.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.key_store import ForgottenSession, KeyStore, SessionTenants
from orl.connectors.settings import ConnectionSettings, JsonOutputSettings, same_deployment, setting
from orl.history import ReplaySettings, _store, replay_namespace, train_replayed
from orl.pipeline.history.audit import NotFound, audit_session
from orl.pipeline.history.audit_index import AuditIndex, index_path
from orl.pipeline.history.namespace_io import read_events
from orl.schemas.errors import ConfigError
from orl.schemas.ids import tenant_run
from orl.schemas.topics import topic_name
from orl.serving.tenancy import key_id


@dataclass(frozen=True)
class ForgetSettings(ConnectionSettings, JsonOutputSettings):
    session: tuple[str, ...] = setting((), "ORL_FORGET_SESSION", "Sessions to forget (comma separated).")
    tenant: str = setting(
        "",
        "ORL_FORGET_TENANT",
        "Instead of --session: forget every session of this named tenant (--tenant-keys).",
    )
    client_key: str = setting(
        "",
        "ORL_FORGET_CLIENT_KEY",
        "Instead of --session: forget every session this client API key opened (a key of --api-keys).",
        secret=True,
    )
    retrain: bool = setting(
        False,
        "ORL_FORGET_RETRAIN",
        "Then replay what is left of the namespace into a new one and train a new run there from the base model.",
    )
    retrain_steps: int = setting(8, "ORL_FORGET_RETRAIN_STEPS", "Training steps of the --retrain run.")


@dataclass(frozen=True)
class Retraining:
    """How --retrain replaces one run trained on forgotten data: a new run on the replayed namespace,
    trained on what the old one trained on, less the forgotten sessions."""

    run_id: str
    new_run_id: str
    tenant: str = ""  # a tenant's own run: her sessions only
    private_tenants: tuple[str, ...] = ()  # a shared run: the named tenants it never trained on
    nothing_left: bool = False  # a tenant's own run whose every session is forgotten


def retrain_plan(
    runs: set[str],
    namespace: str,
    target: str,
    named_tenants: set[str],
    trained: dict[str, set[str | None]],
    tenants_left: set[str],
) -> list[Retraining]:
    """One Retraining per run in `runs`. A run named <run>.<tenant> for a named tenant is her own run
    (orl.schemas.ids.tenant_run), renamed <new run>.<tenant> so that a server following the new run
    with --tenant-adapters finds it. A shared run keeps out the named tenants whose sessions none of
    its steps trained on (`trained`: per run, the tenants it did; None for unnamed keys). The shared
    run named like the namespace becomes the target namespace's; another run R becomes <target>-R."""
    plan = []
    for run_id in sorted(runs):
        tenant = next((t for t in sorted(named_tenants) if run_id.endswith(tenant_run("", t))), "")
        base = run_id.removesuffix(tenant_run("", tenant)) if tenant else run_id
        new_base = target if base == namespace else f"{target}-{base}"
        if tenant:
            left = tenant in tenants_left
            plan.append(
                Retraining(run_id, tenant_run(new_base, tenant), tenant=tenant, nothing_left=not left)
            )
        else:
            private = tuple(sorted(named_tenants - trained.get(run_id, set())))
            plan.append(Retraining(run_id, new_base, private_tenants=private))
    return plan


async def derived_from(
    settings: ForgetSettings, sessions: list[str], keys: KeyStore
) -> tuple[dict[str, dict[str, Any]], dict[str, set[str | None]]]:
    """Per session in the namespace: its samples and the training steps and checkpoints derived from
    them; and per run, the named tenants it trained on (`trained_tenants`)."""
    index = AuditIndex(index_path(settings.data_dir, settings.namespace), settings.namespace)
    found: dict[str, dict[str, Any]] = {}
    try:
        store = _store(settings)
        async with open_event_log(settings.effective_log_url(), settings.topic_policy()) as log:
            for session_id in sessions:
                try:
                    found[session_id] = await audit_session(log, index, session_id, store)
                except NotFound:
                    continue  # a session of another namespace: its keys go all the same
            trained = await trained_tenants(log, settings.namespace, keys) if settings.retrain else {}
    finally:
        index.close()
    return found, trained


async def trained_tenants(log: EventLog, namespace: str, keys: KeyStore) -> dict[str, set[str | None]]:
    """Per run that trained in the namespace, the named tenants (None: unnamed client keys) whose
    sessions' samples its steps consumed, as the key store names them."""
    session_of = {
        sample["envelope"]["event_id"]: sample["envelope"]["session_id"]
        async for sample in read_events(log, topic_name(namespace, "samples"))
    }
    tenants = SessionTenants(keys)
    trained: dict[str, set[str | None]] = {}
    async for step in read_events(log, topic_name(namespace, "train_steps")):
        names = trained.setdefault(step["run_id"], set())
        names.update(tenants.name_of(session_of[s]) for s in step["sample_ids"] if s in session_of)
    return trained


def _sessions(settings: ForgetSettings, keys: KeyStore) -> tuple[list[str], str | None]:
    """The sessions to forget, and the tenant they are (its name, or the client key's id)."""
    if sum(map(bool, (settings.session, settings.tenant, settings.client_key))) != 1:
        raise ConfigError("give exactly one of --session S[,S2...], --tenant NAME or --client-key KEY")
    if settings.session:
        return sorted(set(settings.session)), None
    if settings.tenant:
        sessions = keys.sessions_of_named_tenant(settings.tenant)
        if not sessions:
            raise ConfigError(f"tenant {settings.tenant!r} has opened no session yet: nothing to forget")
        return sessions, settings.tenant
    tenant = key_id(settings.client_key.encode("utf-8", "surrogatepass"))
    sessions = keys.sessions_of_tenant(tenant)
    if not sessions:
        raise ConfigError(f"the key store {keys.path} has no session opened by that client key (id {tenant})")
    return sessions, tenant


def forget(settings: ForgetSettings) -> int:
    path = settings.effective_key_store()
    if path is None:
        raise ConfigError(
            "--key-store is off: this deployment writes payloads in clear, there is no key to destroy"
        )
    keys = KeyStore(path)
    sessions, tenant = _sessions(settings, keys)
    lineage, trained = asyncio.run(derived_from(settings, sessions, keys))  # before the keys go
    destroyed = keys.forget_sessions(sessions)
    report = forget_report(settings.namespace, tenant, destroyed, lineage)
    print(json.dumps(report, indent=2) if settings.json else render_report(report))
    if not settings.retrain:
        return 0
    target = f"{settings.namespace}-retrain-{time.strftime('%Y%m%d%H%M%S')}"
    named = set(keys.tenant_names().values())
    forgotten = keys.forgotten_sessions()
    left = {name for name in named if set(keys.sessions_of_named_tenant(name)) - forgotten}
    runs = {c["run_id"] for c in report["checkpoints"]}
    plan = retrain_plan(runs, settings.namespace, target, named, trained, left)
    if not plan:
        print("no run was trained on their data: nothing to retrain")
        return 0
    return retrain(settings, target, plan)


def retrain(settings: ForgetSettings, target: str, plan: list[Retraining]) -> int:
    """Replay what is left of the namespace into `target`, then train each run of the plan there."""
    replay = ReplaySettings(
        **same_deployment(settings), namespace=settings.namespace, target_namespace=target,
        train_steps=settings.retrain_steps, progress=False,
    )  # fmt: skip
    print(f"retraining without them: orl replay --namespace {settings.namespace} --target-namespace {target} "
          f"(then {len(plan)} runs, {settings.retrain_steps} steps each)")  # fmt: skip
    if code := replay_namespace(replay):
        return code
    for run in plan:
        if run.nothing_left:
            print(f"run {run.run_id}: every session it trained on is forgotten, nothing is left to retrain it "
                  f"on; its checkpoints (above) still carry what it learned")  # fmt: skip
            continue
        print(f"run {run.run_id} is replaced by run {run.new_run_id}")
        if code := train_replayed(replay, run.new_run_id, run.tenant, run.private_tenants):
            return code
    return 0


def forget_report(
    namespace: str, tenant: str | None, destroyed: list[ForgottenSession], lineage: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    checkpoints: dict[tuple[str, int], dict[str, Any]] = {}
    for chain in lineage.values():
        for checkpoint in chain["checkpoints"]:
            entry = checkpoints.setdefault(
                (checkpoint["run_id"], checkpoint["version"]), {**checkpoint, "samples": []}
            )
            entry["samples"] = sorted({*entry["samples"], *checkpoint["samples"]})
        derived_list = chain.get("derived_checkpoints", [])
        for derived in (
            derived_list if isinstance(derived_list, list) else []
        ):  # a str: the store was unavailable
            key = (derived["run_id"], derived["version"])
            checkpoints.setdefault(key, {**derived, "derived": True})
    return {
        "namespace": namespace,
        "tenant": tenant,
        "sessions": [
            {
                "session_id": s.session_id,
                "keys_destroyed": s.keys_destroyed,
                "samples_ready": lineage.get(s.session_id, {}).get("samples_ready", 0),
            }
            for s in destroyed
        ],  # fmt: skip
        "checkpoints": [checkpoints[key] for key in sorted(checkpoints)],
    }


def render_report(report: dict[str, Any]) -> str:
    sessions = report["sessions"]
    keys = sum(s["keys_destroyed"] for s in sessions)
    owner = f" of tenant {report['tenant']}" if report["tenant"] else ""
    lines = [
        f"forgot {len(sessions)} sessions{owner}: {keys} data keys destroyed; their payloads can no longer be "
        "read anywhere (log, archives, exports, replays, spools)"
    ]
    lines += [f"  session {s['session_id']}: {s['samples_ready']} samples ready" for s in sessions]
    if not report["checkpoints"]:
        lines.append(f"no checkpoint in namespace {report['namespace']!r} was trained on their samples")
        return "\n".join(lines)
    lines.append(
        "checkpoints derived from their data (they still carry what was learned; --retrain replaces them):"
    )
    for c in report["checkpoints"]:
        how = (
            "started from one of these"
            if c.get("derived")
            else f"step {c.get('train_step')}, {len(c['samples'])} samples"
        )
        lines.append(f"  run {c['run_id']} v{c['version']} ({how}) {c.get('checkpoint_uri', '')}".rstrip())
    return "\n".join(lines)
