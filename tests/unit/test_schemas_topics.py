"""The topic catalog and topic naming."""

from __future__ import annotations

import pytest
from orl.schemas.errors import ConfigError, UnknownEventTypeError
from orl.schemas.topics import TOPICS, dlq_topic, topic_for_event, topic_name


def test_topic_name_and_dlq() -> None:
    assert topic_name("live", "requests") == "live.requests"
    assert dlq_topic(topic_name("replay-2", "judge_votes")) == "replay-2.judge_votes.dlq"


@pytest.mark.parametrize(
    ("namespace", "topic"), [("Live", "requests"), ("live", "a.b"), ("", "requests"), ("live", "")]
)
def test_topic_name_rejects_bad_parts(namespace: str, topic: str) -> None:
    with pytest.raises(ConfigError):
        topic_name(namespace, topic)


def test_topic_for_every_catalog_event() -> None:
    for topic, events in TOPICS.items():
        for event in events:
            assert topic_for_event(event) == topic
    assert topic_for_event("HintRejected") == "hints"


def test_dead_lettered_has_no_catalog_topic() -> None:
    with pytest.raises(UnknownEventTypeError, match="dlq_topic"):
        topic_for_event("DeadLettered")
    with pytest.raises(UnknownEventTypeError, match="no topic carries"):
        topic_for_event("Nope")
