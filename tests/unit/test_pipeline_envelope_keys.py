"""Reading an event's type, session and turn from its bytes, without decoding the body."""

from __future__ import annotations

import pytest
from orl.pipeline.history.namespace_io import VOTE_TYPES, envelope_keys, vote_fields
from orl.schemas.codec import encode
from orl.schemas.registry import default_registry

from tests.unit.event_examples import EXAMPLES

ENVELOPE_LAYOUT = [
    ("event_id", "string"),
    ("event_type", "string"),
    ("schema_version", "int"),
    ("occurred_at", "long"),
    ("producer", "string"),
    ("namespace", "string"),
    ("session_id", ["null", "string"]),
    ("turn_id", ["null", "string"]),
]


@pytest.mark.parametrize("event_type", sorted(default_registry().event_types))
def test_every_current_schema_starts_with_the_envelope_layout_the_reader_assumes(event_type: str) -> None:
    envelope = default_registry().current(event_type).schema["fields"][0]
    fields = envelope["type"]["fields"]
    layout = [(f["name"], f["type"]["type"] if isinstance(f["type"], dict) else f["type"]) for f in fields]
    assert envelope["name"] == "envelope" and layout[: len(ENVELOPE_LAYOUT)] == ENVELOPE_LAYOUT


@pytest.mark.parametrize("event_type", sorted(EXAMPLES))
def test_the_keys_read_from_the_bytes_equal_the_decoded_ones(event_type: str) -> None:
    event = EXAMPLES[event_type]()
    for session_id, turn_id in (("s-1", "t-1"), (None, None), ("s-2", None)):
        event["envelope"].update(session_id=session_id, turn_id=turn_id)
        assert envelope_keys(encode(event)) == (event_type, session_id, turn_id)


@pytest.mark.parametrize("event_type", VOTE_TYPES)
def test_vote_fields_read_from_the_bytes_equal_the_decoded_ones(event_type: str) -> None:
    event = EXAMPLES[event_type]()
    for model, vote_index, kind in ((None, 0, "llm"), ("judge-model", 7, "rule"), ("m", 300, "llm")):
        event.update(model=model, model_version=model and "v2", vote_index=vote_index, judge_kind=kind)
        expected = (event_type, kind, event["judge_config_version"], vote_index)
        assert vote_fields(encode(event)) == expected


def test_vote_fields_of_another_event_type_are_none() -> None:
    assert vote_fields(encode(EXAMPLES["RequestReceived"]())) is None
