"""Pipeline throughput and latency: serving events in, SampleReady / SampleRejected out.

Usage:
    python -m benchmarks.bench_pipeline embedded [--sessions 400] [--turns 5] [--rate 1000] [--one-process]
    python -m benchmarks.bench_pipeline faust [--sessions 200] [--turns 5] [--rate 200] [--partitions 2]
    python -m benchmarks.bench_pipeline llm [--judgements 4] [--judge-max-tokens 32]

Synthetic sessions (tests/unit/pipeline_streams.Conversation, what serving writes) of `--turns`
main turns each; every user reply is a thanks or a correction, so the `user_reply` rule judge (no
LLM) scores each turn +1 or -1. A session's last turn has no reply, so it stays open (it would be
judged at the idle timeout): each session yields `turns - 1` judged turns. `--close` adds a
SessionClosed after each session's last turn, which the last turn is then judged on; see
RESULTS-pipeline.md for why that is not the default (closes consumed before the session's last
request are mis-linked by turn_linker, so some turns are never sampled). Method binary:
turn_linker -> judge -> vote_tally -> sample_builder, each stage one StreamRunner (one consumer
group).

Measurements per runtime:
- throughput (backlog, cold start): every serving event is appended first (not timed), then the
  stages start (process start-up included); turns/s = judged turns (distinct turn ids on the
  samples topic) / seconds until the last one appears.
- throughput (burst, warm): the stages run and have processed 5 warm-up sessions; then every
  serving event is appended as fast as possible; turns/s as above, from the first append.
- latency: the events are appended at an offered `--rate` turns/s while the stages run; for every
  turn, next-state -> sample latency = append time of its SampleReady/SampleRejected minus append
  time of its NextStateObserved (the log's record timestamps, 1 ms resolution).
- CPU s: CPU time of this process (all threads) and of its children (the downstream `orl pipeline`) over the
  measured run, a figure that other load on the machine barely changes (for faust it includes the
  broker and the worker).

`embedded`: SQLite event log; the pipeline runs as `orl up` runs it (orl/up.py `pipeline_roles`): on
2+ cores turn_linker and judge in this process (orl.pipeline.runtime.main.run_pipeline) and vote_tally
and sample_builder in an `orl pipeline` child process that gets its settings in its environment;
`--one-process` runs every stage here. `--sealing on` (embedded) seals every event with its session's
data key as a deployment does (orl.schemas.sealing: the appended serving events too, a key store in
the run's folder), `off` writes in clear, `both` alternates the two in one run (what erasure costs).
`faust` and `llm` (votes/s of the LLM judge on CPU): see benchmarks/bench_pipeline_runtimes.py.
Writes only under a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orl.compute.machine import available_cores
from orl.connectors.event_log.base import EventLog, OutgoingRecord
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.key_store import KeyStore
from orl.connectors.settings import settings_env
from orl.pipeline.history.namespace_io import envelope_keys
from orl.pipeline.runtime.main import build_runners, build_stages, run_pipeline
from orl.pipeline.runtime.settings import PipelineSettings
from orl.schemas.codec import decode, encode, install_data_keys, installed_data_keys
from orl.schemas.topics import topic_for_event, topic_name

from orl.up import pipeline_roles
from tests.unit.pipeline_streams import Conversation

NAMESPACE = "bench"
PRAISE = "Thanks, that is exactly what I was looking for."
CORRECTION = "Not quite. Please keep it under 50 words and stick to the question."
QUESTION = "How should I plan water and food for a three day hike in the Alps in October?"
ANSWER = (
    "Carry two litres of water per day and a filter for refills at huts and streams; pack calorie-dense"
    " food such as nuts, cheese and dried fruit, plus one warm meal per day."
)


def session_events(index: int, turns: int, close: bool, prefix: str = "s") -> list[dict[str, Any]]:
    """One session of `turns` main turns (closed if `close`); replies alternate thanks / correction."""
    # Event times must be recent: the stages' idle timeouts and retention compare them with the wall clock.
    recent_ms = int(time.time() * 1000) - 1000 * (2 * turns + 2)
    conversation = Conversation(f"{prefix}{index:06d}", namespace=NAMESPACE, now_ms=recent_ms)
    conversation.say(QUESTION)
    for turn in range(turns):
        if turn:
            conversation.say(PRAISE if (index + turn) % 2 else CORRECTION)
        conversation.turn(f"{ANSWER} (variant {turn})")
    if close:
        conversation.close(last_turn_id=f"{conversation.session_id}-t{turns - 1}")
    return conversation.events


def encoded_stream(
    sessions: int, turns: int, close: bool, prefix: str = "s"
) -> list[list[tuple[str, OutgoingRecord]]]:
    """Per turn slot, the records serving would append, sessions interleaved round robin.

    Slot t holds each session's request t and response t (and the SessionClosed after the last)."""
    per_session = [session_events(i, turns, close, prefix) for i in range(sessions)]
    slots: list[list[tuple[str, OutgoingRecord]]] = []
    for t in range(turns):
        slot = []
        for events in per_session:
            chunk = events[2 * t : 2 * t + 2] + (events[2 * turns :] if t == turns - 1 else [])
            for event in chunk:
                topic = topic_name(NAMESPACE, topic_for_event(event["envelope"]["event_type"]))
                key = event["envelope"]["session_id"].encode()
                slot.append((topic, OutgoingRecord(value=encode(event), key=key)))
        slots.append(slot)
    return slots


async def append_grouped(log: EventLog, records: Sequence[tuple[str, OutgoingRecord]]) -> None:
    by_topic: dict[str, list[OutgoingRecord]] = {}
    for topic, record in records:
        by_topic.setdefault(topic, []).append(record)
    for topic, batch in by_topic.items():
        for start in range(0, len(batch), 500):
            await log.append_batch(topic, batch[start : start + 500])


def bench_settings(args: argparse.Namespace, log_url: str, data_dir: Path) -> PipelineSettings:
    return PipelineSettings(
        data_dir=data_dir,
        log_url=log_url,
        namespace=NAMESPACE,
        method="binary",
        judge=args.judge,
        hint_judge="user_hint",
        role="all",
        topic_partitions=args.partitions,
        effect_concurrency=args.effect_concurrency,
        tick_interval_s=1.0,
        key_store=str(data_dir / "keys.db") if getattr(args, "sealed", False) else "off",
    )


@dataclasses.dataclass
class SampleWatch:
    """Reads the next_states and samples topics: append times by turn id."""

    log: EventLog
    expected_turns: int
    next_state_ms: dict[str, int] = dataclasses.field(default_factory=dict)
    sample_ms: dict[str, int] = dataclasses.field(default_factory=dict)
    ready: int = 0
    rejected: int = 0

    async def until_done(self, timeout_s: float) -> float:
        """Poll until every turn has a sample (or `timeout_s` passed); returns when the last was seen."""
        topics = [topic_name(NAMESPACE, "next_states"), topic_name(NAMESPACE, "samples")]
        deadline = time.monotonic() + timeout_s
        async with self.log.consumer(f"bench-watch-{time.time_ns()}", topics) as consumer:
            last_seen = time.monotonic()
            while len(self.sample_ms) < self.expected_turns and time.monotonic() < deadline:
                for record in await consumer.poll(max_records=2000, timeout_s=0.05):
                    last_seen = time.monotonic()
                    self._see(record.value, record.timestamp_ms)
        return last_seen

    def _see(self, value: bytes, timestamp_ms: int) -> None:
        # Read from the header: a full decode of every sample would load the measured process.
        keys = envelope_keys(value)
        if keys is None:
            envelope = decode(value)["envelope"]
            keys = envelope["event_type"], envelope["session_id"], envelope["turn_id"]
        kind, _, turn_id = keys
        if turn_id is None or not turn_id.startswith("s"):  # a warm-up session
            return
        if kind == "NextStateObserved":
            self.next_state_ms.setdefault(turn_id, timestamp_ms)
        elif kind in ("SampleReady", "SampleRejected") and turn_id not in self.sample_ms:
            self.sample_ms[turn_id] = timestamp_ms
            self.ready += kind == "SampleReady"
            self.rejected += kind == "SampleRejected"

    def latencies_ms(self) -> list[int]:
        return sorted(
            self.sample_ms[t] - self.next_state_ms[t] for t in self.sample_ms if t in self.next_state_ms
        )


def cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its children (the downstream `orl pipeline`), so far.

    Exited children count through getrusage, live ones through /proc (Linux; elsewhere they count
    once they exit, start-up included). A figure that other load on the machine barely changes."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime + live_children_cpu_s()


def live_children_cpu_s() -> float:
    total_ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():  # fields[1] is the parent pid; utime, stime follow at 11, 12
            total_ticks += int(fields[11]) + int(fields[12])
    return total_ticks / os.sysconf("SC_CLK_TCK")


def percentile(values: list[int], q: float) -> float:
    return float(values[min(len(values) - 1, int(q * len(values)))]) if values else float("nan")


async def run_stages(
    log: EventLog,
    args: argparse.Namespace,
    data_dir: Path,
    stop: asyncio.Event,
    names: Sequence[str] | None = None,
) -> list[asyncio.Task[None]]:
    settings = bench_settings(args, "unused://", data_dir)
    stages = [s for s in build_stages(settings) if names is None or s.name in names]
    runners = build_runners(log, settings, stages)  # as `orl pipeline` builds them
    return [asyncio.create_task(runner.run(stop)) for runner in runners]


async def run_pipeline_process(settings: PipelineSettings, stop: asyncio.Event) -> None:
    """`orl pipeline` in a child process with `settings` in its environment, until `stop` (as `orl up` runs it)."""
    with (settings.data_dir / f"pipeline-{settings.role}.log").open("ab") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "orl.cli", "pipeline", env={**os.environ, **settings_env(settings)},
            stdout=log_file, stderr=subprocess.STDOUT,
        )  # fmt: skip
        exited = asyncio.ensure_future(process.wait())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not exited.done():
            process.terminate()
        await exited
    if not stop.is_set():
        raise RuntimeError(f"the {settings.role} pipeline process exited with {process.returncode}")


async def start_stages(
    log: EventLog,
    args: argparse.Namespace,
    data_dir: Path,
    stop: asyncio.Event,
    names: Sequence[str] | None,
    log_url: str,
) -> list[asyncio.Task[None]]:
    """The named stages as runners here (faust: the judge), or (None) the pipeline as `orl up` runs it
    on the log at `log_url` (`log` is the same log, opened here)."""
    if names is not None:
        return await run_stages(log, args, data_dir, stop, names)
    settings = bench_settings(args, log_url, data_dir)
    roles = {"pipeline": "all"} if args.one_process else pipeline_roles(settings.method, available_cores())
    tasks = [asyncio.create_task(run_pipeline(dataclasses.replace(settings, role=roles["pipeline"]), stop))]
    if "pipeline-downstream" in roles:
        downstream = dataclasses.replace(settings, role=roles["pipeline-downstream"])
        tasks.append(asyncio.create_task(run_pipeline_process(downstream, stop)))
    return tasks


async def measure(
    log: EventLog,
    args: argparse.Namespace,
    data_dir: Path,
    mode: str,
    stage_names: Sequence[str] | None = None,
    log_url: str | None = None,
) -> dict[str, Any]:
    """One throughput (mode "backlog" or "burst") or latency (mode "rate") run on a fresh namespace of `log`.

    `stage_names` None: the embedded pipeline, started here; else only those stages are started here
    (the faust benchmark starts the others, and warms them up, itself)."""
    log_url = log_url or f"sqlite:///{data_dir / 'log.db'}"
    slots = encoded_stream(args.sessions, args.turns, args.close)
    expected = args.sessions * (args.turns if args.close else args.turns - 1)
    await create_catalog_topics(log, NAMESPACE, args.partitions)
    watch = SampleWatch(log, expected)
    stop = asyncio.Event()
    started = time.monotonic()
    if mode == "backlog":  # everything in the log first, then the stages start (cold start)
        await append_grouped(log, [r for slot in slots for r in slot])
        started = time.monotonic()
        tasks = await start_stages(log, args, data_dir, stop, stage_names, log_url)
    elif mode == "burst":  # the stages already run and are warm: append everything as fast as possible
        tasks = await start_stages(log, args, data_dir, stop, stage_names, log_url)
        if stage_names is None:
            await warm_up(log, warm_up_sessions(args, log_url))
        started = time.monotonic()
        await append_grouped(log, [r for slot in slots for r in slot])
    else:
        tasks = await start_stages(log, args, data_dir, stop, stage_names, log_url)
        tasks.append(asyncio.create_task(offer(log, slots, args.rate, args.sessions)))
    cpu_before_s = cpu_seconds()
    try:
        finished = await watch.until_done(args.timeout_s)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    cpu_s = cpu_seconds() - cpu_before_s
    latencies = watch.latencies_ms()
    sampled = len(watch.sample_ms)
    if sampled < expected:
        print(
            f"WARNING: only {sampled} of {expected} turns were sampled within {args.timeout_s} s", flush=True
        )
    return {
        "mode": mode,
        "turns": sampled,
        "expected_turns": expected,
        "seconds": round(finished - started, 2),
        "turns_per_s": round(sampled / (finished - started), 1),
        "sample_ready": watch.ready,
        "sample_rejected": watch.rejected,
        "latency_p50_ms": percentile(latencies, 0.5),
        "latency_p99_ms": percentile(latencies, 0.99),
        "latency_max_ms": latencies[-1] if latencies else None,
        "cpu_s": round(cpu_s, 2),
    }


async def offer(
    log: EventLog, slots: list[list[tuple[str, OutgoingRecord]]], rate: float, sessions: int
) -> None:
    """Append the turns at `rate` turns/s, in 20 ms batches (a turn = its request + response)."""
    records = [r for slot in slots for r in slot]
    per_turn = len(records) / (len(slots) * sessions)
    started = time.monotonic()
    sent = 0
    while sent < len(records):
        due = min(len(records), int((time.monotonic() - started) * rate * per_turn) + 1)
        if due > sent:
            await append_grouped(log, records[sent:due])
            sent = due
        await asyncio.sleep(0.02)


async def embedded(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    processes = "1 process" if args.one_process or available_cores() < 2 else "2 processes"
    sealings = {"on": [True], "off": [False], "both": [False, True]}[args.sealing]
    for mode in ("backlog", "burst", "rate"):
        for _ in range(args.repeat):
            for sealed in sealings:  # side by side: clear then sealed, in every round
                args.sealed = sealed
                with tempfile.TemporaryDirectory() as tmp:
                    result = await measure_embedded(args, Path(tmp), mode)
                result["runtime"] = f"embedded (SQLite, {processes}, {'sealed' if sealed else 'clear'})"
                print(json.dumps(result), flush=True)
                results.append(result)
    return results


async def measure_embedded(args: argparse.Namespace, data_dir: Path, mode: str) -> dict[str, Any]:
    """One run on a fresh SQLite log in `data_dir`; sealed (`args.sealed`) with a key store there, which
    this process's stages and the appended serving events use too (the child opens the same file)."""
    from orl.connectors.event_log.sqlite_log import SqliteEventLog

    previous = installed_data_keys()
    keys = KeyStore(data_dir / "keys.db") if args.sealed else None
    install_data_keys(keys)
    log = SqliteEventLog(data_dir / "log.db")
    await log.start()
    try:
        return await measure(log, args, data_dir, mode)
    finally:
        await log.close()
        install_data_keys(previous)
        if keys is not None:
            keys.close()


def warm_up_sessions(args: argparse.Namespace, log_url: str) -> int:
    """--warm-up-sessions, or its default: 5 on SQLite; 1,000 on Kafka, whose fresh broker spends tens of
    CPU seconds JIT-compiling its hot paths (a production broker has long done that)."""
    if args.warm_up_sessions is not None:
        return int(args.warm_up_sessions)
    return 1000 if log_url.startswith("kafka://") else 5


async def warm_up(log: EventLog, sessions: int) -> None:
    """Run `sessions` two-turn sessions through the whole pipeline and wait for their samples, so every
    stage has joined its group (and the broker and the workers are warm)."""
    await append_grouped(log, [r for slot in encoded_stream(sessions, 2, False, prefix="w") for r in slot])
    expected = sessions
    deadline = time.monotonic() + 180
    seen: set[str] = set()
    async with log.consumer(f"bench-warmup-{time.time_ns()}", [topic_name(NAMESPACE, "samples")]) as consumer:
        while len(seen) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"warm-up: {len(seen)} of {expected} samples in 180 s (see faust-worker.log)"
                )
            for record in await consumer.poll(max_records=2000, timeout_s=0.2):
                seen.add(decode(record.value)["envelope"]["turn_id"])


def print_table(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    print(f"\n{args.sessions} sessions x {args.turns} turns{' + SessionClosed' if args.close else ''}, "
          f"judge {args.judge}, method binary, "
          f"{args.partitions} partition(s), offered rate {args.rate} turns/s in latency runs")  # fmt: skip
    print(
        "| runtime | run | turns | s | turns/s | ready / rejected | next-state -> sample p50 ms | p99 ms | max ms "
        "| CPU s |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        run = {"backlog": "throughput (backlog, cold start)", "burst": "throughput (burst, warm)"}.get(
            r["mode"], f"latency (offered {args.rate}/s)"
        )
        print(f"| {r['runtime']} | {run} | {r['turns']} | {r['seconds']} | {r['turns_per_s']} "
              f"| {r['sample_ready']} / {r['sample_rejected']} | {r['latency_p50_ms']:.0f} "
              f"| {r['latency_p99_ms']:.0f} | {r['latency_max_ms']} | {r['cpu_s']} |")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "runtime",
        help="what to measure: embedded, kafka, faust or llm, or a comma-separated list run in turn",
    )
    parser.add_argument("--sessions", type=int, default=400, help="sessions per run")
    parser.add_argument(
        "--warm-up-sessions",
        type=int,
        default=None,
        help="two-turn sessions run through the pipeline before a warm run (default 5 on SQLite, 1000 on Kafka)",
    )
    parser.add_argument("--turns", type=int, default=5, help="main turns per session")
    parser.add_argument("--rate", type=float, default=1000.0, help="offered turns/s in the latency runs")
    parser.add_argument("--repeat", type=int, default=1, help="runs per measurement")
    parser.add_argument("--partitions", type=int, default=1, help="partitions of every topic")
    parser.add_argument("--close", action="store_true", help="end every session with SessionClosed")
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="embedded: every stage in this process (no downstream process)",
    )
    parser.add_argument("--judge", default="user_reply", help="rule judge (entry point name)")
    parser.add_argument(
        "--sealing",
        choices=("on", "off", "both"),
        default="on",
        help="embedded: seal payloads as a deployment does (on), write in clear (off), or both in turn",
    )
    parser.add_argument("--effect-concurrency", type=int, default=4, help="concurrent judge calls")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up on a run after this long")
    parser.add_argument("--judgements", type=int, default=4, help="llm: turns to judge")
    parser.add_argument("--votes", type=int, default=3, help="llm: votes per judgement (m)")
    parser.add_argument("--judge-max-tokens", type=int, default=32, help="llm: judge max_tokens")
    parser.add_argument("--commit-interval-s", type=float, default=0.1, help="faust: commit interval")
    parser.add_argument("--guarantee", default="exactly_once", help="faust: processing guarantee")
    parser.add_argument(
        "--faust-workers", default="1", help="faust: workers in the group, or a list measured in turn (1,2)"
    )
    parser.add_argument("--faust-worker", default=None, help=argparse.SUPPRESS)  # child worker mode
    parser.add_argument("--work-dir", type=Path, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from benchmarks.bench_pipeline_runtimes import (  # they import this module
        faust,
        faust_worker,
        kafka,
        llm_votes,
    )

    if args.faust_worker:
        faust_worker(args)
        return
    runtimes = [name.strip() for name in args.runtime.split(",")]
    if "llm" in runtimes:
        if runtimes != ["llm"]:
            raise SystemExit("llm is measured alone")
        asyncio.run(llm_votes(args))
        return
    runs = {"embedded": embedded, "kafka": kafka, "faust": faust}
    unknown = [name for name in runtimes if name not in runs]
    if unknown:
        raise SystemExit(f"unknown runtime(s) {unknown}: choose from {sorted(runs)} or llm")
    results = []
    for name in runtimes:
        results += asyncio.run(runs[name](args))
    print_table(args, results)


if __name__ == "__main__":
    main()
