"""Runs one faust pipeline worker as its own process, for the integration tests (kill -9, rebalance).

    python -m tests.integration.faust_worker_main --broker 127.0.0.1:PORT --namespace ns \
        --app-id ns-pipeline --data-dir DIR --processors turn_linker [--clock-ms MS] ...

Every worker given the same --app-id joins one consumer group. Reads and writes what
orl.pipeline.runtime.faust_runtime's app reads and writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

from orl.connectors.key_store import KeyStore
from orl.pipeline.processors.config import LinkerConfig, PipelineConfig
from orl.pipeline.processors.registry import PURE_PROCESSORS
from orl.pipeline.runtime.faust_runtime import GUARANTEES, run_worker
from orl.pipeline.runtime.host import wall_clock_ms
from orl.schemas.codec import install_data_keys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--broker", required=True, help="bootstrap servers, host:port[,host:port]")
    parser.add_argument("--namespace", required=True, help="namespace of the pipeline topics")
    parser.add_argument("--app-id", required=True, help="faust app id = consumer group of all workers")
    parser.add_argument("--data-dir", required=True, help="this worker's faust data directory")
    parser.add_argument(
        "--processors", default="turn_linker", help=f"comma-separated, of {sorted(PURE_PROCESSORS)}"
    )
    parser.add_argument("--partitions", type=int, default=4, help="partition count of every topic")
    parser.add_argument(
        "--guarantee", choices=GUARANTEES, default="exactly_once", help="processing guarantee"
    )
    parser.add_argument(
        "--clock-ms", type=int, default=None, help="a fixed clock for ticks (default: wall clock)"
    )
    parser.add_argument("--idle-timeout-s", type=float, default=None, help="turn_linker idle timeout")
    parser.add_argument("--tick-interval-s", type=float, default=1.0, help="how often on_tick runs")
    parser.add_argument("--session-timeout-s", type=float, default=6.0, help="group session timeout (>= 6 s)")
    parser.add_argument("--rebalance-timeout-s", type=float, default=12.0, help="group rebalance timeout")
    parser.add_argument(
        "--commit-interval-s", type=float, default=0.5, help="offset/transaction commit interval"
    )
    parser.add_argument("--loglevel", default="info", help="faust worker log level")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if os.environ.get("ORL_KEY_STORE"):  # the test's key store, as `orl pipeline` opens it
        install_data_keys(KeyStore(Path(os.environ["ORL_KEY_STORE"])))
    config = PipelineConfig()
    if args.idle_timeout_s is not None:
        config = dataclasses.replace(config, linker=LinkerConfig(idle_timeout_s=args.idle_timeout_s))
    fixed = args.clock_ms
    clock: Callable[[], int] = wall_clock_ms if fixed is None else (lambda: fixed)
    run_worker(
        [PURE_PROCESSORS[name] for name in args.processors.split(",")],
        config,
        args.namespace,
        args.broker,
        args.app_id,
        args.data_dir,
        args.guarantee,
        partitions=args.partitions,
        loglevel=args.loglevel,
        tick_interval_s=args.tick_interval_s,
        session_timeout_s=args.session_timeout_s,
        rebalance_timeout_s=args.rebalance_timeout_s,
        commit_interval_s=args.commit_interval_s,
        clock_ms=clock,
    )


if __name__ == "__main__":
    main()
