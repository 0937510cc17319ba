"""The Kafka, faust and LLM-judge measurements of `python -m benchmarks.bench_pipeline` (see its docstring).

`kafka`: the stages as `orl up` runs them on a Kafka log (StreamRunners, split over two processes as
on SQLite), on an Apache Kafka broker started as the test fixture starts it. `faust`: the pure stages in `--faust-workers` faust worker child processes (`--faust-worker` mode of
bench_pipeline; "1,2" measures one, then two workers in one group), the judge as a StreamRunner on the
Kafka log here, on an Apache Kafka broker started as the test fixture starts it. `llm`: votes/s of the
LLM judge against a real `orl serve` (SmolLM2-135M on CPU). Writes only under a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.pipeline.runtime.stream_runner import StreamRunner
from orl.schemas.codec import decode
from orl.schemas.topics import topic_name

from benchmarks.bench_pipeline import (
    NAMESPACE,
    append_grouped,
    bench_settings,
    encoded_stream,
    measure,
    run_stages,
    warm_up,
    warm_up_sessions,
)


async def kafka(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The pipeline as `orl up --log-url kafka://...` runs it, warm, on a fresh Kafka broker per run."""
    from orl.connectors.event_log.kafka_log import KafkaEventLog

    from tests.fixtures.kafka_broker import start_kafka_cluster

    results = []
    for mode in ("burst", "rate"):
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
                broker = start_kafka_cluster(Path(tmp) / "kafka")
                log = KafkaEventLog(broker.bootstrap)
                try:
                    await log.start()
                    result = await measure(log, args, Path(tmp), mode, log_url=f"kafka://{broker.bootstrap}")
                finally:
                    await log.close()
                    broker.stop()
            result["runtime"] = "StreamRunners as orl up runs them (2 processes) on Kafka"
            print(json.dumps(result), flush=True)
            results.append(result)
    return results


async def faust(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Pure stages in faust worker child processes, the judge stage here, all on a fresh Kafka broker."""
    from orl.connectors.event_log.kafka_log import KafkaEventLog

    from tests.fixtures.kafka_broker import start_kafka_cluster

    results = []
    for workers in [int(n) for n in str(args.faust_workers).split(",")]:
        for mode in ("backlog", "rate"):
            for _ in range(args.repeat):
                with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
                    broker = start_kafka_cluster(Path(tmp) / "kafka")
                    log = KafkaEventLog(broker.bootstrap)
                    processes: list[Any] = []
                    stop, judge = asyncio.Event(), []
                    try:
                        await log.start()
                        await create_catalog_topics(log, NAMESPACE, args.partitions)
                        for index in range(workers):
                            processes.append(start_faust_worker(args, broker.bootstrap, Path(tmp), index))
                        # One judge runner for warm-up and run: a restarted member of a Kafka group waits
                        # out the old member's session before it gets partitions back.
                        judge = await run_stages(log, args, Path(tmp), stop, ["judge"])
                        await warm_up(log, warm_up_sessions(args, f"kafka://{broker.bootstrap}"))
                        result = await measure(
                            log, args, Path(tmp), "burst" if mode == "backlog" else mode, []
                        )
                    finally:
                        stop.set()
                        await asyncio.gather(*judge)
                        for process in processes:
                            stop_process(process)
                        await log.close()
                        broker.stop()
                result["runtime"] = (
                    f"faust x{workers} ({args.guarantee}, commit {args.commit_interval_s} s) + judge on Kafka"
                )
                print(json.dumps(result), flush=True)
                results.append(result)
    return results


def stop_process(process: Any, grace_s: float = 20.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace_s` (a faust worker can take long)."""
    import subprocess

    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def start_faust_worker(args: argparse.Namespace, bootstrap: str, data_dir: Path, index: int) -> Any:
    import subprocess

    work_dir = data_dir / f"worker-{index}"
    work_dir.mkdir()
    command = [sys.executable, "-m", "benchmarks.bench_pipeline", "faust", "--faust-worker", bootstrap,
               "--work-dir", str(work_dir), "--partitions", str(args.partitions),
               "--commit-interval-s", str(args.commit_interval_s), "--guarantee", args.guarantee]  # fmt: skip
    log_file = (work_dir / "faust-worker.log").open("wb")
    return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)


def faust_worker(args: argparse.Namespace) -> None:
    """The --faust-worker mode: turn_linker, vote_tally and sample_builder as one faust worker."""
    from orl.pipeline.runtime.faust_runtime import run_worker

    settings = bench_settings(args, f"kafka://{args.faust_worker}", args.work_dir)
    processors = [s for s in build_stages(settings) if s.name != "judge"]
    run_worker(
        processors, pipeline_config(settings), NAMESPACE, args.faust_worker,  # type: ignore[arg-type]
        app_id=f"{NAMESPACE}-pipeline", data_dir=args.work_dir / "faust", processing_guarantee=args.guarantee,
        partitions=args.partitions, loglevel="warning", session_timeout_s=6.0, rebalance_timeout_s=12.0,
        commit_interval_s=args.commit_interval_s,
    )  # fmt: skip


async def llm_votes(args: argparse.Namespace) -> None:
    """votes/s of the LLM judge against a real `orl serve` on CPU (judge stage only)."""
    from orl.connectors.event_log.sqlite_log import SqliteEventLog

    from tests.integration.serve_process import INTERNAL_KEY, serve_process

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        env = {"ORL_FOLLOW_CHECKPOINTS": "false", "ORL_MAX_BATCH_SIZE": "8"}
        (data_dir / "serve").mkdir()
        with serve_process(data_dir / "serve", extra_env=env, timeout_s=300) as server:
            settings = dataclasses.replace(
                bench_settings(args, "unused://", data_dir), judge="llm", judge_votes=args.votes,
                judge_max_tokens=args.judge_max_tokens, server_url=f"{server.base_url}/v1", api_key=INTERNAL_KEY,
                judge_timeout_s=300.0,
            )  # fmt: skip
            log = SqliteEventLog(data_dir / "log.db")
            await log.start()
            try:
                await create_catalog_topics(log, NAMESPACE, 1)
                sessions = max(1, args.judgements // max(1, args.turns - 1))
                await append_grouped(
                    log, [r for slot in encoded_stream(sessions, args.turns, False) for r in slot]
                )
                config = pipeline_config(settings)
                turn_linker = next(s for s in build_stages(settings) if s.name == "turn_linker")
                await StreamRunner(log, turn_linker, config, NAMESPACE).run_until_idle()
                judge = next(s for s in build_stages(settings) if s.name == "judge")
                started = time.monotonic()
                await StreamRunner(
                    log, judge, config, NAMESPACE, effect_concurrency=args.effect_concurrency
                ).run_until_idle()
                wall = time.monotonic() - started - 0.4  # run_until_idle ends with two empty 0.2 s polls
                votes = [decode(r.value) for r in await _read_all(log, topic_name(NAMESPACE, "judge_votes"))]
            finally:
                await log.close()
    parsed = sum(v["score"] is not None for v in votes)
    print(json.dumps({"votes": len(votes), "parsed": parsed, "seconds": round(wall, 1),
                      "votes_per_s": round(len(votes) / wall, 2), "judge_max_tokens": args.judge_max_tokens,
                      "m": args.votes, "effect_concurrency": args.effect_concurrency}))  # fmt: skip


async def _read_all(log: EventLog, topic: str) -> list[Any]:
    from orl.connectors.event_log.reading import read_to_end

    return await read_to_end(log, topic)
