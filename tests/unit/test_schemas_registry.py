"""Loading schemas: named references across files, version numbering and bad definitions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from orl.schemas.errors import SchemaDefinitionError, UnknownEventTypeError
from orl.schemas.freeze import main as freeze_main
from orl.schemas.registry import AVRO_DIR, default_registry, load_registry


def test_shared_types_are_expanded_once_per_event() -> None:
    schema = default_registry().current("RequestReceived").schema
    envelope = schema["fields"][0]
    assert envelope["name"] == "envelope"
    assert envelope["type"]["name"] == "orl.events.Envelope"
    sampling = next(f for f in schema["fields"] if f["name"] == "sampling")
    assert [f["name"] for f in sampling["type"]["fields"]] == [
        "temperature",
        "top_p",
        "max_tokens",
        "stop",
        "seed",
        "constraint",
    ]


def test_docs_are_not_part_of_the_versioned_form() -> None:
    assert "doc" not in json.dumps(default_registry().current("ResponseGenerated").schema)


def test_unknown_event_type() -> None:
    with pytest.raises(UnknownEventTypeError, match="unknown event_type 'Nope'"):
        default_registry().current("Nope")


def test_writer_lookup_by_fingerprint() -> None:
    registry = default_registry()
    current = registry.current("TeacherScored")
    assert registry.writer(current.fingerprint) == current
    assert registry.writer(bytes(8)) is None


def write(path: Path, schema: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema))


ENVELOPE_REF = {"name": "envelope", "type": "orl.events.Envelope"}


@pytest.fixture
def avro(tmp_path: Path) -> Path:
    folder = tmp_path / "avro"
    folder.mkdir()
    shutil.copy(AVRO_DIR / "Envelope.avsc", folder)
    return folder


def test_event_referencing_an_undefined_type(avro: Path, tmp_path: Path) -> None:
    fields = [ENVELOPE_REF, {"name": "x", "type": "orl.events.Missing"}]
    write(
        avro / "Thing.avsc", {"type": "record", "name": "Thing", "namespace": "orl.events", "fields": fields}
    )
    with pytest.raises(SchemaDefinitionError, match=r"Thing\.avsc.*orl\.events\.Missing"):
        load_registry(avro, tmp_path / "history")


def test_file_must_be_named_after_its_type(avro: Path, tmp_path: Path) -> None:
    write(
        avro / "Other.avsc",
        {"type": "record", "name": "Thing", "namespace": "orl.events", "fields": [ENVELOPE_REF]},
    )
    with pytest.raises(SchemaDefinitionError, match="name the file after the type"):
        load_registry(avro, tmp_path / "history")


def test_shared_types_may_reference_each_other_in_any_order(avro: Path, tmp_path: Path) -> None:
    write(
        avro / "Aaa.avsc",
        {
            "type": "record",
            "name": "Aaa",
            "namespace": "orl.events",
            "fields": [{"name": "b", "type": "orl.events.Zzz"}],
        },
    )
    write(
        avro / "Zzz.avsc",
        {
            "type": "record",
            "name": "Zzz",
            "namespace": "orl.events",
            "fields": [{"name": "n", "type": "int"}],
        },
    )
    fields = [ENVELOPE_REF, {"name": "a", "type": "orl.events.Aaa"}]
    write(
        avro / "Thing.avsc", {"type": "record", "name": "Thing", "namespace": "orl.events", "fields": fields}
    )
    registry = load_registry(avro, tmp_path / "history")
    assert registry.event_types == ("Thing",)
    assert (
        registry.current("Thing").schema["fields"][1]["type"]["fields"][0]["type"]["name"] == "orl.events.Zzz"
    )


def test_history_versions_must_not_have_gaps(avro: Path, tmp_path: Path) -> None:
    write(
        avro / "Thing.avsc",
        {"type": "record", "name": "Thing", "namespace": "orl.events", "fields": [ENVELOPE_REF]},
    )
    history = tmp_path / "history"
    assert freeze_main(["--avro-dir", str(avro), "--history-dir", str(history)]) == 0
    (history / "Thing" / "v1.avsc").rename(history / "Thing" / "v2.avsc")
    with pytest.raises(SchemaDefinitionError, match="not 1..N without gaps"):
        load_registry(avro, history)


def test_freeze_cli_reports_what_it_wrote(avro: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    write(
        avro / "Thing.avsc",
        {"type": "record", "name": "Thing", "namespace": "orl.events", "fields": [ENVELOPE_REF]},
    )
    history = tmp_path / "history"
    args = ["--avro-dir", str(avro), "--history-dir", str(history)]
    assert freeze_main([*args, "--check"]) == 1
    assert "needs freezing: Thing v1" in capsys.readouterr().out
    assert freeze_main(args) == 0
    assert f"wrote {history / 'Thing' / 'v1.avsc'}" in capsys.readouterr().out
    assert freeze_main(args) == 0
    assert "every schema is frozen" in capsys.readouterr().out
    assert freeze_main([*args, "--check"]) == 0
