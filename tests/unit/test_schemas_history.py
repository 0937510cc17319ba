"""The shipped schemas: frozen history is current and compatible, every event is well formed."""

from __future__ import annotations

import itertools
import json

from fastavro import parse_schema
from orl.schemas.compatibility import evolution_problems, incompatibilities
from orl.schemas.events import EVENT_TYPES
from orl.schemas.freeze import main as freeze_main
from orl.schemas.registry import AVRO_DIR, HISTORY_DIR, default_registry
from orl.schemas.topics import TOPICS


def test_current_schemas_equal_their_latest_frozen_version() -> None:
    unfrozen = default_registry().unfrozen()
    assert unfrozen == (), (
        f"schemas changed without a frozen version: {unfrozen}; run `python -m orl.schemas.freeze`"
    )


def test_freeze_check_passes(capsys) -> None:  # type: ignore[no-untyped-def]
    assert freeze_main(["--check"]) == 0, capsys.readouterr().out


def test_every_frozen_version_is_read_by_every_later_version() -> None:
    registry = default_registry()
    for event_type in registry.event_types:
        versions = [version.schema for version in registry.history(event_type)]
        assert evolution_problems(versions) == [], event_type


def test_current_schema_reads_every_frozen_version() -> None:
    registry = default_registry()
    for event_type in registry.event_types:
        for frozen in registry.history(event_type):
            assert incompatibilities(registry.current(event_type).schema, frozen.schema) == []


def test_frozen_files_are_self_contained() -> None:
    paths = sorted(HISTORY_DIR.glob("*/v*.avsc"))
    assert len(paths) >= len(EVENT_TYPES)
    for path in paths:
        parse_schema(json.loads(path.read_text()))  # no named_schemas: every type is defined inside


def test_event_types_match_the_avsc_files_and_the_topic_catalog() -> None:
    registry = default_registry()
    assert set(EVENT_TYPES) == set(registry.event_types)
    assert len(EVENT_TYPES) == len(set(EVENT_TYPES))
    in_topics = list(itertools.chain.from_iterable(TOPICS.values()))
    assert set(in_topics) | {"DeadLettered"} == set(EVENT_TYPES)


def test_every_event_starts_with_the_shared_envelope() -> None:
    for event_type in EVENT_TYPES:
        raw = json.loads((AVRO_DIR / f"{event_type}.avsc").read_text())
        assert raw["fields"][0] == {"name": "envelope", "type": "orl.events.Envelope"}, event_type
        assert raw["namespace"] == "orl.events"


def test_fingerprints_are_unique_per_event_type() -> None:
    registry = default_registry()
    owners = {version.fingerprint: version.event_type for version in registry.writers()}
    assert set(owners.values()) == set(registry.event_types)
