"""The key rule (base.check_key): any key it accepts stays inside a LocalObjectStore's root."""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st
from orl.connectors.object_store.base import ObjectStoreError, check_key
from orl.connectors.object_store.local_store import LocalObjectStore

SEGMENT = st.sampled_from(["a", "b.c", ".", "..", "", "\\", "/", "x\x01", ".orl-tmp-1", "é"])
KEYS = st.lists(SEGMENT, min_size=1, max_size=5).map("".join)


@settings(max_examples=300, deadline=None)
@given(key=KEYS)
def test_accepted_keys_round_trip_inside_the_root(key: str) -> None:
    try:
        check_key(key)
    except ObjectStoreError:
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        store = LocalObjectStore(root)
        store.put(key, b"v")
        assert store.list() == [key]
        assert Path(unquote(urlsplit(store.uri(key)).path)).resolve().is_relative_to(root.resolve())
