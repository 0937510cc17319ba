"""Shared decodes: a record read by several stages of one process is decoded once, and not kept longer than needed."""

from __future__ import annotations

import pytest
from orl.connectors.event_log.base import ConsumedRecord
from orl.pipeline.runtime.shared_decodes import SharedDecodes
from orl.schemas.codec import encode
from orl.schemas.errors import EventDecodeError

from tests.unit.pipeline_streams import Conversation


def records(count: int, topic: str = "t.requests") -> list[ConsumedRecord]:
    conversation = Conversation("s1")
    out = []
    for offset in range(count):
        conversation.say(f"question {offset}")
        event = conversation.turn(f"answer {offset}").request
        out.append(ConsumedRecord(topic, 0, offset, b"s1", encode(event)))
    return out


def test_three_readers_decode_once_and_share_the_event() -> None:
    decodes = SharedDecodes()
    decodes.subscribe(["t.requests"] * 3)
    (record,) = records(1)
    first = decodes.decode(record)
    assert decodes.decode(record) is first
    assert len(decodes) == 1  # one reader still to come
    assert decodes.decode(record) is first
    assert len(decodes) == 0  # every reader took it
    assert (decodes.misses, decodes.hits) == (1, 2)


def test_a_topic_with_one_reader_is_never_kept() -> None:
    decodes = SharedDecodes()
    decodes.subscribe(["t.requests", "t.responses"])
    for record in records(5):
        decodes.decode(record)
    assert len(decodes) == 0


def test_the_byte_budget_drops_the_oldest_entries_and_a_late_reader_decodes_again() -> None:
    batch = records(10)
    decodes = SharedDecodes(budget_bytes=3 * max(len(r.value) for r in batch))
    decodes.subscribe(["t.requests"] * 2)
    events = [decodes.decode(record) for record in batch]
    assert 0 < len(decodes) <= 3
    again = decodes.decode(batch[0])  # evicted: decoded anew, equal but not the same object
    assert again == events[0] and again is not events[0]
    assert decodes.decode(batch[-1]) is events[-1]


def test_undecodable_bytes_raise_and_are_not_kept() -> None:
    decodes = SharedDecodes()
    decodes.subscribe(["t.requests"] * 2)
    bad = ConsumedRecord("t.requests", 0, 0, None, b"not an event")
    for _ in range(2):
        with pytest.raises(EventDecodeError):
            decodes.decode(bad)
    assert len(decodes) == 0
