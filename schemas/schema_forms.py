"""Normal forms of Avro schemas: self-contained expansion, logical-type stripping and fingerprints.

The frozen history (`schemas/history/<EventType>/v<N>.avsc`), the compatibility checker and the
codec all work on the *self-contained* form: one JSON schema with full names, every named type
defined at its first use and referenced by name afterwards, and no `doc` strings (docs do not
affect resolution, so editing one must not create a new schema version).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint, to_parsing_canonical_form
from orl.schemas.errors import SchemaDefinitionError

Schema = Any  # an Avro schema as parsed JSON: a type name, a union list or a dict

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED_KINDS = frozenset({"record", "error", "enum", "fixed"})
_STRUCTURAL_KEYS = frozenset(
    {"type", "name", "namespace", "fields", "items", "values", "symbols", "size", "doc"}
)


def parse_named(schema: Schema, named: dict[str, Schema], where: str) -> Schema:
    """fastavro-parse `schema`, resolving references through (and adding its named types to) `named`."""
    try:
        return parse_schema(schema, named, _write_hint=False)
    except Exception as exc:  # fastavro raises bare Exception subclasses for every kind of bad schema
        raise SchemaDefinitionError(f"{where}: invalid Avro schema: {type(exc).__name__}: {exc}") from exc


def expand(parsed: Schema, named: Mapping[str, Schema]) -> Schema:
    """The self-contained form of a fastavro-parsed schema whose references resolve through `named`."""
    return _expand(parsed, named, set())


def self_contained(schema: Schema, where: str = "schema") -> Schema:
    """The self-contained form of a standalone schema (short names and namespaces are resolved)."""
    named: dict[str, Schema] = {}
    return expand(parse_named(schema, named, where), named)


def without_logical_types(schema: Schema) -> Schema:
    """A copy of `schema` without `logicalType`s, so timestamps stay plain ints in Python."""
    if isinstance(schema, list):
        return [without_logical_types(branch) for branch in schema]
    if isinstance(schema, dict):
        return {k: without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    return schema


def fingerprint_of(schema: Schema) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint of the schema's parsing canonical form, as written on the wire."""
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def short_name(fullname: str) -> str:
    return fullname.rsplit(".", 1)[-1]


def _expand(schema: Schema, named: Mapping[str, Schema], defined: set[str]) -> Schema:
    if isinstance(schema, list):
        return [_expand(branch, named, defined) for branch in schema]
    if isinstance(schema, str):
        if schema in PRIMITIVES or schema in defined:
            return schema
        if schema not in named:
            raise SchemaDefinitionError(f"undefined type {schema!r}")
        return _expand(named[schema], named, defined)
    kind = schema["type"]
    out: dict[str, Any] = {"type": kind}
    if kind in NAMED_KINDS:
        out["name"] = schema["name"]
        defined.add(schema["name"])  # before the fields: a recursive type refers to itself by name
    if kind in ("record", "error"):
        out["fields"] = [_expand_field(field, named, defined) for field in schema["fields"]]
    elif kind == "array":
        out["items"] = _expand(schema["items"], named, defined)
    elif kind == "map":
        out["values"] = _expand(schema["values"], named, defined)
    elif kind == "enum":
        out["symbols"] = list(schema["symbols"])
    elif kind == "fixed":
        out["size"] = schema["size"]
    out.update(_extra_properties(schema))
    return out


def _expand_field(field: Mapping[str, Any], named: Mapping[str, Schema], defined: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": field["name"], "type": _expand(field["type"], named, defined)}
    for key in sorted(field):
        if key not in ("name", "type", "doc") and not key.startswith("__"):
            out[key] = field[key]
    return out


def _extra_properties(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {
        key: schema[key] for key in sorted(schema) if key not in _STRUCTURAL_KEYS and not key.startswith("__")
    }
