"""Avro schema-resolution checks: can a reader schema read everything a writer schema wrote?

Implements the resolution rules of the Avro specification: records (fields matched by name or
reader alias; reader fields the writer lacks need defaults; writer-only fields are skipped), type
promotions (int -> long/float/double, long -> float/double, float -> double, string <-> bytes),
enums (writer symbols must exist in the reader unless the reader has a default), arrays, maps,
unions, fixed sizes and named-type names. Problems are human-readable and carry a path such as
`RequestReceived.sampling.seed`; `[]` marks array items and `{}` map values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orl.schemas.schema_forms import NAMED_KINDS, PRIMITIVES, Schema, self_contained, short_name

PROMOTIONS: frozenset[tuple[str, str]] = frozenset(
    {
        ("int", "long"),
        ("int", "float"),
        ("int", "double"),
        ("long", "float"),
        ("long", "double"),
        ("float", "double"),
        ("string", "bytes"),
        ("bytes", "string"),
    }
)  # (writer type, reader type)


def incompatibilities(reader: Schema, writer: Schema) -> list[str]:
    """Problems reading data written with `writer` using `reader`; an empty list means compatible."""
    reader_form, writer_form = self_contained(reader, "reader"), self_contained(writer, "writer")
    return _Resolver(reader_form, writer_form).resolve(reader_form, writer_form, _root_path(reader_form))


def evolution_problems(versions: Sequence[Schema]) -> list[str]:
    """Problems of a version history (oldest first): every version must read every earlier one."""
    problems: list[str] = []
    for newer in range(1, len(versions)):
        for older in range(newer):
            for problem in incompatibilities(versions[newer], versions[older]):
                problems.append(f"v{newer + 1} reading v{older + 1}: {problem}")
    return problems


class _Resolver:
    def __init__(self, reader: Schema, writer: Schema) -> None:
        self._reader_named = _named_types(reader)
        self._writer_named = _named_types(writer)
        self._in_progress: set[tuple[str, str]] = set()

    def resolve(self, reader: Schema, writer: Schema, path: str) -> list[str]:
        reader = _deref(reader, self._reader_named)
        writer = _deref(writer, self._writer_named)
        if isinstance(writer, list):
            return [p for branch in writer for p in self._resolve_writer_branch(reader, branch, path)]
        if isinstance(reader, list):
            branch = self._select_branch(reader, writer)
            if branch is None:
                return [
                    f"{path}: writer type {_describe(writer)} matches no branch of reader {_describe(reader)}"
                ]
            return self.resolve(branch, writer, path)
        reader_kind, writer_kind = _kind(reader), _kind(writer)
        if reader_kind in PRIMITIVES or writer_kind in PRIMITIVES:
            return _primitive_problems(reader_kind, writer_kind, path)
        if reader_kind != writer_kind:
            return [f"{path}: writer type {_describe(writer)} cannot be read as {_describe(reader)}"]
        if reader_kind in NAMED_KINDS and not _names_match(reader, writer):
            return [f"{path}: writer {writer_kind} {writer['name']} cannot be read as {reader['name']}"]
        return self._resolve_complex(reader, writer, path)

    def _resolve_writer_branch(self, reader: Schema, branch: Schema, path: str) -> list[str]:
        if (
            isinstance(reader, list)
            and self._select_branch(reader, _deref(branch, self._writer_named)) is None
        ):
            return [
                f"{path}: writer union branch {_describe(branch)} matches no branch of reader {_describe(reader)}"
            ]
        return self.resolve(reader, branch, path)

    def _select_branch(self, union: list[Schema], writer: Schema) -> Schema | None:
        """The first reader branch of the writer's kind (and name), else the first it promotes to."""
        branches = [_deref(b, self._reader_named) for b in union]
        for branch in branches:
            if _kind(branch) == _kind(writer) and (
                _kind(writer) not in NAMED_KINDS or _names_match(branch, writer)
            ):
                return branch
        for branch in branches:
            if (_kind(writer), _kind(branch)) in PROMOTIONS:
                return branch
        return None

    def _resolve_complex(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
        kind = reader["type"]
        if kind == "array":
            return self.resolve(reader["items"], writer["items"], f"{path}[]")
        if kind == "map":
            return self.resolve(reader["values"], writer["values"], f"{path}{{}}")
        if kind == "enum":
            return _enum_problems(reader, writer, path)
        if kind == "fixed":
            if reader["size"] != writer["size"]:
                return [f"{path}: fixed size {writer['size']} cannot be read as size {reader['size']}"]
            return []
        return self._record_problems(reader, writer, path)

    def _record_problems(self, reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
        pair = (reader["name"], writer["name"])
        if pair in self._in_progress:  # a recursive type: its fields are being checked further up
            return []
        self._in_progress.add(pair)
        writer_fields = {field["name"]: field for field in writer["fields"]}
        problems: list[str] = []
        for field in reader["fields"]:
            field_path = f"{path}.{field['name']}"
            source = _matching_field(field, writer_fields)
            if source is not None:
                problems += self.resolve(field["type"], source["type"], field_path)
            elif "default" not in field:
                problems.append(f"{field_path}: field is missing from the writer schema and has no default")
        self._in_progress.discard(pair)
        return problems


def _primitive_problems(reader_kind: str, writer_kind: str, path: str) -> list[str]:
    if reader_kind == writer_kind or (writer_kind, reader_kind) in PROMOTIONS:
        return []
    return [f"{path}: writer type {writer_kind} cannot be read as {reader_kind}"]


def _enum_problems(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    missing = [symbol for symbol in writer["symbols"] if symbol not in reader["symbols"]]
    if missing and "default" not in reader:
        return [f"{path}: writer enum symbols {missing} are not in the reader enum, which has no default"]
    return []


def _matching_field(field: Mapping[str, Any], writer_fields: Mapping[str, Any]) -> Any:
    for name in (field["name"], *field.get("aliases", ())):
        if name in writer_fields:
            return writer_fields[name]
    return None


def _names_match(reader: Mapping[str, Any], writer: Mapping[str, Any]) -> bool:
    writer_names = {writer["name"], short_name(writer["name"])}
    reader_names = {reader["name"], short_name(reader["name"]), *reader.get("aliases", ())}
    reader_names |= {short_name(alias) for alias in reader.get("aliases", ())}
    return bool(writer_names & reader_names)


def _named_types(schema: Schema) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    _collect_named(schema, found)
    return found


def _collect_named(schema: Schema, found: dict[str, dict[str, Any]]) -> None:
    if isinstance(schema, list):
        for branch in schema:
            _collect_named(branch, found)
    elif isinstance(schema, dict):
        if schema["type"] in NAMED_KINDS:
            found[schema["name"]] = schema
        for field in schema.get("fields", ()):
            _collect_named(field["type"], found)
        for key in ("items", "values"):
            if key in schema:
                _collect_named(schema[key], found)


def _deref(schema: Schema, named: Mapping[str, dict[str, Any]]) -> Schema:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    if isinstance(schema, dict) and schema["type"] in PRIMITIVES:
        return schema["type"]  # {"type": "long", "logicalType": ...} resolves like "long"
    return schema


def _kind(schema: Schema) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return str(schema["type"])


def _describe(schema: Schema) -> str:
    if isinstance(schema, list):
        return "union [" + ", ".join(_describe(branch) for branch in schema) + "]"
    if isinstance(schema, str):
        return short_name(schema) if schema not in PRIMITIVES else schema
    kind = schema["type"]
    if kind in NAMED_KINDS:
        return f"{kind} {short_name(schema['name'])}"
    if kind == "array":
        return f"array<{_describe(schema['items'])}>"
    if kind == "map":
        return f"map<{_describe(schema['values'])}>"
    return str(kind)


def _root_path(schema: Schema) -> str:
    if isinstance(schema, dict) and "name" in schema:
        return short_name(schema["name"])
    return _kind(schema)
