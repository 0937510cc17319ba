"""Settings shared by every deployable: where the log, the object store and the model live, and the
groups several deployables compose (the run, numerics and threads, the server a client calls, JSON
output), each setting declared once.

A setting is a dataclass field whose metadata names its environment variable and its help text
(`setting(...)`). Entry points (`orl.cli`) turn the fields into command-line flags and read the
environment once at start-up; library code only ever receives the frozen object.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orl.connectors.event_log.topic_policy import DEFAULT_MAX_RECORD_BYTES, TopicPolicy
from orl.schemas.errors import ConfigError
from orl.schemas.ids import tenant_run
from orl.schemas.numerics import Precision


def setting(
    default: Any,
    env: str,
    help: str,
    *,
    secret: bool = False,
    positional: bool = False,
    advanced: bool = False,
) -> Any:
    """A dataclass field that is also a CLI flag (--name-with-dashes) and an environment variable.

    `positional`: the command line also takes the value as its one optional positional argument
    (`orl audit ID` as well as `orl audit --id ID`). `advanced`: a tuning knob that `--help` leaves
    out and `--help-all` shows, so that `--help` lists what a user sets on a first run."""
    metadata = {"env": env, "help": help, "secret": secret, "positional": positional, "advanced": advanced}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class RunSettings:
    """The training run whose checkpoints a process trains, gates or serves."""

    run_id: str = setting(
        "live",
        "ORL_RUN_ID",
        "Training run: its checkpoints are checkpoints/<run-id>/<version>/ in the store.",
    )


@dataclass(frozen=True)
class PromotionSettings:
    """Whether the stack follows the promotion gate (`orl gate`); `orl up --gate` sets it for all."""

    follow_promoted: bool = setting(
        False,
        "ORL_FOLLOW_PROMOTED",
        "Follow the promotion gate: a server serves only the checkpoints it promoted, not every published "
        "one; the trainer publishes at most max(1, --max-staleness) versions beyond the newest promoted one, "
        "then waits for the gate.",
    )


@dataclass(frozen=True)
class TenantSettings:
    """Whose sessions a run trains on, its gate draws prompts from and a report counts: one named
    tenant's (orl up --tenants, orl serve --tenant-keys; the key store names their sessions) or all."""

    tenant: str = setting(
        "",
        "ORL_TENANT",
        "Only this named tenant's sessions: orl train trains its own adapter, whose run id is <run>.<tenant> "
        "(what orl serve --tenant-adapters answers it with), orl gate gates it on her held-out sessions' "
        "prompts, orl report draws her own curve.",
        advanced=True,
    )


def check_tenant_run(
    run_id: str, tenant: str, key_store: Path | None, private_tenants: tuple[str, ...] = ()
) -> None:
    """A tenant's own run is named <run>.<tenant> (orl.schemas.ids.tenant_run), so that the server
    following <run> with --tenant-adapters finds it; it keeps that tenant's sessions only, so it skips
    no private tenant's; and a run limited to some tenants' sessions needs the key store that names them."""
    if tenant and not run_id.endswith(tenant_run("", tenant)):
        raise ConfigError(
            f"--tenant {tenant} is the tenant's own run, named <run>{tenant_run('', tenant)} (the run a server "
            f"following <run> with --tenant-adapters answers {tenant} with), not --run-id {run_id!r}"
        )
    if tenant and private_tenants:
        raise ConfigError(
            "--private-tenants is for the shared run: a --tenant run trains that tenant's sessions only"
        )
    if (tenant or private_tenants) and key_store is None:
        flag = "--tenant" if tenant else "--private-tenants"
        raise ConfigError(
            f"{flag}: runs limited to some tenants' sessions need the key store (it records whose each "
            "session is): --key-store is off"
        )


DEFAULT_GATED_HOLDOUT_SHARE = 0.1


@dataclass(frozen=True)
class HoldoutSettings:
    """The sessions the trainer never trains on and the promotion gate draws its prompts from."""

    holdout_share: float | None = setting(
        None,
        "ORL_HOLDOUT_SHARE",
        "Share of sessions held out (orl.schemas.ids.held_out_session): the trainer skips them, the "
        "promotion gate draws its prompts from them; give both the same value (`orl up` does). "
        "Default: 0.1 under `orl up` with its gate, else 0 (no gate reads them).",
    )

    def held_out(self, gate_reads_them: bool = False) -> float:
        """The share in force: as given, else 0.1 when a gate draws prompts from them, else 0."""
        if self.holdout_share is not None:
            return self.holdout_share
        return DEFAULT_GATED_HOLDOUT_SHARE if gate_reads_them else 0.0


@dataclass(frozen=True)
class ServerClientSettings:
    """How a client process (the pipeline's judge and teacher, `orl rollout`) reaches orl's server."""

    server_url: str = setting("http://127.0.0.1:8000/v1", "ORL_SERVER_URL", "orl server's OpenAI base URL.")
    api_key: str = setting(
        "",
        "ORL_API_KEY",
        "A bearer key of that server: one of its ORL_API_KEYS (orl rollout), or its ORL_INTERNAL_KEY (the "
        "pipeline and the gate: POST /v1/orl/score, the teacher's scoring, takes no other).",
        secret=True,
    )


@dataclass(frozen=True)
class PrecisionSettings:
    precision: Precision = setting(
        "auto",
        "ORL_PRECISION",
        "Numerics of the torch forwards: auto (bf16 autocast where the CPU or GPU runs bf16 natively, else "
        "fp32) | bf16 | fp32; weights stay fp32.",
    )


@dataclass(frozen=True)
class ThreadSettings:
    threads: int = setting(
        0,
        "ORL_THREADS",
        "torch threads while this process computes alone (0: every core it may use); while other torch "
        "processes of the same --data-dir compute, it uses its fair share.",
        advanced=True,
    )


@dataclass(frozen=True)
class JsonOutputSettings:
    json: bool = setting(False, "ORL_JSON", "Print JSON (one object per line) instead of text.")


@dataclass(frozen=True)
class ConnectionSettings:
    data_dir: Path = setting(Path(".orl"), "ORL_DATA_DIR", "Folder for the embedded log, objects and spools.")
    log_url: str = setting(
        "",
        "ORL_LOG_URL",
        "Event log: sqlite:///path.db or kafka://host:port (default: sqlite in --data-dir).",
    )
    store_url: str = setting(
        "",
        "ORL_STORE_URL",
        "Object store: file:///dir or s3://bucket?endpoint=host:port (default: a folder in --data-dir).",
    )
    s3_access_key: str = setting(
        "", "ORL_S3_ACCESS_KEY", "S3 access key (for an s3:// store).", secret=True, advanced=True
    )
    s3_secret_key: str = setting(
        "", "ORL_S3_SECRET_KEY", "S3 secret key (for an s3:// store).", secret=True, advanced=True
    )
    namespace: str = setting("live", "ORL_NAMESPACE", "Namespace of the topics to read and write.")
    topic_partitions: int = setting(
        1,
        "ORL_TOPIC_PARTITIONS",
        "Partitions of every topic this process creates (use the same value everywhere).",
        advanced=True,
    )
    log_replication_factor: int = setting(
        0,
        "ORL_LOG_REPLICATION_FACTOR",
        "Kafka: replicas of every topic this process creates (0: min(3, the cluster's brokers)).",
        advanced=True,
    )
    log_min_insync_replicas: int = setting(
        0,
        "ORL_LOG_MIN_INSYNC_REPLICAS",
        "Kafka: min.insync.replicas of the topics it creates (0: 2 with 3 or more replicas, else 1).",
        advanced=True,
    )
    max_record_bytes: int = setting(
        DEFAULT_MAX_RECORD_BYTES,
        "ORL_MAX_RECORD_BYTES",
        "Largest encoded event recorded on the log: the server answers 413 to a turn over it; the Kafka "
        "producer's max_request_size and the topics' max.message.bytes follow from it.",
        advanced=True,
    )
    key_store: str = setting(
        "",
        "ORL_KEY_STORE",
        "Sessions' data keys (every session's payloads are sealed with its own; `orl forget` destroys them): "
        "a SQLite file every process reaches (default: keys.db in --data-dir), or 'off' to write in clear.",
        advanced=True,
    )
    model: str = setting(
        "smollm2-135m", "ORL_MODEL", "Base model: 'smollm2-135m' (shipped) or a Hugging Face folder path."
    )
    model_cache_dir: Path = setting(
        Path.home() / ".cache" / "orl" / "models",
        "ORL_MODEL_CACHE",
        "Where converted models are cached.",
        advanced=True,
    )

    def effective_log_url(self) -> str:
        return self.log_url or f"sqlite:///{(self.data_dir / 'log.db').resolve()}"

    def effective_key_store(self) -> Path | None:
        """The key store's file; None when sealing is off."""
        if self.key_store == "off":
            return None
        return Path(self.key_store) if self.key_store else (self.data_dir / "keys.db").resolve()

    def topic_policy(self) -> TopicPolicy:
        return TopicPolicy(self.log_replication_factor, self.log_min_insync_replicas, self.max_record_bytes)

    def effective_store_url(self) -> str:
        return self.store_url or f"file://{(self.data_dir / 'objects').resolve()}"


def same_deployment(settings: ConnectionSettings) -> dict[str, Any]:
    """The connection settings of `settings` but its namespace (log, store, key store, topic policy,
    model), as keywords for another command's settings that must reach the same deployment."""
    return {
        f.name: getattr(settings, f.name)
        for f in dataclasses.fields(ConnectionSettings)
        if f.name != "namespace"
    }


def settings_env(settings: object, only: Iterable[str] | None = None) -> dict[str, str]:
    """The settings (the fields named in `only`, else all) as the environment variables that give them
    back: the one way a child process gets its settings (`orl.cli` reads them like any environment).
    Tuples are comma-joined, booleans true/false, None empty."""
    chosen = None if only is None else set(only)
    env = {}
    for f in dataclasses.fields(settings):  # type: ignore[arg-type]
        name, value = f.metadata.get("env"), getattr(settings, f.name)
        if not name or (chosen is not None and f.name not in chosen):
            continue
        env[name] = setting_text(value)
    return env


def setting_text(value: object) -> str:
    """A setting's value as its flag or environment variable gives it: tuples comma-joined, booleans
    true/false, None empty."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(part) for part in value)
    return "" if value is None else str(value)


def masked(settings: object) -> dict[str, str]:
    """The settings as strings for logging, with secrets replaced by '***' (or '' when unset)."""
    if not dataclasses.is_dataclass(settings):
        raise ConfigError(f"not a settings object: {settings!r}")
    shown = {}
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.metadata.get("secret"):
            shown[f.name] = "***" if value else ""
        else:
            shown[f.name] = str(value)
    return shown


def group_env(settings: object, *groups: type) -> dict[str, str]:
    """The fields `settings` has from these shared groups, as the environment variables that give them
    back: how `orl up` passes a child the group it shares with it, not a copy of its fields."""
    return settings_env(settings, [f.name for group in groups for f in dataclasses.fields(group)])
