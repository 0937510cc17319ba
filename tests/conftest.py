"""Shared pytest set-up: service fixtures live in tests/fixtures/ and are registered here.

Under pytest-xdist (`scripts/check.sh` runs two workers) each worker is pinned to its own share of
the cores before any test runs. The processes a test starts (servers, trainers, brokers) inherit the
pin, and orl sizes torch's threads from the cores it may run on (`orl.compute.machine.available_cores`),
so two workers' torch threads never oversubscribe the machine.

The slow folders' files are handed out first (`SLOW_FIRST`, with `--no-loadscope-reorder` in
`scripts/check.sh`): xdist would otherwise start with the files that hold the most tests, the fast
unit files, and leave a lone worker on the minutes-long fault and end-to-end files at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from orl.connectors.key_store import KeyStore
from orl.schemas.codec import install_data_keys

pytest_plugins = [
    "tests.fixtures.kafka_broker",
    "tests.fixtures.s3_server",
    "tests.fixtures.model",
    "tests.fixtures.fake_sglang",
]


# Test folders whose tests run orl as a deployment (its commands, servers and workers).
DEPLOYMENT_FOLDERS = ("faults", "e2e", "integration", "clients")


@pytest.fixture(scope="module", autouse=True)
def deployment_key_store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path | None]:
    """In the deployment folders, one key store per test module, as a deployment has one: every
    process the module starts gets it (ORL_KEY_STORE) and the tests' own reads and writes use it, so
    payloads are sealed end to end as in `orl up` (orl.schemas.sealing). Module-scoped, and autouse
    so it comes first: the fault suite runs its stacks in module fixtures. Unit and component tests
    write in clear."""
    parts = request.node.path.relative_to(request.config.rootpath).parts
    if len(parts) < 3 or parts[0] != "tests" or parts[1] not in DEPLOYMENT_FOLDERS:
        yield None
        return
    path = tmp_path_factory.mktemp("keys") / "keys.db"
    keys = KeyStore(path)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ORL_KEY_STORE", str(path))
        install_data_keys(keys)
        try:
            yield path
        finally:
            install_data_keys(None)
            keys.close()


# Test folders whose files run for minutes (stacks, subprocesses, training), slowest first.
SLOW_FIRST = ("faults", "e2e", "integration")


def slow_first_rank(relative_path: Path) -> int:
    """Where a test file goes in the run, from its path under the project root: the index of its
    folder (tests/<folder>/...) in `SLOW_FIRST`, every other folder after them."""
    parts = relative_path.parts
    folder = parts[1] if len(parts) > 2 and parts[0] == "tests" else ""
    return SLOW_FIRST.index(folder) if folder in SLOW_FIRST else len(SLOW_FIRST)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the tests slow folders first; a stable sort keeps each file's own order."""
    items.sort(key=lambda item: slow_first_rank(item.path.relative_to(config.rootpath)))


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
