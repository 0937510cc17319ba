"""The processors' state codecs: frozen dataclasses to changelog bytes and back, and the dict
layouts stored before the states were typed (2026-12-02) still read."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pytest
from orl.pipeline.processors.sample_builder import SAMPLE_BUILDER
from orl.pipeline.processors.sample_inputs import InlineArrays, PackedArrays, SessionSamples
from orl.pipeline.processors.state_codec import evolved, frozen_state
from orl.pipeline.processors.vote_collection import DECIDED, VoteSession
from orl.pipeline.processors.vote_tally import VOTE_TALLY


@dataclass(frozen=True)
class Leaf:
    name: str
    values: Sequence[float]


@dataclass(frozen=True)
class Other:
    code: int


@dataclass(frozen=True)
class Root:
    id: str
    pairs: tuple[tuple[int, str], ...] = ()
    leaves: Mapping[str, Leaf] = field(default_factory=dict)
    either: Leaf | Other | None = None
    added_later: bool = False


def test_a_nested_frozen_value_comes_back_equal() -> None:
    codec = frozen_state(Root)
    value = Root("r", ((2, "b"), (1, "a")), {"x": Leaf("x", [0.5, -1.0])}, Other(7))
    assert codec.from_bytes(codec.to_bytes(value)) == value
    assert codec.from_bytes(codec.to_bytes(Root("s", either=Leaf("y", [])))).either == Leaf("y", [])
    assert json.loads(codec.to_bytes(value))["pairs"] == [[2, "b"], [1, "a"]]


def test_a_field_missing_from_a_stored_value_takes_its_default() -> None:
    assert frozen_state(Root).from_bytes(b'{"id": "old"}') == Root("old")


def test_a_union_member_is_told_by_its_field_names_and_an_unknown_one_is_refused() -> None:
    with pytest.raises(ValueError, match="none of"):
        frozen_state(Root).from_bytes(b'{"id": "r", "either": {"what": 1}}')


def test_a_sample_state_stored_by_the_dict_state_reads_the_same() -> None:
    """The layout of the last dict state: a response's arrays inline in its record, packed (with
    "problem") or as lists (before 2026-11-22, without "problem")."""
    response = {
        "event_id": "r1",
        "occurred_at_ms": 5,
        "temperature": 0.7,
        "policy_version": 3,
        "off_policy": False,
    }
    packed = {**response, "token_ids_json": "[[1,2],[3]]", "logprobs_f64": "AAAAAAAA4L8=", "problem": None}
    lists = {**response, "prompt_token_ids": [1, 2], "response_token_ids": [3], "response_logprobs": [-0.5]}
    for stored, arrays in (
        (packed, PackedArrays("[[1,2],[3]]", "AAAAAAAA4L8=")),
        (lists, InlineArrays([1, 2], [3], [-0.5])),
    ):
        turn = {"index": 0, "kind": "main", "request_event_id": "q1", "response": stored, "next_states": [[9, "n1"]],
                "next_state_event_id": "n1", "reward": None, "hint": None, "teacher": None, "decided": False}  # fmt: skip
        state = {"namespace": "ns", "session_id": "s", "seen": ["q1", "r1"], "turns": {"t0": turn},
                 "request_turns": {"q1": "t0"}, "waiting_responses": {}, "ready_count": 0, "closed": None,
                 "finalized": False, "group": None}  # fmt: skip
        restored: SessionSamples = SAMPLE_BUILDER.state_codec.from_bytes(json.dumps(state).encode())
        response_record = restored.turns["t0"].response
        assert (
            response_record is not None
            and response_record.arrays == arrays
            and response_record.problem is None
        )
        assert restored.turns["t0"].next_states == ((9, "n1"),) and restored.seen == ("q1", "r1")
        again = SAMPLE_BUILDER.state_codec.from_bytes(SAMPLE_BUILDER.state_codec.to_bytes(restored))
        assert again == restored


def test_a_vote_state_with_a_decided_marker_reads_as_decided() -> None:
    stored = {"namespace": "ns", "session_id": "s", "seen": [], "last_activity_ms": 3,
              "judgements": {"t|n|j|c": {"decided": True}}}  # fmt: skip
    restored: VoteSession = VOTE_TALLY.state_codec.from_bytes(json.dumps(stored).encode())
    assert restored.judgements == {"t|n|j|c": DECIDED}


def test_evolved_changes_only_the_named_fields_and_refuses_a_name_that_is_no_field() -> None:
    before = Root("r", ((1, "a"),))
    after = evolved(before, added_later=True)
    assert after == Root("r", ((1, "a"),), added_later=True) and before.added_later is False
    with pytest.raises(TypeError, match="no field"):
        evolved(before, added_latre=True)
