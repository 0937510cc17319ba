"""`orl status`: where a running (or stopped) stack stands, in a few lines.

Reads `<data-dir>/logs/status.json` (written by `orl up`'s supervisor), the servers' spool files
(`<data-dir>/spool-*.db`) and, from the log, the namespace's checkpoints, gate decisions, activations
and samples. Writes nothing. `stack_status` is the pure part: the figures in, the lines out. The
samples topic grows with every turn: it is counted from each record's envelope head, and only the
newest built sample is decoded.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.settings import ConnectionSettings
from orl.pipeline.history.namespace_io import envelope_head, namespace_events, read_batches
from orl.schemas.codec import decode, payload_forgotten
from orl.schemas.topics import topic_name

STATUS_TOPICS = ("checkpoints", "policy_activations")
Event = dict[str, Any]


@dataclass(frozen=True)
class SampleTally:
    """The samples topic in brief: SampleReady and SampleRejected counts, and the newest SampleReady."""

    built: int = 0
    rejected: int = 0
    newest: Event | None = None


@dataclass(frozen=True)
class StatusSettings(ConnectionSettings):
    pass


def _age(now_ms: int, then_ms: int) -> str:
    seconds = max(0, (now_ms - then_ms) // 1000)
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago"


def component_lines(processes: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per supervised process of status.json."""
    lines = []
    for name, process in processes.items():
        state = str(process["state"])
        if process.get("crash_loop"):
            state += ", CRASH LOOP"
        exit_code = process.get("last_exit_code")
        last_exit = f", last exit {exit_code}" if exit_code is not None else ""
        lines.append(f"  {name:<20} {state}: {process['restarts']} restarts{last_exit}")
    return lines


def policy_lines(events: Mapping[str, Sequence[Event]], samples: SampleTally, now_ms: int) -> list[str]:
    """Versions published, promoted and held by the gate, served by each server, and the last sample."""
    checkpoints = [e for e in events["checkpoints"] if e["envelope"]["event_type"] == "CheckpointPublished"]
    gated = [e for e in events["checkpoints"] if e["envelope"]["event_type"] == "PolicyGated"]
    promoted = sorted({e["version"] for e in gated if e["decision"] == "promoted"})
    held = sorted({e["version"] for e in gated if e["decision"] != "promoted"})
    served: dict[str, int] = {}
    for event in events["policy_activations"]:
        if event["envelope"]["event_type"] == "PolicyActivated":
            served[event["server_id"]] = event["version"]
    lines = [
        f"  checkpoints: {len(checkpoints)} published"
        + (f", newest v{max(e['version'] for e in checkpoints)}" if checkpoints else ""),
        f"  gate: promoted {_versions(promoted)}, held {_versions(held)}",
        "  served: "
        + (
            ", ".join(f"v{v} on {server}" for server, v in sorted(served.items()))
            if served
            else "the base model"
        ),
    ]
    last = samples.newest
    if last is not None:
        lines.append(
            f"  samples: {samples.built} built, {samples.rejected} rejected; the last "
            f"{_age(now_ms, last['envelope']['occurred_at'])} (v{last['policy_version']}, {last['method']})"
        )
    else:
        lines.append(f"  samples: none built yet, {samples.rejected} rejected")
    return lines


def _versions(versions: Sequence[int]) -> str:
    return ", ".join(f"v{v}" for v in versions) if versions else "none"


def stack_status(
    processes: Mapping[str, Mapping[str, Any]] | None,
    spool_depths: Mapping[str, int],
    events: Mapping[str, Sequence[Event]],
    samples: SampleTally,
    now_ms: int,
) -> list[str]:
    """The lines `orl status` prints."""
    lines = ["processes (logs/status.json):"]
    lines += component_lines(processes) if processes else ["  none: orl up has not run with this --data-dir"]
    lines.append("spools (events acknowledged, not yet on the log):")
    lines += [f"  {name}: {depth}" for name, depth in spool_depths.items()] or ["  none"]
    lines.append("policy:")
    lines += policy_lines(events, samples, now_ms)
    return lines


async def read_status_events(log_url: str, namespace: str) -> tuple[dict[str, list[Event]], SampleTally]:
    async with open_event_log(log_url) as log:
        events = await namespace_events(log, namespace, STATUS_TOPICS)
        built = rejected = 0
        newest: tuple[int, bytes] | None = None  # (occurred_at, bytes) of the newest SampleReady
        async for records in read_batches(log, topic_name(namespace, "samples")):
            for record in records:
                head = envelope_head(record.value)
                if head is None:  # written with an older schema: decode it whole
                    envelope = decode(record.value)["envelope"]
                    event_type, occurred_at = envelope["event_type"], envelope["occurred_at"]
                else:
                    event_type, occurred_at = head.event_type, head.occurred_at
                if event_type == "SampleReady":
                    built += 1
                    if (newest is None or occurred_at >= newest[0]) and not payload_forgotten(record.value):
                        newest = (occurred_at, record.value)
                elif event_type == "SampleRejected":
                    rejected += 1
        return events, SampleTally(built, rejected, decode(newest[1]) if newest else None)


def spool_depths(data_dir: Path) -> dict[str, int]:
    from orl.serving.spool import EventSpool

    depths = {}
    for path in sorted(data_dir.glob("spool-*.db")):
        spool = EventSpool(path)
        try:
            depths[path.name] = spool.depth()
        finally:
            spool.close()
    return depths


def show_status(settings: StatusSettings) -> int:
    status_path = settings.data_dir / "logs" / "status.json"
    processes = json.loads(status_path.read_text()) if status_path.exists() else None
    if settings.log_url or (settings.data_dir / "log.db").exists():
        events, samples = asyncio.run(read_status_events(settings.effective_log_url(), settings.namespace))
    else:  # no embedded log here yet: nothing was recorded (and reading must not create one)
        events, samples = {topic: [] for topic in STATUS_TOPICS}, SampleTally()
    print(f"orl status of {settings.data_dir} (namespace {settings.namespace})")
    for line in stack_status(
        processes, spool_depths(settings.data_dir), events, samples, int(time.time() * 1000)
    ):
        print(line)
    return 0
