"""Shared pytest set-up: service fixtures live in tests/fixtures/ and are registered here."""

pytest_plugins = [
    "tests.fixtures.kafka_broker",
    "tests.fixtures.s3_server",
    "tests.fixtures.model",
    "tests.fixtures.fake_sglang",
]
