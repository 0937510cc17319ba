"""The promotion gate's decisions, read for the trainer: `follow_gate` feeds a `GateDecisions` from the log.

`orl gate` appends PolicyGated (promoted or held) to `checkpoints`; what the trainer does about a
hold (go back to the promoted version's weights, or wait for a slow gate) is `orl.trainer.control`'s.
Reads `checkpoints`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from orl.connectors.event_log.base import EventLog
from orl.rules.gate_decisions import GateDecisions
from orl.schemas.codec import decode
from orl.schemas.errors import EventDecodeError

log = logging.getLogger(__name__)


async def follow_gate(
    log_: EventLog, topic: str, holds: GateDecisions, caught_up: asyncio.Event, max_backoff_s: float = 10.0
) -> None:
    """Read `topic` from its beginning into `holds`, forever; `caught_up` is set once a poll comes back
    empty (everything on the log at start has been read). While the log is unreachable the trainer
    trains on: the reading is retried with backoff, from the beginning again (reading twice is harmless)."""
    backoff = 0.5
    while True:
        try:
            await _read_decisions(log_, topic, holds, caught_up)
        except Exception as error:  # noqa: BLE001 - whatever broke, the trainer goes on and this retries
            log.warning("reading the promotion gate's decisions failed (%s); again in %.1f s", error, backoff)
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, max_backoff_s)


async def _read_decisions(log_: EventLog, topic: str, holds: GateDecisions, caught_up: asyncio.Event) -> None:
    async with log_.consumer(f"trainer-gate-{uuid.uuid4().hex[:8]}", [topic]) as consumer:
        await consumer.seek_to_beginning()
        while True:
            records = await consumer.poll(max_records=500, timeout_s=1.0)
            for record in records:
                try:
                    holds.read(decode(record.value))
                except EventDecodeError as error:
                    log.warning("skipping an undecodable record of %s: %s", topic, error)
            if not records:
                caught_up.set()
