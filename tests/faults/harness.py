"""Crash-anywhere faults under a live `orl up` (issue 22): traffic, kill -9 of every component, drain.

`run_fault_suite` starts `orl up --method binary --components serve,pipeline,train` on the real small
model (tests/e2e/up_stack.py), runs two loops against it while it kills each component in turn with
SIGKILL at seeded random moments, then stops the loops, lets the pipeline and trainer drain, checks
the server still answers and stops the stack with SIGTERM. What the clients were acknowledged and
what the kills did is returned as a `FaultRun`; tests/faults/checks.py holds the verdict on the log.

- chat loop: sessions of two turns under an `X-Session-Id`; the second user message says "thanks", so
  the rule judge rewards the first turn. Every 200 is recorded (session, turn id header, response id,
  text); a refused or failed request is retried as a new request and the failure is recorded.
- ingest loop: POST /v1/feedback (thumbs up, explicit turn id) for every acknowledged first turn;
  every 2xx is recorded with the event id the server returned.
- kills: for each round, for serve, pipeline, pipeline-downstream, train and (with the promotion gate)
  gate in turn: wait a random 1-6 s, kill -9 the pid `orl up` last logged for it, wait for a new pid
  (and /readyz 200 for serve).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.test_up_supervision import alive, children, ready
from tests.e2e.up_stack import UpStack, running_up
from tests.fixtures.kafka_relay import KafkaRelay
from tests.integration.log_reading import read_events

COMPONENTS = ("serve", "pipeline", "pipeline-downstream", "train")
MIN_TURNS = 12  # traffic goes on after the last fault until this many chat turns are acknowledged
NAMESPACE = "live"
MAX_TOKENS = 8
# ORL_CORES=2: the stack splits its pipeline into two processes (orl.up.pipeline_roles), as on any
# machine with 2+ cores, even in a test worker pinned to one core: the suite kills each of them.
STACK_ENV = {"ORL_TRAIN_BATCH_SIZE": "4", "ORL_CORES": "2"}
# with the promotion gate: small evaluations (the suite tests crashes, not the gate's judgement)
GATE_ENV = {"ORL_GATE_PROMPTS": "4", "ORL_GATE_SAMPLES": "1", "ORL_GATE_MAX_TOKENS": str(MAX_TOKENS)}
IDLE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class AckedTurn:
    """A chat request the server acknowledged with 200."""

    session_id: str
    position: int  # 1 or 2 within the client's session
    turn_id: str  # the x-turn-id header
    response_id: str  # the body's "id" (the request id the server recorded)
    text: str


@dataclass(frozen=True)
class AckedFeedback:
    session_id: str
    turn_id: str
    event_id: str  # the NextStateObserved event id the server returned with its 202


@dataclass(frozen=True)
class Kill:
    component: str
    old_pid: int
    new_pid: int | None  # None: no restart seen before the deadline
    recovery_s: float | None  # kill -> new pid (serve: -> /readyz 200)


@dataclass(frozen=True)
class Outage:
    target: str  # "log" | "store"
    paused_s: float  # how long it did not answer (SIGSTOP .. SIGCONT, or stop .. answering again)
    turns_acked_during: int  # chat turns the server acknowledged while the target was out
    # "stopped" (SIGSTOP: hangs) | "restarted" (started again in place) | "locked" | "cut" (one client's
    # traffic to the broker stops, tests/fixtures/kafka_relay.py)
    kind: str = "stopped"


@dataclass
class FaultRun:
    """What the clients saw and what the faults did; the stopped stack's log and store are at
    `log_url` and `store_url` (the embedded ones in `data_dir` unless the run named others)."""

    data_dir: Path
    log_url: str
    store_url: str
    store_keys: tuple[str, str] | None = None  # (access, secret) of an s3 store
    up_log: str = ""
    turns: list[AckedTurn] = field(default_factory=list)
    failed_requests: int = 0
    feedback: list[AckedFeedback] = field(default_factory=list)
    failed_feedback: int = 0
    kills: list[Kill] = field(default_factory=list)
    outages: list[Outage] = field(default_factory=list)
    final_chat_status: int | None = None
    derived_after_s: float | None = None  # sessions ended -> every acknowledged turn derived (None: never)
    wall_s: float = 0.0


def save_run(run: FaultRun, path: Path) -> None:
    """The run as JSON (benchmarks/fault_suite.py keeps it, so a run's log can be checked again)."""
    path.write_text(json.dumps({**asdict(run), "data_dir": str(run.data_dir)}, indent=1))


def load_run(path: Path) -> FaultRun:
    raw = json.loads(path.read_text())
    data_dir = Path(raw["data_dir"])
    keys = raw.get("store_keys")
    return FaultRun(
        data_dir=data_dir,
        log_url=raw.get("log_url", f"sqlite:///{data_dir / 'log.db'}"),
        store_url=raw.get("store_url", f"file://{data_dir / 'objects'}"),
        store_keys=tuple(keys) if keys else None,  # type: ignore[arg-type]
        up_log=raw["up_log"],
        turns=[AckedTurn(**t) for t in raw["turns"]],
        failed_requests=raw["failed_requests"],
        feedback=[AckedFeedback(**f) for f in raw["feedback"]],
        failed_feedback=raw["failed_feedback"],
        kills=[Kill(**k) for k in raw["kills"]],
        outages=[Outage(**o) for o in raw.get("outages", [])],
        final_chat_status=raw["final_chat_status"],
        derived_after_s=raw.get("derived_after_s"),
        wall_s=raw["wall_s"],
    )


class Traffic:
    """The chat loop and the ingest loop, each on its own thread, until `stop`."""

    def __init__(self, stack: UpStack, run: FaultRun, seed: int) -> None:
        self.stack, self.run, self.seed = stack, run, seed
        self.headers = {"Authorization": f"Bearer {stack.api_key}"}
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.to_rate: queue.Queue[AckedTurn] = queue.Queue()
        self.threads = [threading.Thread(target=self.chat_loop), threading.Thread(target=self.ingest_loop)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=180)

    def chat_loop(self) -> None:
        rng = random.Random(self.seed)
        with httpx.Client(base_url=self.stack.base_url, headers=self.headers, timeout=120) as client:
            session = 0
            while not self.stopping.is_set():
                session_id = f"fault-{self.seed}-{session}"
                session += 1
                question = f"What is {rng.randint(1, 99)} + {rng.randint(1, 99)}?"
                messages = [{"role": "user", "content": question}]
                first = self.acknowledged(client, session_id, 1, messages)
                if first is None:
                    return
                self.to_rate.put(first)
                messages += [
                    {"role": "assistant", "content": first.text},
                    {"role": "user", "content": "Thanks, that is exactly it."},
                ]
                if self.acknowledged(client, session_id, 2, messages) is None:
                    return

    def acknowledged(
        self, client: httpx.Client, session_id: str, position: int, messages: list[dict[str, str]]
    ) -> AckedTurn | None:
        """Send until a 200 (each try a new request); None if stopped first."""
        body = {"model": "orl-policy", "messages": messages, "max_tokens": MAX_TOKENS}
        while not self.stopping.is_set():
            try:
                reply = client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": session_id})
            except httpx.HTTPError:
                reply = None
            if reply is not None and reply.status_code == 200:
                turn = AckedTurn(
                    session_id,
                    position,
                    reply.headers["x-turn-id"],
                    reply.json()["id"],
                    reply.json()["choices"][0]["message"]["content"] or "",
                )
                with self.lock:
                    self.run.turns.append(turn)
                return turn
            with self.lock:
                self.run.failed_requests += 1
            time.sleep(0.5)
        return None

    def ingest_loop(self) -> None:
        with httpx.Client(base_url=self.stack.base_url, headers=self.headers, timeout=60) as client:
            while not self.stopping.is_set():
                try:
                    turn = self.to_rate.get(timeout=0.5)
                except queue.Empty:
                    continue
                body = {"session_id": turn.session_id, "turn_id": turn.turn_id, "thumbs": 1}
                while not self.stopping.is_set():
                    try:
                        reply = client.post("/v1/feedback", json=body)
                    except httpx.HTTPError:
                        reply = None
                    if reply is not None and reply.is_success:
                        with self.lock:
                            self.run.feedback.append(
                                AckedFeedback(turn.session_id, turn.turn_id, reply.json()["event_id"])
                            )
                        break
                    with self.lock:
                        self.run.failed_feedback += 1
                    time.sleep(0.5)


def wait_for(condition: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll_s)
    return True


def kill_and_wait(stack: UpStack, component: str, timeout_s: float = 180) -> Kill:
    """SIGKILL the component's newest pid; wait for `orl up` to start a new one (serve: and be ready)."""
    old_pid = children(stack)[component]
    killed_at = time.monotonic()
    os.kill(old_pid, signal.SIGKILL)
    if not wait_for(lambda: children(stack)[component] != old_pid, timeout_s):
        return Kill(component, old_pid, None, None)
    if component == "serve" and not wait_for(lambda: ready(stack), timeout_s):
        return Kill(component, old_pid, children(stack)[component], None)
    return Kill(component, old_pid, children(stack)[component], time.monotonic() - killed_at)


Faults = Callable[[UpStack, FaultRun], None]


def kill_rounds(kills: int, seed: int) -> Faults:
    """`kills` rounds of kill -9, each component in turn, 1-6 s apart (seeded)."""

    def inject(stack: UpStack, run: FaultRun) -> None:
        rng = random.Random(seed)
        for _ in range(kills):
            for component in [c for c in (*COMPONENTS, "gate") if c in children(stack)]:
                time.sleep(rng.uniform(1.0, 6.0))
                kill = kill_and_wait(stack, component)
                run.kills.append(kill)
                assert kill.recovery_s is not None, f"{component} did not come back after kill -9: {kill}"

    return inject


def outage_rounds(targets: dict[str, int], rounds: int, pause_s: float, seed: int) -> Faults:
    """`rounds` outages of each target (name -> process group), in turn, 2-6 s apart (seeded): the
    whole process group is stopped with SIGSTOP for `pause_s`, then continued (SIGCONT). A stopped
    broker or S3 server accepts connections but answers nothing, as one that hangs."""

    def inject(stack: UpStack, run: FaultRun) -> None:
        rng = random.Random(seed)
        for _ in range(rounds):
            for name, group in targets.items():
                time.sleep(rng.uniform(2.0, 6.0))
                acked_before = len(run.turns)
                os.killpg(group, signal.SIGSTOP)
                try:
                    time.sleep(pause_s)
                finally:
                    os.killpg(group, signal.SIGCONT)
                run.outages.append(Outage(name, pause_s, len(run.turns) - acked_before))

    return inject


def restart_rounds(restarts: dict[str, Callable[[], None]], rounds: int, seed: int) -> Faults:
    """`rounds` restarts in place of each target (name -> a function that stops it and starts it
    again on the same port with the same data, returning once it answers), in turn, 2-6 s apart."""

    def inject(stack: UpStack, run: FaultRun) -> None:
        rng = random.Random(seed)
        for _ in range(rounds):
            for name, restart in restarts.items():
                time.sleep(rng.uniform(2.0, 6.0))
                acked_before, started = len(run.turns), time.monotonic()
                restart()
                out_s = round(time.monotonic() - started, 1)
                run.outages.append(Outage(name, out_s, len(run.turns) - acked_before, kind="restarted"))

    return inject


def cut_rounds(relay: KafkaRelay, client_id: str, rounds: int, cut_s: float, seed: int) -> Faults:
    """`rounds` times, 2-6 s apart (seeded), the relay stops carrying `client_id`'s Kafka traffic for
    `cut_s` (its requests get no answer, as when its network goes down), the rest of the stack's goes on."""

    def inject(stack: UpStack, run: FaultRun) -> None:
        rng = random.Random(seed)
        for _ in range(rounds):
            time.sleep(rng.uniform(2.0, 6.0))
            acked_before = len(run.turns)
            relay.cut(client_id)
            try:
                time.sleep(cut_s)
            finally:
                relay.heal()
            run.outages.append(
                Outage(f"{client_id} cut off", cut_s, len(run.turns) - acked_before, kind="cut")
            )

    return inject


def lock_rounds(rounds: int, hold_s: float, seed: int) -> Faults:
    """`rounds` times, 2-6 s apart (seeded), another process holds an exclusive lock on the embedded
    log's SQLite file for `hold_s` (as a backup tool or a stuck reader would): no other connection
    can write, or read, until it lets go."""

    def inject(stack: UpStack, run: FaultRun) -> None:
        rng = random.Random(seed)
        for _ in range(rounds):
            time.sleep(rng.uniform(2.0, 6.0))
            acked_before = len(run.turns)
            locker = sqlite3.connect(stack.data_dir / "log.db", timeout=60, isolation_level=None)
            try:
                locker.execute("BEGIN EXCLUSIVE")
                time.sleep(hold_s)
                locker.execute("COMMIT")
            finally:
                locker.close()
            run.outages.append(Outage("log", hold_s, len(run.turns) - acked_before, kind="locked"))

    return inject


def count_events(log_url: str, topic: str) -> int:
    return len(asyncio.run(read_events(log_url, f"{NAMESPACE}.{topic}")))


def derived_requests(responses: list[dict[str, Any]], samples: list[dict[str, Any]]) -> set[str]:
    """The request ids whose turn has a SampleReady or a SampleRejected (joined by its response event)."""
    request_of = {e["envelope"]["event_id"]: e["request_id"] for e in responses}
    return {
        request_of.get(e["lineage"]["response_event_id"], "")
        for e in samples
        if e["envelope"]["event_type"] in ("SampleReady", "SampleRejected")
    }


def drain(stack: UpStack, run: FaultRun, quiet_s: float, timeout_s: float) -> None:
    """End every session, then wait (at most `timeout_s` in all) until every acknowledged response is
    on the log, every acknowledged turn is derived into a sample or a rejection, and the samples,
    train steps and checkpoints have not grown for `quiet_s`. The verdict (tests/faults/checks.py)
    says what is still missing when the deadline passes first."""
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    for session_id in sorted({turn.session_id for turn in run.turns}):
        wait_for(lambda session_id=session_id: _ended(stack, session_id, headers), 60, poll_s=1)  # type: ignore[misc]
    acked = {turn.response_id for turn in run.turns}
    ended_at = time.monotonic()
    deadline = ended_at + timeout_s

    def topic(name: str) -> list[dict[str, Any]]:
        return asyncio.run(read_events(run.log_url, f"{NAMESPACE}.{name}"))

    wait_for(lambda: acked <= {event["request_id"] for event in topic("responses")}, timeout_s, poll_s=2)
    # A session's last turn is derived only once its end is settled on a tick (turn_linker), after
    # the turns before it: on a loaded machine that can outlast any fixed quiet window.
    if wait_for(
        lambda: acked <= derived_requests(topic("responses"), topic("samples")),
        max(0.0, deadline - time.monotonic()),
        poll_s=2,
    ):
        run.derived_after_s = round(time.monotonic() - ended_at, 1)
    last, quiet_since = None, time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - quiet_since < quiet_s:
        now = tuple(count_events(run.log_url, t) for t in ("samples", "train_steps", "checkpoints"))
        if now != last:
            last, quiet_since = now, time.monotonic()
        time.sleep(2)


def _ended(stack: UpStack, session_id: str, headers: dict[str, str]) -> bool:
    try:
        url = f"{stack.base_url}/v1/sessions/{session_id}/end"
        return httpx.post(url, json={}, headers=headers, timeout=30).is_success
    except httpx.HTTPError:
        return False


def final_chat(stack: UpStack) -> int | None:
    """The status of one chat after the faults (retried for up to a minute while the server is down)."""
    status = None
    body = {"model": "orl-policy", "messages": [{"role": "user", "content": "Still there?"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and status != 200:
        try:
            status = httpx.post(
                f"{stack.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60
            ).status_code
        except httpx.HTTPError:
            time.sleep(1)
    return status


def run_fault_suite(
    tmp_path: Path,
    faults: Faults,
    seed: int = 0,
    backends: dict[str, str] | None = None,
    store_keys: tuple[str, str] | None = None,
    quiet_s: float = 30,
    drain_timeout_s: float = 300,
    gate: bool = False,
) -> FaultRun:
    """Traffic under `faults`, drained, and the stack stopped with SIGTERM.

    `backends` may name ORL_LOG_URL and ORL_STORE_URL (with the S3 keys as ORL_S3_*); the default is
    the embedded log and store in the data folder. `gate`: with `orl up`'s promotion gate (off in
    the suites that test the backends)."""
    started = time.monotonic()
    env = {**STACK_ENV, **(GATE_ENV if gate else {}), **(backends or {})}
    with running_up(tmp_path, IDLE_TIMEOUT_S, env, components="serve,pipeline,train", gate=gate) as stack:
        run = FaultRun(
            stack.data_dir,
            env.get("ORL_LOG_URL", stack.log_url),
            env.get("ORL_STORE_URL", f"file://{stack.data_dir / 'objects'}"),
            store_keys,
        )
        assert set(COMPONENTS) | ({"gate"} if gate else set()) <= set(children(stack)), children(stack)
        traffic = Traffic(stack, run, seed)
        traffic.start()
        try:
            faults(stack, run)
            time.sleep(5)  # a few more turns after the last fault, and enough turns on a slow machine
            wait_for(lambda: len(run.turns) >= MIN_TURNS, timeout_s=300, poll_s=0.5)
        finally:
            traffic.stop()
        drain(stack, run, quiet_s, drain_timeout_s)
        run.final_chat_status = final_chat(stack)
        last_pids = children(stack)
        stack.process.send_signal(signal.SIGTERM)
        assert stack.process.wait(timeout=90) == 0
        assert not any(alive(pid) for pid in last_pids.values()), last_pids
        run.up_log = stack.log_path.read_text()
    run.wall_s = time.monotonic() - started
    return run
