"""tests/conftest.py: each pytest-xdist worker gets its own share of the cores."""

from tests.conftest import worker_cores


def test_two_workers_split_the_cores_between_them() -> None:
    assert worker_cores([0, 1], "gw0", 2) == [0]
    assert worker_cores([0, 1], "gw1", 2) == [1]
    assert worker_cores([0, 1, 2, 3, 4], "gw0", 2) == [0, 2, 4]
    assert worker_cores([0, 1, 2, 3, 4], "gw1", 2) == [1, 3]


def test_a_worker_without_a_core_of_its_own_shares_them_all() -> None:
    assert worker_cores([0], "gw0", 2) == [0]
    assert worker_cores([0], "gw1", 2) == [0]
    assert worker_cores([3, 5], "gw2", 3) == [3, 5]
