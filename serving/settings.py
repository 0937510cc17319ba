"""Settings of `orl serve` (every field is a flag and an environment variable)."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass
from typing import Literal

from orl.connectors.settings import (
    ConnectionSettings,
    PrecisionSettings,
    PromotionSettings,
    RunSettings,
    ThreadSettings,
    setting,
)
from orl.schemas.errors import ConfigError

PolicyBackend = Literal["transformers", "sglang"]
TurnType = Literal["main", "side"]  # side turns are served and recorded, never trained on
SpoolSync = Literal["full", "normal"]  # SQLite's synchronous=FULL / NORMAL in WAL mode
SPOOL_SYNC_MODES: tuple[str, ...] = typing.get_args(SpoolSync)


@dataclass(frozen=True)
class ServerAccessSettings:
    """Where orl's server listens and the keys it takes: `orl serve`'s, and `orl up`'s for the server it starts."""

    port: int = setting(8000, "ORL_PORT", "Port of the policy server.")
    api_keys: tuple[str, ...] = setting(
        (),
        "ORL_API_KEYS",
        "Comma-separated client bearer keys (orl serve: required; orl up: generated into keys.json if none).",
        secret=True,
    )
    tenant_keys: tuple[str, ...] = setting(
        (),
        "ORL_TENANT_KEYS",
        "Client keys of named tenants, TENANT=KEY comma separated (orl up: generated into keys.json for "
        "--tenants): each takes the client routes, and the sessions it opens are the tenant's "
        "(`orl forget --tenant TENANT`).",
        secret=True,
        advanced=True,
    )
    tenant_adapters: bool = setting(
        False,
        "ORL_TENANT_ADAPTERS",
        "One adapter per named tenant: each tenant's sessions train its own run <run>.<tenant> (orl up starts "
        "its trainer, and its gate with --gate), and the server answers the tenant with that run's newest "
        "version, with the shared run's until it has one.",
        advanced=True,
    )
    admin_key: str = setting(
        "",
        "ORL_ADMIN_KEY",
        "Bearer key of /admin (orl serve: required; orl up: generated into keys.json).",
        secret=True,
        advanced=True,
    )
    internal_key: str = setting(
        "",
        "ORL_INTERNAL_KEY",
        "Bearer key of orl's own components (the pipeline's judge and teacher, the promotion gate): the only "
        "key POST /v1/orl/score takes; it also takes the chat routes (orl up: generated into keys.json).",
        secret=True,
        advanced=True,
    )

    def named_tenants(self) -> dict[str, str]:
        """Each named tenant's client key, by tenant name (raises ConfigError on a malformed entry)."""
        return parse_tenant_keys(self.tenant_keys)

    def client_keys(self) -> tuple[str, ...]:
        """Every key that takes the client routes: --api-keys and the named tenants' keys."""
        return (*self.api_keys, *self.named_tenants().values())


TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")


def check_tenant_name(name: str) -> str:
    if not TENANT_NAME.fullmatch(name):
        raise ConfigError(
            f"tenant name {name!r}: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit"
        )
    return name


def parse_tenant_keys(entries: tuple[str, ...]) -> dict[str, str]:
    """{tenant: key} of --tenant-keys' TENANT=KEY entries: names valid and distinct, keys distinct."""
    tenants: dict[str, str] = {}
    for entry in entries:
        name, separator, key = entry.partition("=")
        if not separator or not key:
            raise ConfigError("--tenant-keys: each entry is TENANT=KEY (the key itself is not shown here)")
        if check_tenant_name(name) in tenants:
            raise ConfigError(f"--tenant-keys: tenant {name!r} is listed twice")
        if key in tenants.values():
            raise ConfigError(f"--tenant-keys: tenant {name!r} has another tenant's key")
        tenants[name] = key
    return tenants


@dataclass(frozen=True)
class ServeSettings(
    ConnectionSettings,
    ServerAccessSettings,
    RunSettings,
    PrecisionSettings,
    ThreadSettings,
    PromotionSettings,
):
    host: str = setting("127.0.0.1", "ORL_HOST", "Address to listen on.")
    backend: PolicyBackend = setting("transformers", "ORL_BACKEND", "Policy backend: transformers | sglang.")
    sglang_url: str = setting("", "ORL_SGLANG_URL", "Base URL of the SGLang server (backend sglang).")
    sglang_api_key: str = setting(
        "", "ORL_SGLANG_API_KEY", "API key of the SGLang server.", secret=True, advanced=True
    )
    served_model_name: str = setting("orl-policy", "ORL_SERVED_MODEL_NAME", "Model name shown to clients.")
    server_id: str = setting(
        "serve-0", "ORL_SERVER_ID", "Name of this server in PolicyActivated events.", advanced=True
    )
    default_turn_type: TurnType = setting(
        "main", "ORL_DEFAULT_TURN_TYPE", "Turn type without X-Turn-Type: main|side.", advanced=True
    )
    default_max_tokens: int = setting(256, "ORL_DEFAULT_MAX_TOKENS", "max_tokens when a request gives none.")
    max_tokens_limit: int = setting(
        4096, "ORL_MAX_TOKENS_LIMIT", "Largest max_tokens a request may ask for.", advanced=True
    )
    max_body_bytes: int = setting(
        4_000_000, "ORL_MAX_BODY_BYTES", "Largest request body accepted (bytes).", advanced=True
    )
    header_timeout_s: float = setting(
        10.0,
        "ORL_HEADER_TIMEOUT_S",
        "Longest a connection may take to send a request's headers (after it opens, or after the previous "
        "response); a slower one gets a 408 and is closed.",
        advanced=True,
    )
    body_timeout_s: float = setting(
        30.0,
        "ORL_BODY_TIMEOUT_S",
        "Longest a request body may take to arrive, however it is sent; a slower client gets a 408.",
        advanced=True,
    )
    max_batch_size: int = setting(
        16,
        "ORL_MAX_BATCH_SIZE",
        "Concurrent requests decoded together (transformers backend). SmolLM2-135M fp32 on 2 AVX2 cores: a "
        "decode step of 1 / 8 / 16 rows took 60 / 98 / 117 ms (decoding is memory-bound: every step reads "
        "the weights once, however many rows).",
    )
    prefix_cache_mib: int = setting(
        1024,
        "ORL_PREFIX_CACHE_MIB",
        "Prompt KV kept for reuse by later prompts that start the same way, in MiB (transformers backend; 0: "
        "off). SmolLM2-135M needs 45 KiB per token, so 1024 holds about 23k tokens: two or three 8k-token "
        "agent conversations.",
        advanced=True,
    )
    capture: bool = setting(
        True, "ORL_CAPTURE", "Record every turn as events (off only for benchmarks).", advanced=True
    )
    metrics_key: str = setting(
        "",
        "ORL_METRICS_KEY",
        "Bearer key that GET /metrics requires (empty: /metrics answers anyone who can reach the port, "
        "like /healthz and /readyz).",
        secret=True,
        advanced=True,
    )
    spool_sync: SpoolSync = setting(
        "full",
        "ORL_SPOOL_SYNC",
        "Durability of the spool's commits: full (fsync before a turn is answered: an acknowledged turn "
        "survives a power cut) | normal (survives a crash of the server, not of the machine; less disk "
        "wait per commit).",
        advanced=True,
    )
    max_concurrent_requests: int = setting(
        256,
        "ORL_MAX_CONCURRENT_REQUESTS",
        "Requests in progress at once (a stream counts until it ends); one more gets a 503 server_busy "
        "with Retry-After at once instead of waiting without bound (/healthz, /readyz, /metrics are not "
        "counted).",
        advanced=True,
    )
    spool_max_bytes: int = setting(
        1 << 30,
        "ORL_SPOOL_MAX_BYTES",
        "Byte cap of the spool: while this many bytes of events wait for the event log (it is down or "
        "refuses them), new turns get a 503 with Retry-After and /readyz says why; turns already taken "
        "on are still recorded.",
        advanced=True,
    )
    webhooks_file: str = setting(
        "",
        "ORL_WEBHOOKS_FILE",
        "JSON file of webhook mappings {name: {field: '$.path'}} for POST /v1/webhooks/{name}.",
        advanced=True,
    )
    follow_checkpoints: bool = setting(
        True, "ORL_FOLLOW_CHECKPOINTS", "Hot-swap to each published checkpoint."
    )
