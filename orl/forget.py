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
a new namespace and trains a new run on it from the base model (`orl replay --train-steps`).
Reads and writes: the key store; reads the namespace (audit index) and, with --retrain, writes a
new namespace and its checkpoints.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.key_store import ForgottenSession, KeyStore
from orl.connectors.settings import ConnectionSettings, JsonOutputSettings, same_deployment, setting
from orl.history import ReplaySettings, _store, run_replay
from orl.pipeline.history.audit import NotFound, audit_session
from orl.pipeline.history.audit_index import AuditIndex, index_path
from orl.schemas.errors import ConfigError
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


async def derived_from(settings: ForgetSettings, sessions: list[str]) -> dict[str, dict[str, Any]]:
    """Per session in the namespace: its samples and the training steps and checkpoints derived from them."""
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
    finally:
        index.close()
    return found


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
    lineage = asyncio.run(derived_from(settings, sessions))  # before the keys go (it reads envelopes only)
    destroyed = keys.forget_sessions(sessions)
    report = forget_report(settings.namespace, tenant, destroyed, lineage)
    print(json.dumps(report, indent=2) if settings.json else render_report(report))
    if not settings.retrain:
        return 0
    target = f"{settings.namespace}-retrain-{time.strftime('%Y%m%d%H%M%S')}"
    replay = ReplaySettings(
        **same_deployment(settings), namespace=settings.namespace, target_namespace=target,
        train_steps=settings.retrain_steps, progress=False,
    )  # fmt: skip
    print(f"retraining without them: orl replay --namespace {settings.namespace} --target-namespace {target} "
          f"--train-steps {settings.retrain_steps}")  # fmt: skip
    return run_replay(replay)


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
