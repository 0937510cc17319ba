"""Creating the catalog topics of a namespace with one partition count (faust needs them to match)."""

from __future__ import annotations

from collections.abc import Iterable

from orl.connectors.event_log.base import EventLog, TopicSpec
from orl.schemas.topics import TOPICS, topic_name


async def create_catalog_topics(
    log: EventLog, namespace: str, partitions: int, topics: Iterable[str] = TOPICS
) -> list[str]:
    """Create `<namespace>.<topic>` for the given catalog topics (default: all); existing ones are kept."""
    names = [topic_name(namespace, topic) for topic in topics]
    await log.create_topics([TopicSpec(name, partitions) for name in names])
    return names
