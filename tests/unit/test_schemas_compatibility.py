"""The Avro schema-resolution checker, one rule at a time."""

from __future__ import annotations

from typing import Any

import pytest
from orl.schemas.compatibility import evolution_problems, incompatibilities


def record(*fields: dict[str, Any], name: str = "Thing", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "orl.test", "fields": list(fields), **extra}


def field(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def test_identical_schemas_are_compatible() -> None:
    schema = record(field("a", "int"), field("b", ["null", "string"], default=None))
    assert incompatibilities(schema, schema) == []


def test_added_field_with_default_is_compatible() -> None:
    old = record(field("a", "int"))
    new = record(field("a", "int"), field("b", "string", default="x"))
    assert incompatibilities(new, old) == []


def test_added_field_without_default_is_flagged() -> None:
    old = record(field("a", "int"))
    new = record(field("a", "int"), field("b", "string"))
    assert incompatibilities(new, old) == [
        "Thing.b: field is missing from the writer schema and has no default"
    ]


def test_removed_field_is_compatible_for_readers() -> None:
    old = record(field("a", "int"), field("b", "string"))
    assert incompatibilities(record(field("a", "int")), old) == []


def test_renamed_field_matches_through_reader_alias() -> None:
    old = record(field("a", "int"))
    assert incompatibilities(record(field("alpha", "int", aliases=["a"])), old) == []
    assert incompatibilities(record(field("alpha", "int")), old) != []


@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    ],
)
def test_type_promotions_are_compatible(writer: str, reader: str) -> None:
    assert incompatibilities(record(field("x", reader)), record(field("x", writer))) == []


@pytest.mark.parametrize(
    ("writer", "reader"), [("long", "int"), ("double", "float"), ("string", "int"), ("int", "boolean")]
)
def test_narrowing_and_unrelated_types_are_flagged(writer: str, reader: str) -> None:
    problems = incompatibilities(record(field("x", reader)), record(field("x", writer)))
    assert problems == [f"Thing.x: writer type {writer} cannot be read as {reader}"]


def test_nested_path_names_the_field() -> None:
    inner_old = record(field("seed", ["null", "long"], default=None), name="SamplingParams")
    inner_new = record(field("seed", ["null", "int"], default=None), name="SamplingParams")
    old = record(field("sampling", inner_old), name="RequestReceived")
    new = record(field("sampling", inner_new), name="RequestReceived")
    (problem,) = incompatibilities(new, old)
    assert problem.startswith("RequestReceived.sampling.seed: writer union branch long matches no branch")


def enum(*symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": "Kind", "symbols": list(symbols), **extra}


def test_adding_an_enum_symbol_is_compatible() -> None:
    assert (
        incompatibilities(record(field("k", enum("A", "B", "C"))), record(field("k", enum("A", "B")))) == []
    )


def test_removing_an_enum_symbol_is_flagged() -> None:
    (problem,) = incompatibilities(record(field("k", enum("A"))), record(field("k", enum("A", "B"))))
    assert problem == "Thing.k: writer enum symbols ['B'] are not in the reader enum, which has no default"


def test_removing_an_enum_symbol_is_allowed_with_an_enum_default() -> None:
    reader = record(field("k", enum("A", "UNKNOWN", default="UNKNOWN")))
    assert incompatibilities(reader, record(field("k", enum("A", "B")))) == []


def test_arrays_and_maps_check_their_items() -> None:
    old = record(field("xs", {"type": "array", "items": "int"}), field("m", {"type": "map", "values": "int"}))
    new = record(
        field("xs", {"type": "array", "items": "double"}), field("m", {"type": "map", "values": "long"})
    )
    assert incompatibilities(new, old) == []
    assert incompatibilities(old, new) == [
        "Thing.xs[]: writer type double cannot be read as int",
        "Thing.m{}: writer type long cannot be read as int",
    ]


def test_array_cannot_be_read_as_map() -> None:
    old = record(field("xs", {"type": "array", "items": "int"}))
    new = record(field("xs", {"type": "map", "values": "int"}))
    assert incompatibilities(new, old) == ["Thing.xs: writer type array<int> cannot be read as map<int>"]


def test_making_a_field_nullable_is_compatible_but_not_the_reverse() -> None:
    plain = record(field("s", "string"))
    nullable = record(field("s", ["null", "string"], default=None))
    assert incompatibilities(nullable, plain) == []
    assert incompatibilities(plain, nullable) == ["Thing.s: writer type null cannot be read as string"]


def test_union_branch_missing_from_reader_is_flagged() -> None:
    old = record(field("v", ["null", "int", "string"], default=None))
    new = record(field("v", ["null", "long"], default=None))
    (problem,) = incompatibilities(new, old)
    assert "writer union branch string matches no branch of reader union [null, long]" in problem


def test_union_branch_may_be_promoted() -> None:
    old = record(field("v", ["null", "int"], default=None))
    assert incompatibilities(record(field("v", ["null", "double"], default=None)), old) == []


def test_fixed_size_must_match() -> None:
    old = record(field("h", {"type": "fixed", "name": "Hash", "size": 16}))
    new = record(field("h", {"type": "fixed", "name": "Hash", "size": 32}))
    assert incompatibilities(new, old) == ["Thing.h: fixed size 16 cannot be read as size 32"]


def test_named_types_must_have_the_same_name_or_an_alias() -> None:
    old = record(field("x", "int"), name="Old")
    assert incompatibilities(record(field("x", "int"), name="New"), old) == [
        "New: writer record orl.test.Old cannot be read as orl.test.New"
    ]
    assert incompatibilities(record(field("x", "int"), name="New", aliases=["Old"]), old) == []


def test_recursive_types_terminate() -> None:
    node = record(field("value", "int"), field("next", ["null", "orl.test.Node"], default=None), name="Node")
    assert incompatibilities(node, node) == []


def test_evolution_problems_checks_every_pair() -> None:
    v1 = record(field("a", "int"))
    v2 = record(field("a", "int"), field("b", "int", default=0))
    v3 = record(field("a", "long"), field("b", "int"))  # b lost its default: v3 cannot read v1
    assert evolution_problems([v1, v2]) == []
    assert evolution_problems([v1, v2, v3]) == [
        "v3 reading v1: Thing.b: field is missing from the writer schema and has no default"
    ]
