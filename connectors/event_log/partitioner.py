"""Which partition a record goes to, and which group member owns which partition.

Keyed records go to `(murmur2(key) & 0x7fffffff) % partitions`, Kafka's default partitioner, so a
key lands in the same partition on SQLite and on Kafka; records without a key are dealt round-robin
per topic. `deal_partitions` is the SQLite log's group assignment. Reads and writes nothing.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator, Mapping, Sequence

from orl.connectors.event_log.base import EventLogError, TopicPartition

_MASK_32 = 0xFFFFFFFF
_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_unpack_from = struct.unpack_from


def murmur2(data: bytes) -> int:
    """MurmurHash2 as in org.apache.kafka.common.utils.Utils.murmur2, as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK_32
    words = length >> 2
    if words:
        for k in _unpack_from(f"<{words}I", data):  # the body's little-endian 32-bit words
            k = (k * _M) & _MASK_32
            k ^= k >> _R
            h = ((h * _M) & _MASK_32) ^ ((k * _M) & _MASK_32)
    tail = length & 3
    if tail:
        h ^= int.from_bytes(data[length - tail :], "little")
        h = (h * _M) & _MASK_32
    h ^= h >> 13
    h = (h * _M) & _MASK_32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Partitioner:
    """Picks a partition per record: murmur2 for keys, round-robin per topic for null keys."""

    def __init__(self) -> None:
        self._round_robin: dict[str, Iterator[int]] = {}

    def partition(self, topic: str, key: bytes | None, partitions: int) -> int:
        if partitions < 1:
            raise EventLogError(f"topic {topic!r} has {partitions} partitions; cannot pick one")
        if partitions == 1:
            return 0  # no hash to compute (the embedded log's default)
        if key is not None:
            return (murmur2(key) & 0x7FFFFFFF) % partitions  # partition_for_key, a call fewer per record
        counter = self._round_robin.setdefault(topic, itertools.count())
        return next(counter) % partitions


def deal_partitions(
    members: Mapping[str, Sequence[str]], partitions: Mapping[str, int]
) -> dict[str, set[TopicPartition]]:
    """Deal every partition of the subscribed topics round-robin over the sorted members subscribed to it."""
    owned: dict[str, set[TopicPartition]] = {member: set() for member in members}
    all_tps = sorted(TopicPartition(t, p) for t, n in partitions.items() for p in range(n))
    for index, tp in enumerate(all_tps):
        candidates = sorted(m for m, topics in members.items() if tp.topic in topics)
        if candidates:
            owned[candidates[index % len(candidates)]].add(tp)
    return owned
