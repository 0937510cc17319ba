"""The verdict on a fault run (tests/faults/harness.py): what the log and the object store hold against
what the clients were acknowledged, and the figures of the results table.

Reads the stopped stack's SQLite log (topics `live.requests`, `.responses`, `.next_states`,
`.samples`, `.train_steps`, `.checkpoints`) and its object store (<data_dir>/objects). Events are
counted by distinct event id; extra copies of one event id (the spool's documented at-least-once
append after a crash between the log append and the spool delete) are counted apart, as `copies`.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orl.connectors.checkpoint_store import CheckpointRejected, complete_versions, download_and_verify
from orl.connectors.object_store.factory import open_object_store
from orl.rules.gate_decisions import PROMOTED

from tests.faults.harness import COMPONENTS, NAMESPACE, FaultRun, derived_requests
from tests.integration.log_reading import read_events

TOPICS = (
    "requests",
    "responses",
    "next_states",
    "samples",
    "train_steps",
    "checkpoints",
    "policy_activations",
)
EXITED_LINE = re.compile(r"(\S+) exited with (-?\d+); restarting")


@dataclass
class Verdict:
    """Figures of one run; `problems` lists every broken guarantee, precisely."""

    figures: dict[str, Any] = field(default_factory=dict)
    components: dict[str, dict[str, Any]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def distinct(events: list[dict[str, Any]], event_type: str) -> list[dict[str, Any]]:
    """The events of `event_type`, one per event id."""
    by_id = {e["envelope"]["event_id"]: e for e in events if e["envelope"]["event_type"] == event_type}
    return list(by_id.values())


def extra_copies(events: list[dict[str, Any]]) -> int:
    counts = Counter(e["envelope"]["event_id"] for e in events)
    return sum(n - 1 for n in counts.values())


def check_run(run: FaultRun) -> Verdict:
    verdict = Verdict()
    log = {topic: asyncio.run(read_events(run.log_url, f"{NAMESPACE}.{topic}")) for topic in TOPICS}
    verdict.figures["log copies of one event id"] = {t: extra_copies(log[t]) for t in TOPICS if log[t]}
    check_kills(run, verdict)
    check_turns(run, log, verdict)
    check_feedback(run, log, verdict)
    check_samples(run, log, verdict)
    check_checkpoints(run, log, verdict)
    check_gate(log, verdict)
    for target, kind in sorted({(o.target, o.kind) for o in run.outages}):
        outages = [o for o in run.outages if (o.target, o.kind) == (target, kind)]
        durations = ", ".join(f"{o.paused_s:g}" for o in outages)
        verdict.figures[f"{target} {kind} (s out each; turns acknowledged meanwhile)"] = (
            f"{len(outages)} x ({durations}) s; {sum(o.turns_acked_during for o in outages)}"
        )
    derived_after = "not within the drain" if run.derived_after_s is None else run.derived_after_s
    verdict.figures["sessions ended -> every turn derived (s)"] = derived_after
    if run.final_chat_status != 200:
        verdict.problems.append(f"the final chat after the faults got {run.final_chat_status}, not 200")
    return verdict


def check_kills(run: FaultRun, verdict: Verdict) -> None:
    exits = Counter(name for name, _ in EXITED_LINE.findall(run.up_log))
    killed_gate = any(k.component == "gate" for k in run.kills) or exits["gate"]
    for component in (*COMPONENTS, "gate") if killed_gate else COMPONENTS:
        kills = [k for k in run.kills if k.component == component]
        times = [k.recovery_s for k in kills if k.recovery_s is not None]
        verdict.components[component] = {
            "kills": len(kills),
            "restarts": exits[component],
            "recovery median s": statistics.median(times) if times else None,
            "recovery max s": max(times) if times else None,
        }
        if len(times) != len(kills):
            verdict.problems.append(f"{component}: {len(kills) - len(times)} kills without a restart")
        if exits[component] != len(kills):
            verdict.problems.append(
                f"{component}: `orl up` restarted it {exits[component]} times for {len(kills)} kills"
            )


def check_turns(run: FaultRun, log: dict[str, list[dict[str, Any]]], verdict: Verdict) -> None:
    requests = defaultdict(list)
    for event in distinct(log["requests"], "RequestReceived"):
        requests[event["request_id"]].append(event)
    responses = defaultdict(list)
    for event in distinct(log["responses"], "ResponseGenerated"):
        responses[event["request_id"]].append(event)
    lost = duplicated = 0
    for turn in run.turns:
        got_requests, got_responses = requests[turn.response_id], responses[turn.response_id]
        if not got_requests or not got_responses:
            lost += 1
            verdict.problems.append(
                f"acknowledged turn {turn.turn_id} ({turn.response_id}): {len(got_requests)} RequestReceived, "
                f"{len(got_responses)} ResponseGenerated on the log"
            )
        if len(got_requests) > 1 or len(got_responses) > 1:
            duplicated += 1
            verdict.problems.append(
                f"acknowledged turn {turn.turn_id} ({turn.response_id}) recorded twice: {len(got_requests)} "
                f"RequestReceived, {len(got_responses)} ResponseGenerated with distinct event ids"
            )
        for response in got_responses:
            if response["response_text"] != turn.text or response["envelope"]["turn_id"] != turn.turn_id:
                verdict.problems.append(f"turn {turn.response_id}: the log's response differs from the reply")
    reused = {turn_id: n for turn_id, n in Counter(t.turn_id for t in run.turns).items() if n > 1}
    for turn_id, n in sorted(reused.items()):
        sessions = [(t.position, t.response_id) for t in run.turns if t.turn_id == turn_id]
        verdict.problems.append(f"turn id {turn_id} was given to {n} acknowledged turns: {sessions}")
    verdict.figures.update(
        {
            "acknowledged turns": len(run.turns),
            "failed or refused requests (retried)": run.failed_requests,
            "turns lost": lost,
            "turns duplicated": duplicated,
            "turn ids reused": len(reused),
        }
    )


def check_feedback(run: FaultRun, log: dict[str, list[dict[str, Any]]], verdict: Verdict) -> None:
    on_log = Counter(e["envelope"]["event_id"] for e in log["next_states"])
    lost = [f for f in run.feedback if on_log[f.event_id] == 0]
    for feedback in lost:
        verdict.problems.append(
            f"acknowledged feedback {feedback.event_id} on {feedback.turn_id} is not on the log"
        )
    verdict.figures.update(
        {
            "feedback acknowledged": len(run.feedback),
            "feedback failed (retried)": run.failed_feedback,
            "feedback lost": len(lost),
        }
    )


def check_samples(run: FaultRun, log: dict[str, list[dict[str, Any]]], verdict: Verdict) -> None:
    """Each turn is derived once: at most one SampleReady and one SampleRejected, and both only when
    sample_builder's at-least-one promotion turned the rejected turn into a promoted sample (its
    documented design, pipeline/processors/sample_decisions.py). A sample's lineage must join a
    request with its own response."""
    ready = distinct(log["samples"], "SampleReady")
    rejected = distinct(log["samples"], "SampleRejected")
    derived: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in ready + rejected:
        derived[event["envelope"]["turn_id"]].append(event)
    twice = 0
    for turn_id, events in sorted(derived.items()):
        kinds = Counter(e["envelope"]["event_type"] for e in events)
        promoted = [e for e in events if e["envelope"]["event_type"] == "SampleReady" and e["promoted"]]
        if max(kinds.values()) > 1 or (len(kinds) == 2 and not promoted):
            twice += 1
            verdict.problems.append(f"turn {turn_id} derived {len(events)} times: {dict(kinds)}")
    request_of = {e["envelope"]["event_id"]: e["request_id"] for e in log["requests"] if "request_id" in e}
    response_of = {e["envelope"]["event_id"]: e["request_id"] for e in log["responses"]}
    mismatched = [
        e["envelope"]["turn_id"]
        for e in ready
        if request_of.get(e["lineage"]["request_event_id"])
        != response_of.get(e["lineage"]["response_event_id"])
    ]
    for turn_id in mismatched:
        verdict.problems.append(f"sample of turn {turn_id} joins a request with another request's response")
    derived_ids = derived_requests(log["responses"], ready + rejected)
    never = [t for t in run.turns if t.response_id not in derived_ids]
    for turn in never:
        verdict.problems.append(
            f"acknowledged turn {turn.turn_id} ({turn.response_id}, turn {turn.position} of its session) "
            "was never derived into a sample or a rejection"
        )
    trained = Counter(
        sid for e in distinct(log["train_steps"], "TrainStepCompleted") for sid in e["sample_ids"]
    )
    verdict.figures.update(
        {
            "samples ready": len(ready),
            "samples rejected": len(rejected),
            "rejected turns promoted at session end": sum(1 for e in ready if e["promoted"]),
            "duplicate derivations": twice,
            "samples joining another request's response": len(mismatched),
            "acknowledged turns never derived": len(never),
            "train steps": len(distinct(log["train_steps"], "TrainStepCompleted")),
            "samples in more than one train step": sum(1 for n in trained.values() if n > 1),
        }
    )


def check_checkpoints(run: FaultRun, log: dict[str, list[dict[str, Any]]], verdict: Verdict) -> None:
    published = distinct(log["checkpoints"], "CheckpointPublished")
    access, secret = run.store_keys or (None, None)
    store = open_object_store(run.store_url, access_key=access, secret_key=secret)
    per_version = Counter((e["run_id"], e["version"]) for e in published)
    for (run_id, version), n in sorted(per_version.items()):
        if n > 1:
            verdict.problems.append(f"checkpoint {run_id} v{version} published {n} times")
    verified = 0
    for event in published:
        with tempfile.TemporaryDirectory() as dest:
            try:
                download_and_verify(store, event["manifest_key"], Path(dest), event["manifest_sha256"])
                verified += 1
            except CheckpointRejected as error:
                verdict.problems.append(f"published checkpoint does not verify: {error}")
    in_store = {
        (run_id, v) for run_id in {e["run_id"] for e in published} for v in complete_versions(store, run_id)
    }
    unannounced = in_store - set(per_version)
    for run_id, version in sorted(unannounced):
        verdict.problems.append(
            f"checkpoint {run_id} v{version} is complete in the store but never published"
        )
    verdict.figures.update(
        {
            "checkpoints published": len(published),
            "checkpoints verified": verified,
            "checkpoint versions in the store": len(in_store),
        }
    )


def check_gate(log: dict[str, list[dict[str, Any]]], verdict: Verdict) -> None:
    """With the promotion gate: each version decided once (a restarted gate reads its decisions back),
    and servers activated only promoted versions."""
    gated = distinct(log["checkpoints"], "PolicyGated")
    if not gated:
        return
    decided = Counter((e["run_id"], e["version"]) for e in gated)
    for (run_id, version), n in sorted(decided.items()):
        if n > 1:
            verdict.problems.append(f"the gate decided {run_id} v{version} {n} times")
    promoted = {(e["run_id"], e["version"]) for e in gated if e["decision"] == PROMOTED}
    served = {
        (e["run_id"], e["version"])
        for e in distinct(log["policy_activations"], "PolicyActivated")
        if e["version"] > 0
    }
    for run_id, version in sorted(served - promoted):
        verdict.problems.append(f"servers activated {run_id} v{version}, which the gate never promoted")
    verdict.figures.update(
        {
            "gate decisions (promoted, held)": f"{len(promoted)}, {len(gated) - len(promoted)}",
            "versions served that the gate did not promote": len(served - promoted),
        }
    )


def results_table(verdict: Verdict) -> str:
    """Markdown: one row per component, then the totals and every problem found."""
    lines = [
        "| component | kills | restarts seen | recovery median (s) | recovery max (s) |",
        "|---|---|---|---|---|",
    ]
    for component, row in verdict.components.items():
        median, worst = row["recovery median s"], row["recovery max s"]
        lines.append(
            f"| {component} | {row['kills']} | {row['restarts']} | "
            f"{'-' if median is None else f'{median:.1f}'} | {'-' if worst is None else f'{worst:.1f}'} |"
        )
    lines += ["", "| total | value |", "|---|---|"]
    for name, value in verdict.figures.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {n}" for k, n in value.items() if n) or "none"
        lines.append(f"| {name} | {value} |")
    lines += ["", f"problems: {len(verdict.problems)}"] + [f"- {problem}" for problem in verdict.problems]
    return "\n".join(lines)
