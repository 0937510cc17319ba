"""Shared pytest set-up: service fixtures live in tests/fixtures/ and are registered here.

Under pytest-xdist (`scripts/check.sh` runs two workers) each worker is pinned to its own share of
the cores before any test runs. The processes a test starts (servers, trainers, brokers) inherit the
pin, and orl sizes torch's threads from the cores it may run on (`connectors.compute.available_cores`),
so two workers' torch threads never oversubscribe the machine.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.fixtures.kafka_broker",
    "tests.fixtures.s3_server",
    "tests.fixtures.model",
    "tests.fixtures.fake_sglang",
]


def worker_cores(cores: list[int], worker: str, workers: int) -> list[int]:
    """The cores of xdist worker `worker` ("gw0", "gw1", ...) of `workers`: every workers-th core
    from its index on; all of them when there are fewer cores than workers."""
    index = int(worker.removeprefix("gw"))
    return cores[index::workers] or cores


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if worker is None or workers < 2 or not hasattr(os, "sched_setaffinity"):
        return
    os.sched_setaffinity(0, worker_cores(sorted(os.sched_getaffinity(0)), worker, workers))
