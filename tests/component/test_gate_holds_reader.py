"""The trainer's reader of the gate's decisions (orl.trainer.gate_holds.follow_gate) on the real SQLite log:
it reads every decision, survives a log it cannot reach at first, and says when it has caught up."""

from __future__ import annotations

import asyncio
from pathlib import Path

from orl.connectors.event_log.base import Consumer, EventLogError, OutgoingRecord, TopicSpec
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.rules.gate_decisions import GateDecisions
from orl.schemas.codec import encode
from orl.trainer.control import restore_for
from orl.trainer.gate_holds import follow_gate

from tests.unit.event_examples import example_event

TOPIC = "ns.checkpoints"


class UnreachableFirst(SqliteEventLog):
    """The first two consumers cannot be created, as a Kafka broker that is down would refuse them."""

    refused = 0

    def consumer(self, group_id: str, topics: list[str], *, auto_offset_reset: str = "earliest") -> Consumer:  # type: ignore[override]
        if self.refused < 2:
            self.refused += 1
            raise EventLogError("event log unreachable (test outage)")
        return super().consumer(group_id, topics, auto_offset_reset=auto_offset_reset)


def test_the_decisions_are_read_after_the_log_comes_back(tmp_path: Path) -> None:
    async def scenario() -> GateDecisions:
        log = UnreachableFirst(tmp_path / "log.db")
        await log.start()
        await log.create_topics([TopicSpec(TOPIC, 1)])
        for version, decision in ((1, "promoted"), (2, "held")):
            event = example_event("PolicyGated")
            event.update(run_id="run-1", version=version, decision=decision, reason=f"{decision} v{version}")
            event["envelope"]["event_id"] = f"gated-{version}"
            await log.append(TOPIC, OutgoingRecord(value=encode(event), key=b"run-1"))
        holds, caught_up = GateDecisions("run-1"), asyncio.Event()
        reading = asyncio.create_task(follow_gate(log, TOPIC, holds, caught_up, max_backoff_s=0.1))
        try:
            await asyncio.wait_for(caught_up.wait(), 20)
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            await log.close()
        assert log.refused == 2
        return holds

    holds = asyncio.run(scenario())
    assert (holds.promoted, holds.held) == (1, {2: "held v2"})
    assert restore_for(holds, 2) == 1
