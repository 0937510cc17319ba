"""Log and object-store outages under a live `orl up` (issues 22 and 42), under chat and feedback traffic:

- in one run: the S3 server is restarted in place three times (stopped, then started again on the
  same ports with the same data), then the Kafka broker and the S3 server stop answering (SIGSTOP of
  their process groups) for 10 s, in turn, once each;
- the single Kafka broker is killed with SIGKILL, left down 15 s and started again in place three times;
- on a three-broker cluster (replication factor 3, min.insync.replicas 2), each broker in turn is
  killed with SIGKILL and started again in place (three restarts);
- the server alone is cut off the broker for a minute: every component reaches Kafka through a relay
  (tests/fixtures/kafka_relay.py) that stops carrying the traffic of client id "orl-serve" while the
  pipeline's and the trainer's go on. The server must acknowledge turns from its spool meanwhile and
  drain it afterwards, without restarting.

(Until 2026-12-07 each ran twice as many rounds, and the store's restarts had a run of their own;
the runs took about 17 of CI's 50 minutes. One round of each fault is what the checks need: every
acknowledged turn is checked after it, and a run's start, traffic and drain cost about 100 s
whatever its faults.)

Nothing acknowledged may be lost or duplicated, the server must keep answering while the log is down
(its spool), and the trainer must still publish checkpoints that verify.

Real processes: `orl up --log-url kafka://... --store-url s3://...` on the real model, Apache Kafka
brokers and a SeaweedFS server of this module's own (tests/fixtures), so that stopping them touches no
other test. The run and the checks are tests/faults/harness.py, checks.py.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.up_stack import UpStack
from tests.faults.checks import EXITED_LINE, Verdict, check_run, results_table
from tests.faults.harness import (
    MIN_TURNS,
    FaultRun,
    Faults,
    cut_rounds,
    outage_rounds,
    restart_rounds,
    run_fault_suite,
    save_run,
)
from tests.fixtures.kafka_broker import KafkaCluster, start_kafka_cluster
from tests.fixtures.kafka_relay import KafkaRelay
from tests.fixtures.s3_server import S3Server, start_s3_server

SINGLE_BROKER_DOWN_S = 15.0
pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.kafka, pytest.mark.s3]


def run_and_check(
    tmp_path: Path, broker: KafkaCluster, s3: S3Server, faults: Faults, bootstrap: str | None = None
) -> tuple[FaultRun, Verdict]:
    """The fault suite's traffic under `faults` on these brokers (reached at `bootstrap`, default
    theirs) and S3 server, and its verdict (printed)."""
    backends = {
        "ORL_LOG_URL": f"kafka://{bootstrap or broker.bootstrap}",
        "ORL_STORE_URL": f"s3://orl-faults?endpoint={s3.endpoint}&secure=false",
        "ORL_S3_ACCESS_KEY": s3.access_key,
        "ORL_S3_SECRET_KEY": s3.secret_key,
    }
    run = run_fault_suite(tmp_path, faults, backends=backends, store_keys=(s3.access_key, s3.secret_key))
    save_run(run, tmp_path / "run.json")  # the up log and what the clients saw, kept for a failed check
    verdict = check_run(run)
    print(results_table(verdict))
    if problems_beyond_restarts(verdict):
        print(orl_log_lines(run.data_dir / "logs"))  # what the components said, for a failed check
    return run, verdict


def orl_log_lines(logs: Path, last: int = 40) -> str:
    """The last `last` warnings and errors of orl's own loggers (not the Kafka client's) per component log."""
    parts = []
    for path in sorted(logs.glob("*.log")):
        lines = [
            line
            for line in path.read_text(errors="replace").splitlines()
            if " orl" in line and (" WARNING " in line or " ERROR " in line)
        ]
        parts.append(f"--- {path.name}: {len(lines)} warnings and errors, the last {last}:")
        parts.extend(line[:300] for line in lines[-last:])
    return "\n".join(parts)


@pytest.fixture(scope="module")
def outage_run(
    tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path
) -> Iterator[tuple[FaultRun, Verdict, int]]:
    """The S3 server restarted in place three times, then the broker and the S3 server frozen in turn,
    under one stack's traffic; also how many times `orl up` had restarted a component when the store
    restarts were over."""
    tmp_path = tmp_path_factory.mktemp("outages")
    broker, store = start_kafka_cluster(tmp_path / "kafka"), [start_s3_server()]
    exits_after_restarts: list[int] = []

    def restart_store() -> None:
        store[0] = store[0].restart()

    def restarts_then_outages(stack: UpStack, run: FaultRun) -> None:
        restart_rounds({"store": restart_store}, rounds=3, seed=1)(stack, run)
        exits_after_restarts.append(len(EXITED_LINE.findall(stack.log_path.read_text())))
        (node,) = broker.nodes
        assert node.process is not None
        groups = {"log": os.getpgid(node.process.pid), "store": os.getpgid(store[0].process.pid)}
        outage_rounds(groups, rounds=1, pause_s=10, seed=0)(stack, run)

    try:
        run, verdict = run_and_check(tmp_path, broker, store[0], restarts_then_outages)
        yield run, verdict, exits_after_restarts[0]
    finally:
        broker.stop()
        store[0].stop()


def problems_beyond_restarts(verdict: Verdict) -> list[str]:
    """Every broken guarantee but `orl up` restarting a component nobody killed. On Kafka a stage
    exits when the log stays away longer than its bounds (a consumer or producer that cannot connect
    within 15 s, an admin request failing past its retries): a frozen single broker is fenced by its
    own controller and takes its partitions back seconds after it resumes. `orl up` restarts the
    stage, and exactly-once holds across that (outputs and offsets commit in one transaction), so such
    restarts are shown in the table and every other check must hold."""
    return [p for p in verdict.problems if not p.endswith(" for 0 kills")]


@pytest.mark.timeout(900)
def test_outages_lose_and_duplicate_nothing_acknowledged(outage_run: tuple[FaultRun, Verdict, int]) -> None:
    run, verdict, _ = outage_run
    assert len(run.turns) >= MIN_TURNS and run.feedback, verdict.figures
    assert [(o.target, o.kind) for o in run.outages] == [("store", "restarted")] * 3 + [
        ("log", "stopped"),
        ("store", "stopped"),
    ]
    assert any(outage.turns_acked_during > 0 for outage in run.outages if outage.target == "log"), run.outages
    assert problems_beyond_restarts(verdict) == [], results_table(verdict)


@pytest.mark.timeout(900)
def test_the_trainer_publishes_verified_checkpoints_through_the_outages(
    outage_run: tuple[FaultRun, Verdict, int],
) -> None:
    run, verdict, _ = outage_run
    assert verdict.figures["checkpoints verified"] >= 1, results_table(verdict)


@pytest.mark.timeout(900)
def test_restarts_of_the_store_in_place_restart_no_component(
    outage_run: tuple[FaultRun, Verdict, int],
) -> None:
    """The store's restarts come first: a component may exit while the broker is frozen, never while
    the S3 server restarts (its client retries within its bounds)."""
    run, verdict, exits_after_restarts = outage_run
    assert exits_after_restarts == 0, run.up_log[-4000:]


@pytest.fixture(scope="module", params=[1, 3], ids=["single-broker", "three-brokers"])
def broker_restart_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path
) -> Iterator[tuple[FaultRun, Verdict, int]]:
    """kill -9 of a Kafka broker, started again in place, under traffic: the single broker three
    times, or each broker of three in turn."""
    brokers: int = request.param
    tmp_path = tmp_path_factory.mktemp(f"broker-restarts-{brokers}")
    cluster, s3 = start_kafka_cluster(tmp_path / "kafka", nodes=brokers), start_s3_server()
    if brokers == 1:
        # Held down 15 s each time, then the JVM's own 10-30 s to come back: every outage outlasts the
        # clients' 15 s bounds, long enough for their requests to fail, not just to wait.
        restarts = {"broker-1": lambda: cluster.restart(1, down_s=SINGLE_BROKER_DOWN_S)}
        rounds = 3
    else:
        restarts = {f"broker-{n}": functools.partial(cluster.restart, n) for n in (1, 2, 3)}
        rounds = 1
    try:
        run, verdict = run_and_check(tmp_path, cluster, s3, restart_rounds(restarts, rounds=rounds, seed=2))
        yield run, verdict, rounds * len(restarts)
    finally:
        cluster.stop()
        s3.stop()


@pytest.mark.timeout(900)
def test_broker_kill_9_and_restart_in_place_loses_and_duplicates_nothing_acknowledged(
    broker_restart_run: tuple[FaultRun, Verdict, int],
) -> None:
    run, verdict, restarts = broker_restart_run
    assert len(run.turns) >= MIN_TURNS and run.feedback, verdict.figures
    assert len([o for o in run.outages if o.target.startswith("broker-")]) == restarts
    assert problems_beyond_restarts(verdict) == [], results_table(verdict)
    assert verdict.figures["checkpoints verified"] >= 1, results_table(verdict)


@pytest.fixture(scope="module")
def server_cut_run(
    tmp_path_factory: pytest.TempPathFactory, base_model_dir: Path
) -> Iterator[tuple[FaultRun, Verdict, int]]:
    """The server cut off the broker for 60 s under traffic; every other component stays connected."""
    tmp_path = tmp_path_factory.mktemp("server-cut")
    broker, s3 = start_kafka_cluster(tmp_path / "kafka", relayed=True), start_s3_server()
    (node,) = broker.nodes
    assert node.relayed is not None
    relay = KafkaRelay(port=node.relayed[1], target_port=node.relayed[0])
    try:
        faults = cut_rounds(relay, "orl-serve", rounds=1, cut_s=60, seed=3)
        run, verdict = run_and_check(tmp_path, broker, s3, faults, bootstrap=f"127.0.0.1:{relay.port}")
        yield run, verdict, relay.held
    finally:
        relay.close()
        broker.stop()
        s3.stop()


@pytest.mark.timeout(900)
def test_the_server_cut_off_the_broker_for_a_minute_acknowledges_from_its_spool_and_loses_nothing(
    server_cut_run: tuple[FaultRun, Verdict, int],
) -> None:
    run, verdict, held = server_cut_run
    assert len(run.turns) >= MIN_TURNS and run.feedback, verdict.figures
    assert held > 0, "the cut held none of the server's traffic"
    (cut,) = run.outages
    assert cut.turns_acked_during > 0, run.outages
    # the server itself must ride the cut; other components may restart, as in the tests above (in
    # the full suite on 2 loaded cores both pipeline processes once exited during the cut, cause
    # not found yet; alone, no component restarted in 3 runs)
    assert not [p for p in verdict.problems if p.startswith("serve:")], results_table(verdict)
    assert problems_beyond_restarts(verdict) == [], results_table(verdict)
    assert verdict.figures["checkpoints verified"] >= 1, results_table(verdict)
