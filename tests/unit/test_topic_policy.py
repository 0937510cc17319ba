"""TopicPolicy: the replicas, min ISR and record limit every Kafka topic of orl is created with."""

from __future__ import annotations

import pytest
from orl.connectors.event_log.topic_policy import (
    RECORD_OVERHEAD_BYTES,
    TopicPolicy,
    power_cut_warning,
)
from orl.connectors.settings import ConnectionSettings
from orl.schemas.errors import ConfigError


@pytest.mark.parametrize(("brokers", "replicas", "min_insync"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)])
def test_by_default_three_replicas_at_most_and_min_isr_two_once_there_are_three(
    brokers: int, replicas: int, min_insync: int
) -> None:
    policy = TopicPolicy()
    assert policy.replicas(brokers) == replicas
    assert policy.topic_configs(policy.replicas(brokers))["min.insync.replicas"] == str(min_insync)


def test_explicit_settings_win_and_impossible_ones_are_refused_naming_the_flag() -> None:
    policy = TopicPolicy(replication_factor=2, min_insync_replicas=2)
    assert policy.replicas(5) == 2 and policy.min_insync(2) == 2
    with pytest.raises(ConfigError, match="--log-replication-factor 2 needs 2 brokers; the cluster has 1"):
        policy.replicas(1)
    with pytest.raises(ConfigError, match="--log-min-insync-replicas 3 exceeds the topics' 1 replica"):
        TopicPolicy(min_insync_replicas=3).min_insync(1)
    with pytest.raises(ConfigError, match=">= 0"):
        TopicPolicy(replication_factor=-1)
    with pytest.raises(ConfigError, match="--max-record-bytes must be at least 1024"):
        TopicPolicy(max_record_bytes=10)


def test_the_record_limit_bounds_the_value_and_the_kafka_limits_follow_from_it() -> None:
    policy = TopicPolicy(max_record_bytes=4096)
    assert policy.oversized(b"x" * 4096) is None
    assert policy.oversized(b"x" * 4097) == "record of 4097 bytes exceeds --max-record-bytes 4096"
    assert policy.max_message_bytes == 4096 + RECORD_OVERHEAD_BYTES
    configs = policy.topic_configs(3)
    assert configs == {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
        "max.message.bytes": str(4096 + RECORD_OVERHEAD_BYTES),
    }


def test_the_settings_make_the_policy_and_one_replica_warns_of_power_cuts() -> None:
    settings = ConnectionSettings(log_replication_factor=3, log_min_insync_replicas=2, max_record_bytes=2048)
    assert settings.topic_policy() == TopicPolicy(3, 2, 2048)
    warning = power_cut_warning("live.requests", 1)
    assert warning is not None and "power cut" in warning and "'live.requests' has 1 replica" in warning
    assert power_cut_warning("live.requests", 3) is None
