"""`orl replay`, `orl audit`, `orl export`, `orl archive`: history tools (settings + run functions).

The work is done in pipeline/history/replay.py, audit.py, export.py, archive.py and openclaw_import.py;
this module maps settings onto them, shows a progress bar and prints results. `orl replay
--train-steps N` then runs `orl train` on the new namespace as a child process (printed first);
with 0 the command is only printed. The new run starts from `--model` (the base model), or with
`--train-from <run>/<version>` from that published checkpoint (`orl train --init-from`), and keeps
every replayed sample whatever its recorded policy version (`--max-staleness -1`: those versions
belong to the recorded run, not to the new one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.model_files import resolve_model
from orl.connectors.object_store.base import ObjectStore
from orl.connectors.object_store.factory import open_object_store
from orl.connectors.settings import (
    ConnectionSettings,
    JsonOutputSettings,
    setting,
    setting_text,
    settings_env,
)
from orl.pipeline.history import archive as archive_tools
from orl.pipeline.history.audit import NotFound, audit_id, audit_session, render_chain
from orl.pipeline.history.audit_index import AuditIndex, index_path
from orl.pipeline.history.export import export_namespace
from orl.pipeline.history.import_tokens import HFImportTokenizer, LogprobMode, scorer_for
from orl.pipeline.history.openclaw_import import ImportOptions, build_events, parse_files
from orl.pipeline.history.parquet_export import export_parquet
from orl.pipeline.history.replay import (
    REJUDGE_TOPICS,
    REUSE_TOPICS,
    ReplayPlan,
    VoteMode,
    archive_source,
    event_source,
    log_source,
    replay,
)
from orl.pipeline.history.replay_workers import workers_for
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.pipeline.runtime.settings import PipelineSettings
from orl.schemas.errors import ConfigError
from orl.settings_binding import flag_name
from orl.trainer.settings import TrainSettings, parse_init_from

ReplaySource = Literal["log", "archive", "openclaw"]


def _store(settings: ConnectionSettings) -> ObjectStore:
    return open_object_store(
        settings.effective_store_url(), access_key=settings.s3_access_key, secret_key=settings.s3_secret_key
    )


@dataclass(frozen=True)
class ReplaySettings(PipelineSettings):
    target_namespace: str = setting("", "ORL_REPLAY_TARGET", "New namespace the replay writes (required).")
    source: ReplaySource = setting(
        "log", "ORL_REPLAY_SOURCE", "Where history comes from: log | archive | openclaw."
    )
    openclaw_files: tuple[str, ...] = setting(
        (), "ORL_OPENCLAW_FILES", "OpenClaw-RL record files (comma separated) for --source openclaw."
    )
    votes: VoteMode = setting(
        "reuse",
        "ORL_REPLAY_VOTES",
        "reuse (recorded votes, same samples) | rejudge (judge again with --judge...).",
    )
    strict: bool = setting(
        False, "ORL_IMPORT_STRICT", "Abort the import on the first bad line (else skip it).", advanced=True
    )
    import_logprobs: LogprobMode = setting(
        "base",
        "ORL_IMPORT_LOGPROBS",
        "Old logprobs of imported responses: base (base model) | placeholder (0.0).",
        advanced=True,
    )
    import_temperature: float = setting(
        1.0, "ORL_IMPORT_TEMPERATURE", "Temperature recorded for imported responses.", advanced=True
    )
    flush: bool = setting(
        True, "ORL_REPLAY_FLUSH", "Advance time past every timeout after the input.", advanced=True
    )
    workers: int = setting(
        0,
        "ORL_REPLAY_WORKERS",
        "Worker processes of a reuse replay, each with a share of the sessions (0: one per CPU core, "
        "at most 4; 1: none, all in this process).",
    )
    progress: bool = setting(True, "ORL_PROGRESS", "Show a progress bar.", advanced=True)
    train_steps: int = setting(
        0, "ORL_REPLAY_TRAIN_STEPS", "Then run `orl train` for this many steps (0: print it)."
    )
    train_run_id: str = setting(
        "", "ORL_REPLAY_RUN_ID", "Run id of that training (default: the target namespace).", advanced=True
    )
    train_from: str = setting(
        "",
        "ORL_REPLAY_TRAIN_FROM",
        "Start that training from the published checkpoint <run-id>/<version> (or <run-id>/latest) "
        "instead of --model (passed as orl train --init-from; empty: the base model).",
    )


def settings_version(settings: ReplaySettings) -> str:
    """A hash of everything in the settings that changes what a replay writes."""
    names = ("method", "judge", "judge_model", "judge_votes", "judge_temperature", "judge_max_tokens",
             "hint_judge", "teacher_kind", "at_least_one", "promotion_reward", "import_logprobs",
             "import_temperature", "model", "flush")  # fmt: skip
    values = {name: str(getattr(settings, name)) for name in names}
    values["judge_url"] = settings.judge_url or settings.server_url if settings.votes == "rejudge" else ""
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


def _source_label(settings: ReplaySettings) -> str:
    if settings.source != "openclaw":
        return f"{settings.source}:{settings.namespace}"
    digest = hashlib.sha256()
    for name in settings.openclaw_files:
        digest.update(Path(name).read_bytes())
    return f"openclaw:{digest.hexdigest()[:16]}"


def _check(settings: ReplaySettings) -> None:
    if settings.workers < 0:
        raise ConfigError(f"--workers must be 0 (one per CPU core) or more, not {settings.workers}")
    if not settings.target_namespace:
        raise ConfigError("--target-namespace is required: a replay writes into a new namespace")
    if settings.source == "openclaw" and not settings.openclaw_files:
        raise ConfigError("--source openclaw needs --openclaw-files FILE[,FILE...]")
    if settings.train_from:
        parse_init_from(settings.train_from, "--train-from")
    missing = [f for f in settings.openclaw_files if not Path(f).is_file()]
    if missing:
        raise ConfigError(f"--openclaw-files: no such file {missing[0]!r}")


def _import_batches(settings: ReplaySettings) -> tuple[list[dict[str, Any]], list[str]]:
    parsed = parse_files([Path(f) for f in settings.openclaw_files], strict=settings.strict)
    model_dir = resolve_model(settings.model, settings.model_cache_dir)
    tokenizer = HFImportTokenizer(model_dir)
    scorer = scorer_for(settings.import_logprobs, model_dir)
    options = ImportOptions(settings.target_namespace, settings.model, settings.import_temperature)
    events = build_events(parsed, options, tokenizer, scorer, strict=settings.strict)
    return events, [str(p) for p in parsed.problems]


class PhaseBars:
    """A replay's progress: one bar per phase (the copy, then each stage, or the one in-memory
    pass), each closed when the next one starts."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.phase = ""
        self.bar: tqdm | None = None

    def __call__(self, phase: str, advanced: int, total: int) -> None:
        if self.bar is None or phase != self.phase:
            self.close()
            self.phase = phase
            self.bar = tqdm(total=total, unit="record", desc=phase, disable=not self.enabled)
        if self.bar.n + advanced > self.bar.total:  # a stage that reads its own outputs (hint_selector)
            self.bar.total = self.bar.n + advanced
        self.bar.update(advanced)
        if self.bar.n == self.bar.total:
            self.bar.refresh()  # shown complete now, not only when the next phase starts

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> PhaseBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _replay(settings: ReplaySettings) -> int:
    target = dataclasses.replace(settings, namespace=settings.target_namespace, role="all")
    stages = build_stages(target)
    plan = ReplayPlan(
        settings.target_namespace, settings.votes, _source_label(settings), settings_version(settings),
        flush=settings.flush, partitions=settings.topic_partitions, copy_teacher=settings.source != "openclaw",
    )  # fmt: skip
    topics = REUSE_TOPICS if settings.votes == "reuse" else REJUDGE_TOPICS
    async with open_event_log(settings.effective_log_url(), settings.topic_policy()) as log:
        if settings.source == "openclaw":
            events, problems = _import_batches(settings)
            for problem in problems:
                print(f"skipped {problem}", file=sys.stderr)
            source, source_ns = event_source(events), None
        else:
            store = _store(settings) if settings.source == "archive" else None
            source = (
                archive_source(store, settings.namespace, topics)
                if store is not None
                else log_source(log, settings.namespace, topics)
            )
            if await source.size() == 0:
                where = "in the archive" if store is not None else "on the log"
                raise ConfigError(f"namespace {settings.namespace!r} has no events to replay {where}")
            source_ns = settings.namespace if settings.source == "log" else None
        with PhaseBars(enabled=settings.progress) as bars:
            report = await replay(
                log, plan, source, stages, pipeline_config(target), bars, source_ns,
                workers=workers_for(settings.workers), effect_concurrency=settings.effect_concurrency,
            )  # fmt: skip
    print(
        f"replayed {report.source_events} recorded events into {report.target!r}: {report.samples_ready} "
        f"samples ready, {report.samples_rejected} rejected ({report.skipped} events were already there)"
    )
    if report.forgotten:
        print(f"left out {report.forgotten} events whose payloads were forgotten (orl forget)")
    return 0


def run_replay(settings: ReplaySettings) -> int:
    code = replay_namespace(settings)
    return code or train_replayed(settings, settings.train_run_id or settings.target_namespace)


def replay_namespace(settings: ReplaySettings) -> int:
    """The replay itself: the recorded history into --target-namespace, through the pipeline's stages."""
    _check(settings)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return asyncio.run(_replay(settings))


def train_replayed(
    settings: ReplaySettings, run_id: str, tenant: str = "", private_tenants: tuple[str, ...] = ()
) -> int:
    """`orl train` of a new run `run_id` on the replayed namespace for --train-steps (printed only with
    0), on a tenant's sessions only (`tenant`) or on every session but `private_tenants`'."""
    train = TrainSettings(
        data_dir=settings.data_dir, log_url=settings.log_url, store_url=settings.store_url,
        namespace=settings.target_namespace, model=settings.model, run_id=run_id,
        init_from=settings.train_from, max_staleness=-1, max_steps=settings.train_steps, idle_exit_s=30.0,
        key_store=settings.key_store, tenant=tenant, private_tenants=private_tenants,
    )  # fmt: skip
    given = ["namespace", "run_id", "data_dir", "model", "max_staleness"]
    optional = ("log_url", "store_url", "init_from", "key_store", "tenant", "private_tenants")
    given += [name for name in optional if getattr(train, name)]
    shown = "orl train " + " ".join(
        f"{flag_name(name)} {setting_text(getattr(train, name))}" for name in given
    )
    if settings.train_steps <= 0:
        print(f"to train a new model on it: {shown} [--max-steps N]")
        return 0
    given += ["max_steps", "idle_exit_s"]
    print(f"training: {shown} --max-steps {settings.train_steps}")
    # the child gets its settings in its environment, as every orl child process does
    env = {**os.environ, **settings_env(train, only=given)}
    return subprocess.call([sys.executable, "-m", "orl.cli", "train"], env=env)


@dataclass(frozen=True)
class AuditSettings(ConnectionSettings, JsonOutputSettings):
    id: str = setting(
        "",
        "ORL_AUDIT_ID",
        "Any id: turn, request, response, vote, reward, hint, sample, step, checkpoint.",
        positional=True,
    )
    session: str = setting(
        "", "ORL_AUDIT_SESSION", "Instead of --id: list the checkpoints this session influenced."
    )


async def _audit(settings: AuditSettings) -> dict[str, Any]:
    index = AuditIndex(index_path(settings.data_dir, settings.namespace), settings.namespace)
    try:
        store = _store(settings)
        async with open_event_log(settings.effective_log_url(), settings.topic_policy()) as log:
            if settings.session:
                return await audit_session(log, index, settings.session, store)
            return await audit_id(log, index, settings.id, store)
    finally:
        index.close()


def run_audit(settings: AuditSettings) -> int:
    if bool(settings.id) == bool(settings.session):
        raise ConfigError("give exactly one of an id (orl audit ID, or --id ID) or --session SESSION")
    try:
        chain = asyncio.run(_audit(settings))
    except NotFound as error:
        print(f"not found: {error}", file=sys.stderr)
        return 1
    print(json.dumps(chain, indent=2, ensure_ascii=False) if settings.json else render_chain(chain))
    return 0


ExportFormat = Literal["jsonl", "parquet"]


@dataclass(frozen=True)
class ExportSettings(ConnectionSettings):
    output: str = setting(
        "-", "ORL_EXPORT_OUTPUT", "jsonl: the file to write ('-': standard output); parquet: a folder."
    )
    format: ExportFormat = setting(
        "jsonl",
        "ORL_EXPORT_FORMAT",
        "jsonl (one decoded event per line) | parquet (one file per event type, typed columns; "
        "needs pyarrow: .venv/bin/pip install -e '.[parquet]').",
    )
    dead_letters: bool = setting(True, "ORL_EXPORT_DEAD_LETTERS", "Include the dead-letter topics.")


async def _export_parquet(settings: ExportSettings) -> str:
    async with open_event_log(settings.effective_log_url(), settings.topic_policy()) as log:
        rows = await export_parquet(log, settings.namespace, Path(settings.output), settings.dead_letters)
    files = ", ".join(f"{event_type} {count}" for event_type, count in rows.items())
    return f"exported {sum(rows.values())} events of namespace {settings.namespace!r} to {settings.output}/ ({files})"


async def _export(settings: ExportSettings) -> int:
    async with open_event_log(settings.effective_log_url(), settings.topic_policy()) as log:
        if settings.output == "-":
            return await export_namespace(log, settings.namespace, sys.stdout, settings.dead_letters)
        path = Path(settings.output)
        tmp = path.with_name(path.name + ".part")
        with tmp.open("w", encoding="utf-8") as out:
            lines = await export_namespace(log, settings.namespace, out, settings.dead_letters)
        tmp.replace(path)
        return lines


def run_export(settings: ExportSettings) -> int:
    if settings.format == "parquet":
        if settings.output == "-":
            raise ConfigError("--format parquet writes a folder: give it with --output DIR")
        print(asyncio.run(_export_parquet(settings)), file=sys.stderr)
        return 0
    lines = asyncio.run(_export(settings))
    print(f"exported {lines} events of namespace {settings.namespace!r}", file=sys.stderr)
    return 0


@dataclass(frozen=True)
class ArchiveSettings(ConnectionSettings):
    interval_s: float = setting(
        0.0, "ORL_ARCHIVE_INTERVAL_S", "Archive again every this many seconds until stopped (0: once)."
    )
    restore: bool = setting(
        False, "ORL_ARCHIVE_RESTORE", "Rebuild the namespace's topics on the log from the archive."
    )


async def _archive(settings: ArchiveSettings) -> str:
    store = _store(settings)
    async with open_event_log(settings.effective_log_url(), settings.topic_policy()) as log:
        if settings.restore:
            count = await archive_tools.restore(store, settings.namespace, log)
            return f"restored {count} records of namespace {settings.namespace!r}"
        report = await archive_tools.archive_namespace(log, store, settings.namespace)
    return (
        f"archived {report.records} new records of namespace {settings.namespace!r} "
        f"({report.topics} topics, {report.segments} new segments) under archive/{settings.namespace}/"
    )


def run_archive(settings: ArchiveSettings) -> int:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    while True:
        print(asyncio.run(_archive(settings)), flush=True)
        if settings.interval_s <= 0 or settings.restore:
            return 0
        time.sleep(settings.interval_s)
