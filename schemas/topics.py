"""The topic catalog, as data: which event types each topic carries, and how topics are named.

A topic's full name is `<namespace>.<topic>` (the namespace separates live traffic from replays);
its dead-letter topic is `<full name>.dlq` and carries DeadLettered events.
"""

from __future__ import annotations

import re

from schemas.errors import ConfigError, UnknownEventTypeError

TOPICS: dict[str, tuple[str, ...]] = {
    "requests": ("RequestReceived",),
    "responses": ("ResponseGenerated",),
    "next_states": ("NextStateObserved",),
    "sessions": ("SessionClosed",),
    "judge_votes": ("JudgeVoteCast",),
    "rewards": ("RewardDecided",),
    "hints": ("HintVoteCast", "HintSelected", "HintRejected"),
    "teacher_scores": ("TeacherScored",),
    "samples": ("SampleReady", "SampleRejected"),
    "train_steps": ("TrainStepCompleted",),
    "checkpoints": ("CheckpointPublished", "PolicyRolledBack"),
    "policy_activations": ("PolicyActivated", "PolicyRejected"),
}
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
