"""Reads `<namespace>.samples` from an exact position, whatever the consumer group does meanwhile.

The trainer's resume point is the newest manifest's consumed offsets, not the group's committed
offsets. A consumer starts at the committed offsets, and a partition can arrive later (the SQLite
log keeps a SIGKILLed member's partitions until its session times out; Kafka rebalances), so every
partition is positioned when it first appears and every record is checked against the offset the
stream expects next in its partition. Records that do not continue that sequence (a rebalance
restarted the partition somewhere else) are dropped and the partition is sought back: the batcher
never sees a duplicate or a gap. Reads the samples topic; writes nothing (commit is the loop's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from connectors.event_log.base import ConsumedRecord, Consumer, TopicPartition

log = logging.getLogger(__name__)


class SampleStream:
    def __init__(self, consumer: Consumer, start_offsets: Mapping[TopicPartition, int]) -> None:
        self.consumer = consumer
        self._start = dict(start_offsets)
        # tp -> next offset expected; None: sought to the beginning, accept the first record's offset
        self._expected: dict[TopicPartition, int | None] = {}

    async def _position(self, tp: TopicPartition) -> None:
        if tp in self._start:
            await self.consumer.seek(tp, self._start[tp])
            self._expected[tp] = self._start[tp]
        else:
            await self.consumer.seek_to_beginning([tp])
            self._expected[tp] = None
        log.info("samples partition %s[%d] positioned at %s", tp.topic, tp.partition, self._expected[tp] or 0)

    async def poll(self, max_records: int, timeout_s: float) -> list[ConsumedRecord]:
        """The next records, each exactly the one after the previous in its partition."""
        for tp in sorted(await self.consumer.assignment() - self._expected.keys()):
            await self._position(tp)
        records = await self.consumer.poll(max_records=max_records, timeout_s=timeout_s)
        accepted: list[ConsumedRecord] = []
        broken: set[TopicPartition] = set()
        for record in records:
            tp = record.topic_partition
            if tp in broken:
                continue
            if tp not in self._expected:  # assigned inside this poll, read from the group's offset
                broken.add(tp)
                continue
            expected = self._expected[tp]
            if expected is not None and record.offset != expected:
                log.warning(
                    "samples %s[%d]: got offset %d, expected %d (rebalance?); seeking back",
                    tp.topic,
                    tp.partition,
                    record.offset,
                    expected,
                )
                broken.add(tp)
                continue
            self._expected[tp] = record.offset + 1
            accepted.append(record)
        for tp in sorted(broken):
            resume_at = self._expected.get(tp)
            if resume_at is not None:
                await self.consumer.seek(tp, resume_at)
            else:
                self._expected.pop(tp, None)  # positioned on the next poll
        return accepted

    async def read_up_to(self, end_offsets: Mapping[TopicPartition, int]) -> bool:
        """Whether this stream has read every record below `end_offsets` (the topic is drained).

        Only partitions this stream positioned count (one just assigned inside a poll still sits at
        the group's offset), and then by the consumer's position, not the last record read: on Kafka
        the samples topic is written in transactions, so its end offset is a commit marker's, one
        past its last record.
        """
        owned = await self.consumer.assignment()
        for tp, end in end_offsets.items():
            if end == 0:
                continue
            if tp not in owned or tp not in self._expected or await self.consumer.position(tp) < end:
                return False
        return True

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Record the trained position in the group (for lag monitoring; the manifest is the truth)."""
        owned = await self.consumer.assignment()
        await self.consumer.commit({tp: offset for tp, offset in offsets.items() if tp in owned})
