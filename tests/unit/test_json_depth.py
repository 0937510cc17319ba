"""The JSON depth limit: the bracket scan agrees with the parsed value's depth, and never recurses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orl.schemas.json_depth import MAX_JSON_DEPTH, JsonTooDeep, json_depth, loads_within_depth
from orl.schemas.messages import parsed_arguments

TRICKY_TEXT = st.text(alphabet='[]{}"\\ab\u00e9\ud7ff\n', max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY_TEXT, inner, max_size=3),
    max_leaves=20,
)


def reference_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((reference_depth(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((reference_depth(item) for item in value.values()), default=0)
    return 0


@given(value=JSON_VALUES, ascii_only=st.booleans())
@settings(max_examples=500, derandomize=True, database=None)
def test_the_scan_counts_what_the_parser_nests(value: Any, ascii_only: bool) -> None:
    assert json_depth(json.dumps(value, ensure_ascii=ascii_only)) == reference_depth(value)


def test_the_limit_is_inclusive() -> None:
    at_limit = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert json_depth(at_limit) == MAX_JSON_DEPTH
    assert reference_depth(loads_within_depth(at_limit)) == MAX_JSON_DEPTH
    with pytest.raises(JsonTooDeep, match=str(MAX_JSON_DEPTH)):
        loads_within_depth("[" + at_limit + "]")


def test_a_text_nested_a_million_deep_is_refused_without_recursing() -> None:
    with pytest.raises(JsonTooDeep):
        loads_within_depth('{"a": ' + "[" * 1_000_000 + "]" * 1_000_000 + "}")
    assert json_depth("[" * 1_000_000) == 1_000_000


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"text": "[" * 10_000 + '\\"{' * 100})
    assert json_depth(text) == 1 and loads_within_depth(text)["text"].startswith("[[")


def test_too_deep_tool_call_arguments_stay_the_raw_string() -> None:
    deep = "[" * 5_000 + "]" * 5_000
    assert parsed_arguments(deep) == deep
    assert parsed_arguments("[" * 3 + "]" * 3) == [[[]]]
