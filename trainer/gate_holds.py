"""The promotion gate's holds, as the trainer sees them: a held newest version is not trained on.

`orl gate` appends PolicyGated (promoted or held) to `checkpoints`. Servers behind the gate keep
serving the promoted version, so if the trainer went on from a held version its samples would all
come from ever older versions, until the staleness bound dropped every one and nothing new was
published for the gate to judge. So when the trainer's own newest version is held, it republishes
the promoted version's weights as its next version (as a rollback does) and trains on from there;
the gate promotes that one (the same weights as the served version), and fresh samples follow.
Nor does the trainer run ahead of a slow gate (`ahead_of_gate`): it waits while its samples' version
would soon be too old to train on.
`orl.rules.gate_decisions.GateDecisions` is the bookkeeping; `follow_gate` feeds it from the log. Reads `checkpoints`.
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


def restore_for(decisions: GateDecisions, version: int) -> int | None:
    """The promoted version to go back to if `version` (the trainer's newest) was held, else None."""
    return decisions.promoted if version in decisions.held and decisions.promoted < version else None


def ahead_of_gate(version: int, promoted: int, max_staleness: int) -> bool:
    """Whether a trainer at `version` must wait for the gate before its next step: servers behind the
    gate serve `promoted`, and a sample of it is trained only up to `max_staleness` versions later, so
    the trainer publishes at most max(1, max_staleness) versions beyond it (a negative bound: no wait)."""
    return max_staleness >= 0 and version - promoted >= max(1, max_staleness)


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
