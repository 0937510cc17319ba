"""Schema evolution end to end: an event written by an old producer decodes with the new schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from orl.schemas.codec import Codec
from orl.schemas.errors import EventDecodeError, SchemaCompatibilityError
from orl.schemas.freeze import freeze
from orl.schemas.registry import AVRO_DIR, HISTORY_DIR, load_registry

from tests.unit.event_examples import example_event

NEW_FIELDS: list[dict[str, object]] = [
    {"name": "closed_by", "type": ["null", "string"], "default": None},
    {"name": "idle_s", "type": "double", "default": 0.0},
]


@pytest.fixture
def schema_dirs(tmp_path: Path) -> tuple[Path, Path]:
    avro, history = tmp_path / "avro", tmp_path / "history"
    shutil.copytree(AVRO_DIR, avro)
    shutil.copytree(HISTORY_DIR, history)
    return avro, history


def add_fields(avsc: Path, fields: list[dict[str, object]]) -> None:
    schema = json.loads(avsc.read_text())
    schema["fields"].extend(fields)
    avsc.write_text(json.dumps(schema))


def test_v1_event_decodes_with_v2_schema(schema_dirs: tuple[Path, Path]) -> None:
    avro, history = schema_dirs
    old_codec = Codec(load_registry(avro, history))
    add_fields(avro / "SessionClosed.avsc", NEW_FIELDS)
    assert freeze(avro, history) == [history / "SessionClosed" / "v2.avsc"]
    new_registry = load_registry(avro, history)
    assert new_registry.current("SessionClosed").version == 2
    assert new_registry.unfrozen() == ()
    new_codec = Codec(new_registry)

    event = example_event("SessionClosed")
    decoded = new_codec.decode(old_codec.encode(event))

    assert decoded == {**event, "closed_by": None, "idle_s": 0.0}
    assert decoded["envelope"]["schema_version"] == 1  # what the producer wrote with


def test_new_events_need_upgraded_consumers(schema_dirs: tuple[Path, Path]) -> None:
    avro, history = schema_dirs
    old_codec = Codec(load_registry(avro, history))
    add_fields(avro / "SessionClosed.avsc", NEW_FIELDS)
    freeze(avro, history)
    new_codec = Codec(load_registry(avro, history))
    data = new_codec.encode({**example_event("SessionClosed"), "closed_by": "user", "idle_s": 30.0})
    assert new_codec.decode(data)["idle_s"] == 30.0
    with pytest.raises(EventDecodeError, match="unknown writer schema fingerprint"):
        old_codec.decode(data)


def test_changing_the_envelope_versions_every_event(schema_dirs: tuple[Path, Path]) -> None:
    avro, history = schema_dirs
    add_fields(avro / "Envelope.avsc", [{"name": "trace_id", "type": ["null", "string"], "default": None}])
    written = freeze(avro, history)
    registry = load_registry(avro, history)
    assert sorted(path.parent.name for path in written) == sorted(registry.event_types)
    for path in written:  # each event's next version (SampleReady and TeacherScored are past v1)
        assert path.name == f"v{len(registry.history(path.parent.name))}.avsc"


def test_freeze_refuses_a_field_without_default(schema_dirs: tuple[Path, Path]) -> None:
    avro, history = schema_dirs
    add_fields(avro / "SessionClosed.avsc", [{"name": "closed_by", "type": "string"}])
    with pytest.raises(SchemaCompatibilityError, match=r"SessionClosed\.closed_by: field is missing"):
        freeze(avro, history)
    assert not (history / "SessionClosed" / "v2.avsc").exists()


def test_unfrozen_change_gets_the_next_version_number(schema_dirs: tuple[Path, Path]) -> None:
    avro, history = schema_dirs
    add_fields(avro / "SessionClosed.avsc", NEW_FIELDS)
    registry = load_registry(avro, history)
    assert registry.unfrozen() == ("SessionClosed",)
    assert registry.current("SessionClosed").version == 2
