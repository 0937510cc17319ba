#!/usr/bin/env bash
# Fetches the Apache Kafka broker (scripts/kafka/pom.xml) and its dependencies with Maven into
# ORL_KAFKA_HOME (default ~/.cache/orl/kafka), outside the repo; reused while the pom is unchanged.
# tests/fixtures/kafka_broker.py starts brokers from these jars with the machine's Java (17 or later).
# Without Maven, point the tests at your own broker instead: ORL_TEST_KAFKA=host:port.
set -euo pipefail
cd "$(dirname "$0")/.."
kafka_home="${ORL_KAFKA_HOME:-$HOME/.cache/orl/kafka}"
if cmp -s scripts/kafka/pom.xml "$kafka_home/pom.xml" && [ -f "$kafka_home/libs/complete" ]; then
    echo "Kafka jars in $kafka_home/libs (reused)"
    exit 0
fi
for tool in mvn java; do
    command -v "$tool" >/dev/null || {
        echo "fetch_kafka.sh: '$tool' not found; install Maven and Java 17+, or run the tests against your own Kafka with ORL_TEST_KAFKA=host:port" >&2
        exit 1
    }
done
rm -rf "$kafka_home/libs"
mkdir -p "$kafka_home"
mvn -B -q -Dstyle.color=never -f scripts/kafka/pom.xml dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$kafka_home/libs"
cp scripts/kafka/pom.xml "$kafka_home/pom.xml"
touch "$kafka_home/libs/complete"
echo "Kafka jars in $kafka_home/libs ($(ls "$kafka_home/libs" | grep -c '\.jar$') jars)"
