"""tests/conftest.py: each pytest-xdist worker gets its own share of the cores, and the slow test
folders are handed out first."""

from pathlib import Path

from tests.conftest import slow_first_rank, worker_cores


def test_two_workers_split_the_cores_between_them() -> None:
    assert worker_cores([0, 1], "gw0", 2) == [0]
    assert worker_cores([0, 1], "gw1", 2) == [1]
    assert worker_cores([0, 1, 2, 3, 4], "gw0", 2) == [0, 2, 4]
    assert worker_cores([0, 1, 2, 3, 4], "gw1", 2) == [1, 3]


def test_a_worker_without_a_core_of_its_own_shares_them_all() -> None:
    assert worker_cores([0], "gw0", 2) == [0]
    assert worker_cores([0], "gw1", 2) == [0]
    assert worker_cores([3, 5], "gw2", 3) == [3, 5]


def test_the_slow_folders_go_first_in_their_order_and_the_rest_after() -> None:
    paths = [
        Path("tests/unit/test_a.py"),
        Path("tests/integration/test_b.py"),
        Path("tests/faults/test_c.py"),
        Path("tests/contract/test_d.py"),
        Path("tests/e2e/test_e.py"),
    ]
    assert sorted(paths, key=slow_first_rank) == [
        Path("tests/faults/test_c.py"),
        Path("tests/e2e/test_e.py"),
        Path("tests/integration/test_b.py"),
        Path("tests/unit/test_a.py"),
        Path("tests/contract/test_d.py"),
    ]
    assert slow_first_rank(Path("elsewhere/test_f.py")) == slow_first_rank(Path("tests/unit/test_a.py"))
