"""How orl creates its topics on Kafka, and the one bound on the size of a recorded event.

Pure: reads and writes nothing. `KafkaEventLog` and the faust runtime create every topic with
`replicas(brokers)` replicas and `topic_configs(replicas)`; the Kafka producer's max_request_size and
each topic's max.message.bytes are `max_message_bytes`, derived from `max_record_bytes`, which both
logs enforce on append (`RecordRefused`) and the server enforces with a 413 before it acknowledges a
turn. The settings behind it are `ConnectionSettings.log_replication_factor`,
`log_min_insync_replicas` and `max_record_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

from orl.schemas.errors import ConfigError

DEFAULT_MAX_RECORD_BYTES = 1 << 20  # 1 MiB of encoded event
# What a Kafka record batch adds to one event's bytes: its key (a session id), headers, the record
# and batch framing (61 bytes of batch header). Generous, so an event at the limit always fits.
RECORD_OVERHEAD_BYTES = 16 << 10
MAX_REPLICAS_BY_DEFAULT = 3


@dataclass(frozen=True)
class TopicPolicy:
    """0 means "the default": replicas min(3, brokers); min ISR 2 once there are 3 replicas, else 1."""

    replication_factor: int = 0
    min_insync_replicas: int = 0
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    def __post_init__(self) -> None:
        if self.replication_factor < 0 or self.min_insync_replicas < 0:
            raise ConfigError(
                "--log-replication-factor and --log-min-insync-replicas must be >= 0 (0: the default), "
                f"not {self.replication_factor} and {self.min_insync_replicas}"
            )
        if self.max_record_bytes < 1024:
            raise ConfigError(f"--max-record-bytes must be at least 1024, not {self.max_record_bytes}")

    def replicas(self, brokers: int) -> int:
        """The replication factor of a new topic on a cluster of `brokers` brokers."""
        replicas = self.replication_factor or min(MAX_REPLICAS_BY_DEFAULT, brokers)
        if replicas > brokers:
            raise ConfigError(
                f"--log-replication-factor {replicas} needs {replicas} brokers; the cluster has {brokers}"
            )
        return replicas

    def min_insync(self, replicas: int) -> int:
        """min.insync.replicas of a topic with `replicas` replicas: with acks=all, a write is
        acknowledged only once this many replicas have it."""
        chosen = self.min_insync_replicas or (2 if replicas >= 3 else 1)
        if chosen > replicas:
            raise ConfigError(
                f"--log-min-insync-replicas {chosen} exceeds the topics' {replicas} replica(s): no write could succeed"
            )
        return chosen

    @property
    def max_message_bytes(self) -> int:
        """The producer's max_request_size and each topic's max.message.bytes."""
        return self.max_record_bytes + RECORD_OVERHEAD_BYTES

    def topic_configs(self, replicas: int) -> dict[str, str]:
        """Configs of every topic orl creates (merged under a topic's own, such as cleanup.policy)."""
        return {
            "min.insync.replicas": str(self.min_insync(replicas)),
            "unclean.leader.election.enable": "false",  # never elect a replica that may lack acknowledged records
            "max.message.bytes": str(self.max_message_bytes),
        }

    def oversized(self, value: bytes) -> str | None:
        """Why `value` may not be appended (it is over the limit), or None when it may."""
        if len(value) > self.max_record_bytes:
            return f"record of {len(value)} bytes exceeds --max-record-bytes {self.max_record_bytes}"
        return None


DEFAULT_POLICY = TopicPolicy()


def power_cut_warning(topic: str, replicas: int) -> str | None:
    """What a topic's replication means for a power cut, when it can lose acknowledged records."""
    if replicas >= 2:
        return None
    return (
        f"topic {topic!r} has {replicas} replica: Kafka does not fsync each write, so a power cut of its "
        "broker can lose records it acknowledged, including turns the server acknowledged once they left "
        "the spool (set --log-replication-factor 3 on a cluster of 3 brokers)"
    )
