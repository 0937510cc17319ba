"""Replay throughput with recorded votes, and audit lookup latency, on the embedded (SQLite) log.

Run from the repository root:

    .venv/bin/python -m benchmarks.bench_replay_audit --turns 100000

1. Records a namespace of --turns main turns (--turns-per-session per session): the serving events,
   next states and --votes LLM-style judge votes per turn are written directly, then vote_tally and
   sample_builder (binary method) run over them, as the live pipeline would.
2. Replays it with `--votes reuse` into a new namespace (copy + vote_tally + sample_builder +
   flush) and reports turns/s (target >= 5,000), and checks the sample count matches.
3. Builds the audit index of the recorded namespace once (timed), then audits --lookups random
   sample ids, each a full chain (request, response, next state, votes, reward, sample, training):
   median and max latency per lookup (target < 1 s), the index catch-up included.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import platform
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.history.audit import audit_id
from orl.pipeline.history.audit_index import AuditIndex
from orl.pipeline.history.namespace_io import NamespaceWriter, read_events
from orl.pipeline.history.replay import REUSE_TOPICS, ReplayPlan, log_source, replay, run_stages
from orl.pipeline.history.replay_workers import workers_for
from orl.pipeline.processors.config import PipelineConfig, SampleConfig, TallyConfig
from orl.pipeline.processors.registry import PURE_PROCESSORS
from orl.schemas.event_constructors import (
    judge_vote_cast,
    next_state_observed,
    request_received,
    response_generated,
    session_closed,
)
from orl.schemas.event_types import SamplingParams
from orl.schemas.events import EventOrigin

SOURCE = "bench"
T0_MS = 1_700_000_000_000
Event = dict[str, Any]


def _ids(text: str, n: int) -> list[int]:
    seed = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)
    return [(seed + i * 7919) % 49000 for i in range(n)]


def _sampling() -> SamplingParams:
    return {"temperature": 0.7, "top_p": 1.0, "max_tokens": 256, "stop": [], "seed": None}


def turn_events(session: str, index: int, votes: int, at_ms: int) -> list[Event]:
    turn_id, request_id = f"{session}/t{index}", f"req-{session}-{index}"
    messages = [{"role": "user", "content": f"question {index} of {session}"}]
    prompt, response = _ids(turn_id, 120), _ids(turn_id + "r", 60)

    def origin(producer: str, occurred_at_ms: int, *id_parts: object) -> EventOrigin:
        return EventOrigin(
            namespace=SOURCE,
            producer=producer,
            occurred_at_ms=occurred_at_ms,
            id_parts=id_parts,
            session_id=session,
            turn_id=turn_id,
        )

    request = request_received(
        origin("serving/bench", at_ms, request_id),
        request_id=request_id, turn_kind="main", turn_index=index, previous_turn_id=None, link_method="header",
        messages_json=json.dumps(messages), tools_json=None, tool_choice_json=None, sampling=_sampling(),
        model="bench", stream=False, client_id=None, group_id=None, group_size=None,
    )  # fmt: skip
    answer = response_generated(
        origin("serving/bench", at_ms + 10, request_id, "response"),
        request_id=request_id, prompt_token_ids=prompt,
        response_token_ids=response, response_logprobs=[-0.5] * len(response), response_text="an answer " * 20, reasoning_text=None,
        tool_calls_json=None, finish_reason="stop", sampling=_sampling(), policy_version=0, policy_spans=[],
        latency_ms=100.0, prompt_tokens=len(prompt), completion_tokens=len(response), model="bench",
    )  # fmt: skip
    next_state = next_state_observed(
        origin("pipeline.turn_linker/1", at_ms + 20, turn_id, "next"),
        source="next_request", role="user", content="thanks" if index % 3 else "redo it",
        messages_json=None, outcome=None,
    )  # fmt: skip
    ns_id = next_state["envelope"]["event_id"]
    cast = [
        judge_vote_cast(
            origin("pipeline.judge/1", at_ms + 30 + v, ns_id, "prm", "cfg", v),
            judge_id="prm",
            judge_kind="llm",
            judge_config_version="cfg",
            model="judge",
            model_version="1",
            vote_index=v,
            prompt_sha256="0" * 64,
            prompt_text="judge prompt " * 30,
            sampling=_sampling(),
            raw_output=f"reasoning... \\boxed{{{1 if index % 3 else -1}}}",
            score=1 if index % 3 else -1,
            parse_error=None,
            latency_ms=300.0,
            prompt_tokens=400,
            completion_tokens=50,
            next_state_event_id=ns_id,
        )
        for v in range(votes)
    ]
    return [dict(request), dict(answer), dict(next_state), *(dict(vote) for vote in cast)]


def session_events(n: int, turns: int, votes: int) -> list[Event]:
    session, at = f"s{n}", T0_MS + n * 60_000
    events = [e for i in range(turns) for e in turn_events(session, i, votes, at + i * 1000)]
    origin = EventOrigin(
        namespace=SOURCE,
        producer="serving/bench",
        occurred_at_ms=at + turns * 1000,
        id_parts=(session, "explicit"),
        session_id=session,
    )
    closed = session_closed(origin, reason="explicit", last_turn_id=f"{session}/t{turns - 1}")
    events.append(dict(closed))
    return events


def config(votes: int) -> PipelineConfig:
    return PipelineConfig(tally=TallyConfig(votes_per_judgement=votes), samples=SampleConfig(method="binary"))


async def record(log: EventLog, sessions: int, turns: int, votes: int) -> float:
    started = time.perf_counter()
    writer = NamespaceWriter(log, SOURCE)
    await writer.prepare()
    for first in range(0, sessions, 200):
        batch = [e for n in range(first, min(first + 200, sessions)) for e in session_events(n, turns, votes)]
        await writer.write(batch)
    plan = ReplayPlan(SOURCE, "reuse", "bench", "bench", flush=False)
    stages = [PURE_PROCESSORS["vote_tally"], PURE_PROCESSORS["sample_builder"]]
    await run_stages(log, stages, config(votes), plan, None)
    return time.perf_counter() - started


async def count(log: EventLog, namespace: str, topic: str) -> int:
    return sum([1 async for _ in read_events(log, f"{namespace}.{topic}")])


async def bench(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    sessions = args.turns // args.turns_per_session
    turns = sessions * args.turns_per_session
    results: dict[str, Any] = {"turns": turns, "votes_per_turn": args.votes}
    async with open_event_log(f"sqlite:///{data_dir / 'log.db'}") as log:
        results["record_s"] = await record(log, sessions, args.turns_per_session, args.votes)
        results["source_samples"] = await count(log, SOURCE, "samples")
        started = time.perf_counter()
        plan = ReplayPlan("replayed", "reuse", f"log:{SOURCE}", "bench")
        stages = [PURE_PROCESSORS["vote_tally"], PURE_PROCESSORS["sample_builder"]]
        source = log_source(log, SOURCE, REUSE_TOPICS)
        workers = workers_for(args.workers)
        results["workers"] = workers
        report = await replay(log, plan, source, stages, config(args.votes), workers=workers)
        results["replay_s"] = time.perf_counter() - started
        results["replay_turns_per_s"] = turns / results["replay_s"]
        results["replayed_samples"] = report.samples_ready + report.samples_rejected
        index = AuditIndex(data_dir / "audit.sqlite", SOURCE)
        started = time.perf_counter()
        results["indexed_events"] = await index.catch_up(log)
        results["index_build_s"] = time.perf_counter() - started
        sample_ids = [
            row[0] for row in index.db.execute("SELECT event_id FROM events WHERE event_type = 'SampleReady'")
        ]
        latencies = []
        for sample_id in random.Random(0).sample(sample_ids, min(args.lookups, len(sample_ids))):
            started = time.perf_counter()
            chain = await audit_id(log, index, sample_id)
            latencies.append(time.perf_counter() - started)
            assert chain["samples"] and chain["votes"] and chain["request"]
        index.close()
    results["audit_median_s"] = statistics.median(latencies)
    results["audit_max_s"] = max(latencies)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--turns-per-session", type=int, default=4)
    parser.add_argument("--votes", type=int, default=3, help="recorded judge votes per turn")
    parser.add_argument("--lookups", type=int, default=20)
    parser.add_argument(
        "--workers", type=int, default=0, help="replay worker processes (0: one per core, at most 4)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        results = asyncio.run(bench(args, Path(tmp)))
    print(f"machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}")
    print("| turns | votes/turn | workers | record s | replay s | replay turns/s | samples (source = replay) "
          "| index build s | audit median s | audit max s |")  # fmt: skip
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    r = results
    print(f"| {r['turns']:,} | {r['votes_per_turn']} | {r['workers']} | {r['record_s']:.1f} | {r['replay_s']:.1f} | "
          f"{r['replay_turns_per_s']:,.0f} | {r['source_samples']:,} = {r['replayed_samples']:,} | "
          f"{r['index_build_s']:.1f} | {r['audit_median_s']:.3f} | {r['audit_max_s']:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
