"""JSON nesting depth: the one limit on how deeply nested a JSON text orl reads, and the parse that keeps it.

Python's `json` recurses once per nested array or object, so a text nested a few thousand levels
deep raises RecursionError (and a few hundred can already exhaust a deep caller's stack). Every JSON
text that comes from outside (a request body, a tool call's `arguments`) is parsed with
`loads_within_depth`, which counts brackets outside strings without recursing, before `json.loads`
sees the text. Reads and writes nothing.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

from orl.schemas.errors import OrlError

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects accepted (`{}` and `[]` are depth 1, `{"a": [1]}` depth 2).

Chat requests nest about 6 levels (body, messages, message, tool_calls, call, function); tool
schemas a few more. 64 leaves ample room and stays far below Python's recursion limit.
"""

# a JSON string, escapes included: what sits between its quotes is never structure
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class JsonTooDeep(OrlError, ValueError):
    """A JSON text nested deeper than the limit (a ValueError, as any other JSON that is not accepted)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels (arrays and objects)")
        self.limit = limit


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in `text`, counted without recursing.

    Brackets inside strings do not count. For a text that is not JSON the figure is a guess, which
    is enough: `json.loads` refuses such a text anyway.
    """
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def loads_within_depth(text: str, limit: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads(text)`, or JsonTooDeep when `text` nests deeper than `limit`.

    Other bad JSON raises what `json.loads` raises (JSONDecodeError, a ValueError).
    """
    # the quick test first: a text with no more opening brackets than the limit cannot exceed it
    if text.count("[") + text.count("{") > limit and json_depth(text) > limit:
        raise JsonTooDeep(limit)
    try:
        return json.loads(text)
    except RecursionError as error:  # a text the scan misjudged (not JSON); never expected
        raise JsonTooDeep(limit) from error
