"""`orl up`: the embedded stack as separate local processes (server, pipeline, trainer), supervised.

Each component is its own `orl <command>` process sharing one data folder (the SQLite log and the
object-store directory live there), so a crash of one is survivable: the supervisor restarts it
and it resumes from its committed offsets / latest checkpoint. Logs go to <data-dir>/logs/.
Keys: if none are given, random ones are generated once and kept in <data-dir>/keys.json (mode 0600,
written atomically; the data folder is created 0700).
Compute: every torch process (server, trainer) gets `--cores` threads to use while it computes alone
and shares them fairly while both compute (`orl.compute.machine.CoreBoard`); OpenMP threads wait
passively; numerics follow `--precision`. The choice is logged at start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orl.compute.machine import available_cores, cpu_model_name, resolved_numerics
from orl.connectors.settings import (
    ConnectionSettings,
    HoldoutSettings,
    PrecisionSettings,
    RunSettings,
    group_env,
    setting,
)
from orl.pipeline.processors.config import SampleMethod
from orl.pipeline.runtime.main import method_stage_names
from orl.pipeline.runtime.settings import (
    JudgeChoiceSettings,
    JudgeEndpointSettings,
    PipelineMetricsSettings,
    SignalSettings,
    TeacherSettings,
    resolved_judges,
)
from orl.rules.top_k import check_opd_topk
from orl.schemas.errors import ConfigError
from orl.schemas.ids import tenant_run
from orl.serving.settings import ServerAccessSettings, check_tenant_name
from orl.settings_binding import CONFIG_ENV, ConfigFile, config_from_environment
from orl.stack_settings import StackSettings
from orl.supervised import SUPERVISOR_PID_ENV
from orl.trainer.settings import OpdLossSettings, TrainBatchSettings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpSettings(
    ConnectionSettings,
    ServerAccessSettings,
    StackSettings,
    RunSettings,
    PrecisionSettings,
    SignalSettings,
    JudgeEndpointSettings,
    JudgeChoiceSettings,
    TeacherSettings,
    PipelineMetricsSettings,
    TrainBatchSettings,
    OpdLossSettings,
    HoldoutSettings,
):
    components: tuple[str, ...] = setting(
        ("serve", "pipeline", "train"), "ORL_COMPONENTS", "Which processes to start."
    )
    tenants: tuple[str, ...] = setting(
        (),
        "ORL_TENANTS",
        "Named tenants, comma separated: each gets a client key of its own, kept in keys.json under "
        "tenant_keys; a tenant's sessions are its own (`orl forget --tenant NAME` erases them).",
    )
    shared_tenants: tuple[str, ...] = setting(
        (),
        "ORL_SHARED_TENANTS",
        "With --tenant-adapters: the named tenants whose sessions also train the shared run, which answers "
        "every tenant until its own run has a version (opt-in: the others' train their own adapter only).",
        advanced=True,
    )


@dataclass(frozen=True)
class RewardSignal:
    """Where the stack's rewards and hints come from, as the pipeline is told (ORL_JUDGE, ORL_HINT_JUDGE)."""

    judge: str
    hint_judge: str
    description: str


def reward_signal(settings: UpSettings) -> RewardSignal:
    """`auto` resolved (`resolved_judges`): an LLM judge when a judge endpoint is given; else rules that
    need no model.

    A small served model (SmolLM2-135M on a CPU) cannot judge: most of its votes do not parse. So
    without --judge-url the stack judges by rules over the next state (explicit feedback, outcome
    connectors, then the user's next message) and says so at start.
    """
    judge, hint = resolved_judges(settings.judge, settings.hint_judge, settings.judge_url)
    where = f"the judge endpoint {settings.judge_url}" if settings.judge_url else "the served model itself"
    parts = []
    if judge == "llm":
        parts.append(f"LLM judge on {where}")
    elif judge == "reaction":
        parts.append(
            "rule judge 'reaction' (explicit feedback from /v1/feedback and /v1/rewards and outcome connectors "
            "first, else keywords of the user's next message)"
        )
    else:
        parts.append(f"rule judge {judge!r}")
    parts.append(f"LLM hint extractor on {where}" if hint == "llm" else f"hint extractor {hint!r}")
    description = "reward signal: " + "; ".join(parts)
    if not settings.judge_url:
        description += "; no --judge-url given"
        if "llm" in (judge, hint):
            description += ": the served model judges itself, and a small model's votes mostly fail to parse"
    return RewardSignal(judge, hint, description)


def stack_cores(settings: UpSettings) -> int:
    """The cores every torch process of the stack may use: `--cores`, else all this process may use."""
    if settings.cores < 0:
        raise ConfigError(f"--cores must be >= 0, not {settings.cores}")
    return settings.cores or available_cores()


def runs_gate(settings: UpSettings) -> bool:
    """Whether this `orl up` starts the gate: one per run, beside its one trainer."""
    return settings.gate and "train" in settings.components


def compute_budget(settings: UpSettings) -> str:
    """The line `orl up` / `orl demo` log at start: the cores, the threads and the numerics, and why."""
    cores = stack_cores(settings)
    numerics = resolved_numerics(settings.precision, "cpu")
    torch_names = [name for name in settings.components if name in ("serve", "train")] + (
        ["gate"] if runs_gate(settings) else []
    )
    named = " and ".join(
        [", ".join(torch_names[:-1]), torch_names[-1]] if len(torch_names) > 2 else torch_names
    )
    return (
        f"compute budget: {cores} cores ({'set by --cores' if settings.cores else 'all this process may use'}; "
        f"{available_cores()} available, {cpu_model_name()}); {named} use {cores} torch threads each while computing alone, "
        f"{max(1, cores // max(1, len(torch_names)))} each while all compute (core board {settings.data_dir / 'cores'}); "
        f"OpenMP waits {os.environ.get('OMP_WAIT_POLICY', 'PASSIVE')}; numerics {numerics.precision} ({numerics.reason})"
    )


def prepare_model_once(settings: ConnectionSettings) -> Path:
    """Convert the base model before the components start: each would otherwise convert it at the same
    time on a fresh machine (two conversions of SmolLM2 in parallel took 34 s on 2 cores)."""
    from orl.connectors.model_files import resolve_model

    return resolve_model(settings.model, settings.model_cache_dir)


@dataclass(frozen=True)
class StackKeys:
    api_key: str  # the clients' (the banner, the demo's sessions)
    admin_key: str  # /admin
    internal_key: str  # the pipeline's and the gate's: the judge's and the teacher's calls to the server
    api_keys: tuple[str, ...] = ()  # every client key given (--api-keys); else (api_key,)
    tenant_keys: dict[str, str] = field(default_factory=dict)  # each named tenant's client key, by name

    def serve_env(self) -> dict[str, str]:
        """The client keys as the server takes them (ORL_API_KEYS, ORL_TENANT_KEYS)."""
        return {
            "ORL_API_KEYS": ",".join(self.api_keys or (self.api_key,)),
            "ORL_TENANT_KEYS": ",".join(f"{name}={key}" for name, key in self.tenant_keys.items()),
        }


def stack_keys(settings: UpSettings) -> StackKeys:
    """The stack's keys: each one given, else the one kept in keys.json, else a new one (kept there).
    A named tenant (--tenants) gets its key the same way, under "tenant_keys"."""
    path = settings.data_dir / "keys.json"
    stored: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    prefixes = {"api_key": "orl-", "admin_key": "orl-admin-", "internal_key": "orl-internal-"}
    given = {
        "api_key": settings.api_keys[0] if settings.api_keys else "",
        "admin_key": settings.admin_key,
        "internal_key": settings.internal_key,
    }
    missing = {
        name: prefix + secrets.token_hex(16)
        for name, prefix in prefixes.items()
        if name not in stored and not all(given.values())  # a keys.json of older orl has no internal key
    }
    given_tenants = settings.named_tenants()  # --tenant-keys given to orl up: served as they are
    stored_tenants: dict[str, str] = stored.get("tenant_keys", {})
    new_tenants = {
        check_tenant_name(name): "orl-" + secrets.token_hex(16)
        for name in settings.tenants
        if name not in stored_tenants and name not in given_tenants
    }
    if missing or new_tenants:  # new keys to keep
        stored = {**stored, **missing}
        if new_tenants:
            stored["tenant_keys"] = stored_tenants = {**stored_tenants, **new_tenants}
        private_data_dir(settings.data_dir)
        write_private(path, json.dumps(stored, indent=2))
    tenants = {name: stored_tenants[name] for name in settings.tenants if name not in given_tenants}
    return StackKeys(
        **{name: given[name] or stored[name] for name in prefixes},
        api_keys=settings.api_keys,
        tenant_keys={**tenants, **given_tenants},
    )


def private_data_dir(data_dir: Path) -> None:
    """Create the data folder (the log, the spool, the keys) readable by its owner only; a folder that
    exists is left as it is, with a warning if others may read it."""
    if not data_dir.exists():
        data_dir.mkdir(mode=0o700, parents=True)
    elif data_dir.stat().st_mode & 0o077:
        logger.warning(
            "%s can be read by other users (mode %o); chmod 700 it", data_dir, data_dir.stat().st_mode & 0o777
        )


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, readable by its owner only from its first byte: written to a new file created
    0600 beside it, then renamed over `path` (never a moment world-readable, never half-written)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def component_env(settings: UpSettings) -> dict[str, str]:
    """The environment every component gets: this process's, with the stack's settings and keys over it."""
    return {**os.environ, **stack_env(settings)}


def stack_env(settings: UpSettings) -> dict[str, str]:
    """The settings `orl up` gives every component: the groups of settings it shares with them, whole,
    then what it decides for all of them (paths, keys, judge, threads, the gate's hold-out)."""
    keys = stack_keys(settings)
    rewards = reward_signal(settings)
    check_opd_settings(settings)
    check_tenant_adapters(settings)
    shared_groups = (
        ConnectionSettings,
        RunSettings,
        PrecisionSettings,
        SignalSettings,
        JudgeEndpointSettings,
        TeacherSettings,  # read by the pipeline
        TrainBatchSettings,  # the trainer
        OpdLossSettings,  # the trainer
    )
    return {
        **group_env(settings, *shared_groups),
        # what orl up decides for all of them
        "ORL_DATA_DIR": str(settings.data_dir.resolve()),
        "ORL_LOG_URL": settings.effective_log_url(),
        "ORL_STORE_URL": settings.effective_store_url(),
        "ORL_KEY_STORE": str(settings.effective_key_store() or "off"),  # one key store for all of them
        "ORL_PORT": str(settings.port),
        **keys.serve_env(),  # the clients' keys
        "ORL_ADMIN_KEY": keys.admin_key,
        "ORL_INTERNAL_KEY": keys.internal_key,  # the server takes it from the pipeline and the gate
        "ORL_API_KEY": keys.internal_key,  # the key the pipeline and the gate call the server with
        "ORL_SERVER_URL": f"http://127.0.0.1:{settings.port}/v1",
        "ORL_JUDGE": rewards.judge,
        "ORL_HINT_JUDGE": rewards.hint_judge,
        "ORL_THREADS": str(stack_cores(settings)),
        "ORL_FOLLOW_PROMOTED": "true" if settings.gate else "false",  # read by the server and the trainer
        "ORL_TENANT_ADAPTERS": "true" if settings.tenant_adapters else "false",  # read by the server
        "ORL_HOLDOUT_SHARE": str(settings.held_out(gate_reads_them=True) if settings.gate else 0.0),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
    }


def check_component_tables(
    config: ConfigFile | None,
    settings_of: Mapping[str, type],
    launches: dict[str, Launch],
    stack: Mapping[str, str],
) -> None:
    """Refuse a config file table that sets, for one component, a setting `orl up` gives every component:
    the variable `orl up` sets would silently beat it (variables come before the file). Such a setting
    belongs at the top level of the file (or in [up])."""
    if config is None:
        return
    for command in {launch.command for launch in launches.values()}:
        fields = {f.name: f for f in dataclasses.fields(settings_of[command])}
        for name in config.tables.get(command, {}):
            env = fields[name].metadata.get("env") if name in fields else None
            if env in stack:
                raise ConfigError(
                    f"{config.path}: [{command}] {name}: orl up sets {env} for every component, so it "
                    f"would be ignored; write it at the top level of the file or in [up]"
                )


def check_tenant_adapters(settings: UpSettings) -> None:
    """--tenant-adapters trains one run per named tenant; --shared-tenants names some of them."""
    unknown = sorted(set(settings.shared_tenants) - set(settings.tenants))
    if unknown:
        raise ConfigError(f"--shared-tenants {', '.join(unknown)}: not in --tenants")
    if not settings.tenant_adapters:
        if settings.shared_tenants:
            raise ConfigError(
                "--shared-tenants is for --tenant-adapters (without it every tenant trains the one run)"
            )
        return
    if not settings.tenants:
        raise ConfigError("--tenant-adapters trains one adapter per named tenant: name them with --tenants")


def tenant_launches(settings: UpSettings, command: str, env: dict[str, str]) -> dict[str, Launch]:
    """With --tenant-adapters, `orl <command>` (train or gate) once per named tenant, on its own run
    (orl.schemas.ids.tenant_run) and its sessions only; without, none."""
    if not settings.tenant_adapters:
        return {}
    return {
        f"{command}-{name}": Launch(
            command, {**env, "ORL_RUN_ID": tenant_run(settings.run_id, name), "ORL_TENANT": name}
        )
        for name in settings.tenants
    }


def shared_trainer_env(settings: UpSettings, env: dict[str, str]) -> dict[str, str]:
    """The shared run's trainer skips, with --tenant-adapters, the tenants not in --shared-tenants."""
    if not settings.tenant_adapters:
        return env
    private = [name for name in settings.tenants if name not in settings.shared_tenants]
    return {**env, "ORL_PRIVATE_TENANTS": ",".join(private)}


def check_opd_settings(settings: UpSettings) -> None:
    """--opd-loss topk trains on the teacher's top-K, which only --opd-topk makes the pipeline record."""
    check_opd_topk(settings.opd_topk)
    if settings.opd_loss == "topk" and settings.opd_topk == 0:
        raise ConfigError("--opd-loss topk needs --opd-topk K (K > 0): without it no sample carries a top-K")


# On 2+ cores the pipeline runs as two processes, one core each: on the benchmark stream the
# upstream stages (turn_linker, judge, teacher) and these downstream ones cost about the same CPU.
DOWNSTREAM_STAGES = ("vote_tally", "hint_selector", "sample_builder", "group_advantage")


def pipeline_roles(method: SampleMethod, cores: int, group_advantage: bool = False) -> dict[str, str]:
    """The `orl pipeline` processes of the stack: process name -> its --role."""
    names = method_stage_names(method, group_advantage)
    upstream = [name for name in names if name not in DOWNSTREAM_STAGES]
    downstream = [name for name in names if name in DOWNSTREAM_STAGES]
    if cores < 2:
        return {"pipeline": "all"}
    return {"pipeline": ",".join(upstream), "pipeline-downstream": ",".join(downstream)}


@dataclass(frozen=True)
class Launch:
    """One supervised process: `orl <command>`, with every setting in its environment."""

    command: str
    env: dict[str, str]


# The secrets each `orl <command>` of the stack needs; every other secret is kept out of its environment.
_S3 = ("ORL_S3_ACCESS_KEY", "ORL_S3_SECRET_KEY")
CHILD_SECRETS: dict[str, tuple[str, ...]] = {
    "serve": ("ORL_API_KEYS", "ORL_TENANT_KEYS", "ORL_ADMIN_KEY", "ORL_INTERNAL_KEY", *_S3),
    "pipeline": ("ORL_API_KEY", "ORL_JUDGE_API_KEY"),  # the judge and teacher call the server
    "train": _S3,
    "gate": ("ORL_API_KEY", "ORL_JUDGE_API_KEY", *_S3),
}
STACK_SECRETS = frozenset(name for names in CHILD_SECRETS.values() for name in names)


def with_own_secrets(command: str, env: dict[str, str]) -> dict[str, str]:
    """`env` without the stack's secrets that `orl <command>` does not need."""
    if command not in CHILD_SECRETS:
        raise ConfigError(f"--components: no component {command!r} (known: {', '.join(CHILD_SECRETS)})")
    own = CHILD_SECRETS[command]
    return {name: value for name, value in env.items() if name not in STACK_SECRETS or name in own}


def stack_launches(settings: UpSettings, env: dict[str, str]) -> dict[str, Launch]:
    """The processes of `settings.components`, by name: the pipeline as `pipeline_roles` splits it.
    Each gets only the secrets it needs (CHILD_SECRETS)."""
    launches = {}
    for component in settings.components:
        if component == "pipeline":
            roles = pipeline_roles(settings.method, stack_cores(settings), settings.group_advantage)
            for index, (name, role) in enumerate(roles.items()):
                pipeline_env = {**with_own_secrets("pipeline", env), "ORL_PIPELINE_ROLE": role}
                if settings.pipeline_metrics_port:
                    pipeline_env["ORL_PIPELINE_METRICS_PORT"] = str(settings.pipeline_metrics_port + index)
                launches[name] = Launch("pipeline", pipeline_env)
        elif component == "train":
            train_env = with_own_secrets("train", env)
            launches["train"] = Launch("train", shared_trainer_env(settings, train_env))
            launches.update(tenant_launches(settings, "train", train_env))
        else:
            launches[component] = Launch(component, with_own_secrets(component, env))
    if runs_gate(settings):
        launches["gate"] = Launch("gate", with_own_secrets("gate", env))
        launches.update(tenant_launches(settings, "gate", with_own_secrets("gate", env)))
    return launches


RESTART_DELAY_S = 1.0  # after the first crash in a row; one more second per further crash
MAX_RESTART_DELAY_S = 10.0
STABLE_RUN_S = 60.0  # a process that ran this long before it exited starts a new row of crashes
CRASH_LOOP_AFTER = 5  # crashes in a row that make a crash loop (logged as an error, with the log's tail)
LOG_TAIL_LINES = 8
# SIGTERM, then this long for every process together, then SIGKILL: Ctrl-C ends within 10 s
STOP_GRACE_S = 8.0


@dataclass
class Supervisor:
    """Starts the launches' `orl <command>` processes and restarts any that exits, until stopped.

    A process that exits is restarted after a pause that grows with its crashes in a row (1 s,
    2 s, ... up to 10 s), so a crash loop does not spin; a process that had run for a minute
    starts a new row. The pause never blocks: `check` starts what is due and returns, so the
    other processes' restarts and a stop are not held up. Each child gets SIGTERM from the kernel
    if the supervisor dies without stopping it (kill -9, a crash): `exit_with_supervisor`, called
    by every `orl` command at start.
    A process that crashes CRASH_LOOP_AFTER times in a row is in a crash loop: an error in the log
    says so with the last lines of its own log. `status.json` in the log folder holds each
    process's state (running / restarting / stopped), pid, restarts, crashes in a row, last exit
    code and whether it is crash-looping, rewritten at every change."""

    launches: dict[str, Launch]
    log_dir: Path
    clock: Callable[[], float] = time.monotonic
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)  # restarts so far, per process
    crashes_in_a_row: dict[str, int] = field(default_factory=dict)
    started_at: dict[str, float] = field(default_factory=dict)
    restart_at: dict[str, float] = field(default_factory=dict)  # exited, restarted at this time
    exit_codes: dict[str, int] = field(default_factory=dict)  # the last exit code, per process

    @property
    def status_path(self) -> Path:
        return self.log_dir / "status.json"

    def start(self, name: str) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        launch = self.launches[name]
        self.processes[name] = subprocess.Popen(
            [sys.executable, "-m", "orl.cli", launch.command],
            env={**launch.env, SUPERVISOR_PID_ENV: str(os.getpid())},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.started_at[name] = self.clock()
        logger.info(
            "started %s (pid %d), log %s", name, self.processes[name].pid, self.log_dir / f"{name}.log"
        )
        self.write_status()

    def start_all(self) -> None:
        for name in self.launches:
            self.start(name)

    def signal(self, name: str, signum: int) -> None:
        """Send `signum` to the running `name` process (nothing if it is not running)."""
        process = self.processes.get(name)
        if process is not None and process.poll() is None:
            process.send_signal(signum)

    def check(self) -> None:
        """Schedule the restart of whatever exited, and restart what is due."""
        now = self.clock()
        for name, process in list(self.processes.items()):
            if name in self.restart_at:
                if now >= self.restart_at[name]:
                    del self.restart_at[name]
                    self.restarts[name] = self.restarts.get(name, 0) + 1
                    self.start(name)
                continue
            if process.poll() is None:
                if self.crashes_in_a_row.get(name) and now - self.started_at[name] >= STABLE_RUN_S:
                    self.crashes_in_a_row[name] = 0  # it runs: its row of crashes is over
                    self.write_status()
                continue
            ran_s = now - self.started_at.get(name, now)
            crashes = 1 if ran_s >= STABLE_RUN_S else self.crashes_in_a_row.get(name, 0) + 1
            self.crashes_in_a_row[name] = crashes
            self.exit_codes[name] = process.returncode
            delay_s = min(MAX_RESTART_DELAY_S, RESTART_DELAY_S * crashes)
            self.restart_at[name] = now + delay_s
            logger.warning(
                "%s exited with %s; restarting in %.0f s (it ran %.0f s; crash %d in a row, restart #%d)",
                name, process.returncode, delay_s, ran_s, crashes, self.restarts.get(name, 0) + 1,
            )  # fmt: skip
            if crashes % CRASH_LOOP_AFTER == 0:
                logger.error(
                    "%s is in a crash loop: %d exits in a row, each within %.0f s of its start; the last "
                    "lines of %s:\n%s",
                    name, crashes, STABLE_RUN_S, self.log_dir / f"{name}.log", self.log_tail(name),
                )  # fmt: skip
            self.write_status()

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + STOP_GRACE_S  # wall time, whatever clock schedules restarts
        for name, process in self.processes.items():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within %.0f s of SIGTERM: killed", name, STOP_GRACE_S)
                process.kill()
                process.wait()
        self.restart_at.clear()
        self.write_status()

    def log_tail(self, name: str) -> str:
        """The last LOG_TAIL_LINES lines of the process's log."""
        with contextlib.suppress(OSError):
            lines = (self.log_dir / f"{name}.log").read_bytes().decode(errors="replace").splitlines()
            return "\n".join(lines[-LOG_TAIL_LINES:])
        return "(no log)"

    def status(self) -> dict[str, dict[str, object]]:
        """Each process's state, as status.json holds it."""
        now = self.clock()
        status: dict[str, dict[str, object]] = {}
        for name, process in self.processes.items():
            running = process.poll() is None
            crashes = self.crashes_in_a_row.get(name, 0)
            status[name] = {
                "state": "running" if running else "restarting" if name in self.restart_at else "stopped",
                "pid": process.pid if running else None,
                "restarts": self.restarts.get(name, 0),
                "crashes_in_a_row": crashes,
                "crash_loop": crashes >= CRASH_LOOP_AFTER,
                "last_exit_code": self.exit_codes.get(name),
                "restart_in_s": round(max(0.0, self.restart_at[name] - now), 1)
                if name in self.restart_at
                else None,
            }
        return status

    def write_status(self) -> None:
        """Replace status.json (written whole, then renamed over the old one)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        partial = self.status_path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.status(), indent=2) + "\n")
        partial.replace(self.status_path)


def server_ready(port: int) -> bool:
    """Whether this stack's server answers /readyz with 200 (not yet: False, at once)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=0.3) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def start_banner(settings: UpSettings, reward_line: str) -> str:
    """What `orl up` prints once its processes are started: where to point a client, with what key, how
    turns are rewarded, and where to look next."""
    url = f"http://127.0.0.1:{settings.port}/v1"
    keys = settings.data_dir / "keys.json"
    data = f" --data-dir {shlex.quote(str(settings.data_dir))}" if settings.data_dir != Path(".orl") else ""
    return "\n".join([
        f"orl is up: point any OpenAI client at {url}",
        f"  API key: the \"api_key\" of {keys} (mode 0600)",
        *(
            [f"  tenants {', '.join(settings.tenants)}: each one's key is under \"tenant_keys\" in {keys}"]
            if settings.tenants
            else []
        ),
        *(
            [
                f"  tenant adapters: each tenant trains its own run ({tenant_run(settings.run_id, '<tenant>')}), "
                f"answered by run {settings.run_id} until it has a version; {', '.join(settings.shared_tenants) or 'no tenant'} "
                f"also train{'s' if len(settings.shared_tenants) == 1 else ''} {settings.run_id}"
            ]
            if settings.tenant_adapters
            else []
        ),
        "  try it:",
        f"    curl -s {url}/chat/completions -H \"Authorization: Bearer $(python3 -c 'import json;"
        f" print(json.load(open(\"{keys}\"))[\"api_key\"])')\" -H 'Content-Type: application/json'"
        " -d '{\"model\": \"orl-policy\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}]}'",
        f"  {reward_line}",
        f"  next: orl status{data} (each process), orl report{data} (is it learning?), orl samples{data}",
        f"  logs in {settings.data_dir / 'logs'}; Ctrl-C stops everything",
    ])  # fmt: skip


def up(settings: UpSettings) -> int:
    """Entry point of `orl up`."""
    private_data_dir(settings.data_dir)
    logger.info(compute_budget(settings))
    reward_line = reward_signal(settings).description
    logger.info(reward_line)
    stack = stack_env(settings)
    launches = stack_launches(settings, {**os.environ, **stack})
    if os.environ.get(CONFIG_ENV):  # a config file: its component tables must not set what orl up sets
        from orl.cli import settings_of_every_command  # every command's settings: imported only when needed

        settings_of = settings_of_every_command()
        check_component_tables(config_from_environment(settings_of), settings_of, launches, stack)
    prepare_model_once(settings)
    supervisor = Supervisor(launches, settings.data_dir / "logs")
    stopping = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    supervisor.start_all()
    announced = False
    if "serve" in launches:
        print(
            f"starting: the server loads the model; the banner follows once it answers (logs in {settings.data_dir / 'logs'})"
        )
    try:
        while not stopping:
            supervisor.check()
            if not announced and ("serve" not in launches or server_ready(settings.port)):
                print(start_banner(settings, reward_line), flush=True)
                announced = True
            time.sleep(0.5)
    finally:
        supervisor.stop()
    return 0
