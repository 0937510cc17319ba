"""Reads `<namespace>.samples` from an exact position, whatever the consumer group does meanwhile.

The trainer's resume point is the newest manifest's consumed offsets, not the group's committed
offsets. A consumer starts at the committed offsets, and a partition can arrive later (the SQLite
log keeps a SIGKILLed member's partitions until its session times out; Kafka rebalances), so every
partition is positioned when it first appears and every record is checked against the offset the
stream expects next in its partition. A record below it is a re-delivery (a rebalance restarted the
partition from the group's committed offset, which trails the stream): it is dropped and the
partition is sought back to the expected offset, so the batcher never sees a duplicate. A record
above it follows offsets that hold no record for a reader: on Kafka the samples topic is written in
transactions, and every commit marker takes an offset (aborted records are skipped by
read_committed), so it is accepted. Reads the samples topic; writes nothing (commit is the loop's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from orl.connectors.event_log.base import ConsumedRecord, Consumer, EventLogError, TopicPartition
from orl.schemas.errors import ServiceUnavailable

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
        """The next records, each after the previous in its partition (never one read before)."""
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
            if expected is not None and record.offset < expected:
                log.warning(
                    "samples %s[%d]: got offset %d again, expected %d (rebalance?); seeking forward",
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
        """Record the trained position in the group (for lag monitoring; the manifest is the truth).

        A commit the log refuses (on Kafka, after a rebalance: the broker was unreachable longer than
        the group's timeouts) is logged and skipped: the next step's commit covers it, and a resume
        reads the manifest's offsets, not the group's.
        """
        owned = await self.consumer.assignment()
        try:
            await self.consumer.commit({tp: offset for tp, offset in offsets.items() if tp in owned})
        except (EventLogError, ServiceUnavailable) as error:
            log.warning("group offsets not committed (the next step's commit will): %s", error)
