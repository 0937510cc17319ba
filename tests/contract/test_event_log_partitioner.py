"""Our partitioner agrees with aiokafka's DefaultPartitioner (Kafka's murmur2) and deals null keys round-robin."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st
from orl.connectors.event_log.base import TopicPartition
from orl.connectors.event_log.partitioner import Partitioner, deal_partitions, murmur2, partition_for_key


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=256))
def test_keyed_partition_matches_aiokafka(key: bytes, partitions: int) -> None:
    all_partitions = list(range(partitions))
    assert partition_for_key(key, partitions) == DefaultPartitioner()(key, all_partitions, all_partitions)
    assert Partitioner().partition("t", key, partitions) == partition_for_key(key, partitions)


def test_murmur2_known_values() -> None:
    # From the Java client's test suite (org.apache.kafka.common.utils.UtilsTest.testMurmur2).
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971
    assert murmur2(b"abc") == 479470107


def test_null_keys_go_round_robin_per_topic() -> None:
    partitioner = Partitioner()
    assert [partitioner.partition("a", None, 3) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert [partitioner.partition("b", None, 2) for _ in range(3)] == [0, 1, 0]
    assert partitioner.partition("a", None, 3) == 2


members_strategy = st.dictionaries(
    st.text(min_size=1, max_size=8), st.just(["a", "b"]), min_size=1, max_size=6
)


@given(members_strategy, st.integers(1, 12), st.integers(1, 12))
def test_deal_gives_each_partition_to_one_member_evenly(
    members: dict[str, list[str]], a: int, b: int
) -> None:
    owned = deal_partitions(members, {"a": a, "b": b})
    every = [tp for tps in owned.values() for tp in tps]
    assert sorted(every) == sorted({TopicPartition(t, p) for t, n in (("a", a), ("b", b)) for p in range(n)})
    assert max(map(len, owned.values())) - min(map(len, owned.values())) <= 1
    assert deal_partitions(dict(reversed(list(members.items()))), {"b": b, "a": a}) == owned


def test_deal_respects_subscriptions() -> None:
    owned = deal_partitions({"m1": ["a"], "m2": ["a", "b"]}, {"a": 2, "b": 2})
    assert owned["m1"] <= {TopicPartition("a", 0), TopicPartition("a", 1)}
    assert {TopicPartition("b", 0), TopicPartition("b", 1)} <= owned["m2"]
