"""schemas/event_types.py: generated from the .avsc files, fresh, and true to real events.

The freshness test is what makes CI fail when someone edits a schema without regenerating. The
shape tests check every golden and example event against its TypedDict, nested records included.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from orl.schemas.event_types import EVENT_CLASSES, Envelope
from orl.schemas.events import EVENT_TYPES
from orl.schemas.registry import default_registry

from tests.unit.event_examples import example_event

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_event_types", ROOT / "scripts" / "gen_event_types.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


GEN = _generator()


def test_checked_in_module_matches_a_fresh_generation() -> None:
    checked_in = (ROOT / "schemas" / "event_types.py").read_text(encoding="utf-8")
    assert checked_in == GEN.render(), (
        "schemas/event_types.py is stale: run `python scripts/gen_event_types.py` and commit it"
    )


def test_check_flag_fails_on_a_stale_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "event_types.py"
    stale.write_text(GEN.render().replace("    run_id: str\n", "    run_name: str\n", 1))
    assert GEN.main(["--check", "--output", str(stale)]) == 1
    assert "is stale" in capsys.readouterr().err
    GEN.main(["--output", str(stale)])
    assert GEN.main(["--check", "--output", str(stale)]) == 0


def test_every_event_type_has_a_typeddict_with_the_schema_fields() -> None:
    assert list(EVENT_CLASSES) == list(EVENT_TYPES)
    for event_type in EVENT_TYPES:
        cls = EVENT_CLASSES[event_type]
        fields = [f["name"] for f in default_registry().current(event_type).schema["fields"]]
        assert list(typing.get_type_hints(cls)) == fields, event_type
        assert typing.get_type_hints(cls)["envelope"] is Envelope
        assert cls.__required_keys__ == frozenset(fields)  # type: ignore[attr-defined]


def _golden_events() -> list[dict[str, Any]]:
    events = list(json.loads((GOLDEN / "pipeline_input.json").read_text())["events"])
    for path in sorted(GOLDEN.glob("pipeline_output_*.json")):
        events += [record["event"] for record in json.loads(path.read_text())]
    return events


def _problems(value: Any, hint: Any, where: str) -> list[str]:
    """Where `value` does not have the shape `hint` (a generated annotation) says."""
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not a {hint.__name__}"]
        hints = typing.get_type_hints(hint)
        if set(value) != set(hints):
            return [f"{where}: keys {sorted(value)} != {hint.__name__} keys {sorted(hints)}"]
        return [p for key, sub in hints.items() for p in _problems(value[key], sub, f"{where}.{key}")]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is types.UnionType:
        if value is None and type(None) in args:
            return []
        branches = [branch for branch in args if branch is not type(None)]
        results = [_problems(value, branch, where) for branch in branches]
        return [] if any(not r for r in results) else results[0]
    if origin is list:
        if not isinstance(value, list):
            return [f"{where}: {type(value).__name__}, not a list"]
        return [p for i, item in enumerate(value) for p in _problems(item, args[0], f"{where}[{i}]")]
    if origin is dict:
        if not isinstance(value, dict):
            return [f"{where}: {type(value).__name__}, not a dict"]
        return [p for key, item in value.items() for p in _problems(item, args[1], f"{where}[{key!r}]")]
    allowed = (int, float) if hint is float else (hint,)  # JSON and Avro both accept an int for a double
    if not isinstance(value, allowed) or (hint is not bool and isinstance(value, bool)):
        return [f"{where}: {value!r} is not a {hint.__name__}"]
    return []


def test_golden_events_have_exactly_their_typeddict_shape() -> None:
    events = _golden_events()
    assert len({e["envelope"]["event_type"] for e in events}) >= 10
    problems = [
        p
        for i, event in enumerate(events)
        for p in _problems(event, EVENT_CLASSES[event["envelope"]["event_type"]], f"event {i}")
    ]
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_example_events_have_exactly_their_typeddict_shape(event_type: str) -> None:
    assert _problems(example_event(event_type), EVENT_CLASSES[event_type], event_type) == []


def test_shape_check_sees_a_misnamed_nested_field() -> None:
    event = example_event("CheckpointPublished")
    event["consumed_offsets"][0]["partition_id"] = event["consumed_offsets"][0].pop("partition")
    assert _problems(event, EVENT_CLASSES["CheckpointPublished"], "e") != []


def test_generator_maps_every_avro_kind(tmp_path: Path) -> None:
    (tmp_path / "Envelope.avsc").write_text((ROOT / "schemas" / "avro" / "Envelope.avsc").read_text())
    (tmp_path / "Probe.avsc").write_text(json.dumps(_PROBE))
    source = GEN.render(tmp_path)
    for line in (
        'Color: TypeAlias = Literal["RED", "GREEN"]',
        "    colors: dict[str, Color]",
        "    blob: bytes",
        "    digest: bytes",
        "    at_ms: int",
        "    ratio: float",
        "    inner: Inner | None",
        "    tags: list[str]",
        "    either: int | str",
        '    """A probe."""',
        "    # The inner record.",
    ):
        assert line in source, line
    module = types.ModuleType("probe_types")
    sys.modules[module.__name__] = module  # get_type_hints resolves names through the module
    try:
        exec(compile(source, "probe_types.py", "exec"), module.__dict__)
        hints = typing.get_type_hints(module.Probe)
    finally:
        del sys.modules[module.__name__]
    assert hints["colors"] == dict[str, typing.Literal["RED", "GREEN"]]
    assert typing.get_type_hints(module.Inner) == {"n": int}
    assert list(module.EVENT_CLASSES) == ["Probe"]


_PROBE = {
    "type": "record",
    "name": "Probe",
    "namespace": "orl.events",
    "doc": "A probe.",
    "fields": [
        {"name": "envelope", "type": "orl.events.Envelope"},
        {
            "name": "colors",
            "type": {"type": "map", "values": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        },
        {"name": "blob", "type": "bytes"},
        {"name": "digest", "type": {"type": "fixed", "name": "Digest", "size": 4}},
        {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ratio", "type": "float"},
        {
            "name": "inner",
            "type": ["null", {"type": "record", "name": "Inner", "fields": [{"name": "n", "type": "int"}]}],
            "doc": "The inner record.",
            "default": None,
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "either", "type": ["int", "string"]},
    ],
}
