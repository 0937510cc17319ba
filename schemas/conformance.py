"""Checks that a Python value conforms to an Avro schema, naming the first offending field path.

`compile_check(schema)` turns a self-contained schema into a function `(value, path) -> problem`
that returns None when the value can be encoded, else a message such as
`ResponseGenerated.response_logprobs[3]: expected float, got 'x'`. The check is strict where
fastavro is lenient: unknown record keys are errors (a typo must not silently become a null),
missing fields are errors unless the schema gives them a default, bools are not ints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from orl.schemas.schema_forms import Schema, short_name

Check = Callable[[Any, str], "str | None"]

_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
_MISSING = object()
_INT_TYPES = frozenset({int})
_NUMBER_TYPES = frozenset({int, float})
_STR_TYPES = frozenset({str})
_RANGE_FREE_TYPES: dict[str, frozenset[type]] = {
    "null": frozenset({type(None)}),
    "boolean": frozenset({bool}),
    "string": _STR_TYPES,
    "bytes": frozenset({bytes, bytearray}),
    "float": _NUMBER_TYPES,
    "double": _NUMBER_TYPES,
}


def compile_check(schema: Schema) -> Check:
    """A conformance check for values of the self-contained `schema`."""
    return _compile(schema, {})


def _is_int(value: Any) -> bool:
    return type(value) is int and _INT_MIN <= value <= _INT_MAX


def _is_long(value: Any) -> bool:
    return type(value) is int and _LONG_MIN <= value <= _LONG_MAX


def _is_number(value: Any) -> bool:
    return isinstance(value, float) or type(value) is int


_PRIMITIVE_TESTS: dict[str, Callable[[Any], bool]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: v is True or v is False,
    "int": _is_int,
    "long": _is_long,
    "float": _is_number,
    "double": _is_number,
    "bytes": lambda v: isinstance(v, bytes | bytearray),
    "string": lambda v: isinstance(v, str),
}


def _compile(schema: Schema, named: dict[str, Check]) -> Check:
    if isinstance(schema, list):
        return _union_check(schema, [_compile(branch, named) for branch in schema])
    if isinstance(schema, str):
        if schema in _PRIMITIVE_TESTS:
            return _primitive_check(schema)
        return lambda value, path: named[schema](value, path)  # defined earlier in the same schema
    kind = schema["type"]
    if kind in _PRIMITIVE_TESTS:
        return _primitive_check(kind)
    if kind == "array":
        return _array_check(schema["items"], _compile(schema["items"], named))
    if kind == "map":
        return _map_check(schema["values"], _compile(schema["values"], named))
    if kind == "enum":
        check: Check = _enum_check(schema)
    elif kind == "fixed":
        check = _fixed_check(schema)
    else:
        check = _record_check(schema, named)
    named[schema["name"]] = check
    return check


def _primitive_check(kind: str) -> Check:
    test = _PRIMITIVE_TESTS[kind]

    def check(value: Any, path: str) -> str | None:
        return None if test(value) else _expected(path, kind, value)

    return check


def _union_check(schema: list[Schema], branches: list[Check]) -> Check:
    # Primitive branches are tried as plain tests first: a failing branch must not build a message.
    tests = [_PRIMITIVE_TESTS[b] for b in schema if isinstance(b, str) and b in _PRIMITIVE_TESTS]
    others = [
        c for b, c in zip(schema, branches, strict=True) if not (isinstance(b, str) and b in _PRIMITIVE_TESTS)
    ]
    non_null = [check for branch, check in zip(schema, branches, strict=True) if branch != "null"]

    def check(value: Any, path: str) -> str | None:
        for test in tests:
            if test(value):
                return None
        for branch in others:
            if branch(value, path) is None:
                return None
        if len(non_null) == 1 and value is not None:
            return non_null[0](value, path)  # the precise problem inside an optional value
        return _expected(path, _describe(schema), value)

    return check


def _array_check(items: Schema, item_check: Check) -> Check:
    all_valid = _fast_all(items)

    def check(value: Any, path: str) -> str | None:
        if not isinstance(value, list | tuple):
            return _expected(path, f"array<{_describe(items)}>", value)
        if all_valid is not None and all_valid(value):
            return None
        for index, item in enumerate(value):
            problem = item_check(item, f"{path}[{index}]")
            if problem is not None:
                return problem
        return None

    return check


def _fast_all(items: Schema) -> Callable[[Any], bool] | None:
    """A bulk test for arrays of numbers (token ids, logprobs): one pass in C-speed builtins."""
    if items in ("int", "long"):
        low, high = (_INT_MIN, _INT_MAX) if items == "int" else (_LONG_MIN, _LONG_MAX)
        return lambda v: set(map(type, v)) <= _INT_TYPES and (not v or (min(v) >= low and max(v) <= high))
    if items in ("float", "double"):
        return lambda v: set(map(type, v)) <= _NUMBER_TYPES
    if items == "string":
        return lambda v: set(map(type, v)) <= _STR_TYPES
    return None


def _map_check(values: Schema, value_check: Check) -> Check:
    def check(value: Any, path: str) -> str | None:
        if not isinstance(value, Mapping):
            return _expected(path, f"map<{_describe(values)}>", value)
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path}: map keys must be strings, got {_shown(key)}"
            problem = value_check(item, f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None

    return check


def _enum_check(schema: Mapping[str, Any]) -> Check:
    symbols = frozenset(schema["symbols"])

    def check(value: Any, path: str) -> str | None:
        return (
            None
            if isinstance(value, str) and value in symbols
            else _expected(path, f"one of {sorted(symbols)}", value)
        )

    return check


def _fixed_check(schema: Mapping[str, Any]) -> Check:
    size = schema["size"]

    def check(value: Any, path: str) -> str | None:
        ok = isinstance(value, bytes | bytearray) and len(value) == size
        return None if ok else _expected(path, f"{size} bytes", value)

    return check


def _record_check(schema: Mapping[str, Any], named: dict[str, Check]) -> Check:
    fields: list[tuple[str, bool, frozenset[type] | None, Check]] = []
    record_name = short_name(schema["name"])

    def check(value: Any, path: str) -> str | None:
        if not (type(value) is dict or isinstance(value, Mapping)):
            return _expected(path, f"record {record_name}", value)
        for name, has_default, accepted_types, field_check in fields:
            item = value.get(name, _MISSING)
            if item is _MISSING:
                if has_default:
                    continue
                return f"{path}.{name}: missing (the field has no default)"
            if accepted_types is not None and type(item) in accepted_types:
                continue  # the common case, decided without a call or a path string
            problem = field_check(item, f"{path}.{name}")
            if problem is not None:
                return problem
        if len(value) > len(fields) or not names.issuperset(value):
            unknown = sorted(str(key) for key in value if key not in names)
            return f"{path}: unknown field(s) {unknown}"
        return None

    named[schema["name"]] = check  # before compiling the fields, so a recursive type can refer to it
    for f in schema["fields"]:
        fields.append((f["name"], "default" in f, _accepted_types(f["type"]), _compile(f["type"], named)))
    names = frozenset(name for name, _, _, _ in fields)
    return check


def _accepted_types(schema: Schema) -> frozenset[type] | None:
    """Python types always valid for `schema` (a primitive without range limits, or a union of such)."""
    branches = schema if isinstance(schema, list) else [schema]
    accepted: set[type] = set()
    for branch in branches:
        if not isinstance(branch, str) or branch not in _RANGE_FREE_TYPES:
            return None
        accepted |= _RANGE_FREE_TYPES[branch]
    return frozenset(accepted)


def _expected(path: str, expected: str, value: Any) -> str:
    return f"{path}: expected {expected}, got {_shown(value)}"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(schema: Schema) -> str:
    if isinstance(schema, list):
        return " or ".join(_describe(branch) for branch in schema)
    if isinstance(schema, str):
        return short_name(schema)
    kind = schema["type"]
    if kind == "array":
        return f"array<{_describe(schema['items'])}>"
    if kind == "map":
        return f"map<{_describe(schema['values'])}>"
    return short_name(schema.get("name", kind))
