"""The topic catalog, as data: which event types each topic carries, and how topics are named.

A topic's full name is `<namespace>.<topic>` (the namespace separates live traffic from replays);
its dead-letter topic is `<full name>.dlq` and carries DeadLettered events.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from orl.schemas.errors import ConfigError, UnknownEventTypeError

TOPICS: dict[str, tuple[str, ...]] = {
    "requests": ("RequestReceived",),
    "responses": ("ResponseGenerated",),
    "next_states": ("NextStateObserved",),
    "sessions": ("SessionClosed",),
    "judge_votes": ("JudgeVoteCast",),
    "rewards": ("RewardDecided",),
    "hints": ("HintVoteCast", "HintSelected", "HintRejected"),
    "teacher_scores": ("TeacherScored",),
    "trajectories": ("TrajectoryScored",),
    "samples": ("SampleReady", "SampleRejected"),
    "train_steps": ("TrainStepCompleted",),
    "checkpoints": ("CheckpointPublished", "PolicyRolledBack", "PolicyGated"),
    "policy_activations": ("PolicyActivated", "PolicyRejected"),
}
# Records are keyed by session id (all events of a session in one partition: joins need no
# repartitioning), except the event types named here, keyed by another field so that a stage keyed
# by it sees every record of one key: trajectories go by rollout group (pipeline/processors/group_advantage.py).
KEY_FIELDS: dict[str, str] = {"TrajectoryScored": "group_id"}
DEAD_LETTER_EVENT = "DeadLettered"
DLQ_SUFFIX = ".dlq"

_NAME_PART = re.compile(r"[a-z0-9_-]+")
_TOPIC_OF_EVENT = {event: topic for topic, events in TOPICS.items() for event in events}


def topic_name(namespace: str, topic: str) -> str:
    """The full name of a catalog topic in a namespace, e.g. `live.requests`."""
    for label, value in (("namespace", namespace), ("topic", topic)):
        if not isinstance(value, str) or not _NAME_PART.fullmatch(value):
            raise ConfigError(f"invalid {label} {value!r}: use lowercase letters, digits, '_' and '-'")
    return f"{namespace}.{topic}"


def record_key(event: Mapping[str, Any]) -> str | None:
    """The key an event's record is written with: its session id, or its KEY_FIELDS field."""
    envelope = event["envelope"]
    field = KEY_FIELDS.get(envelope["event_type"])
    key = event[field] if field is not None else envelope.get("session_id")
    return None if key is None else str(key)


def dlq_topic(topic_name: str) -> str:
    """The dead-letter topic of a full topic name."""
    return topic_name + DLQ_SUFFIX


def topic_for_event(event_type: str) -> str:
    """The catalog topic (without namespace) that carries `event_type`."""
    try:
        return _TOPIC_OF_EVENT[event_type]
    except KeyError:
        if event_type == DEAD_LETTER_EVENT:
            raise UnknownEventTypeError(
                "DeadLettered goes to the dead-letter topic of its source: use dlq_topic(source topic name)"
            ) from None
        raise UnknownEventTypeError(f"no topic carries event_type {event_type!r}") from None
