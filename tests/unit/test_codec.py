"""The event codec: round trips, encode errors that name the field, and decode errors for bad bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from orl.schemas.codec import HEADER_LEN, MARKER, decode, encode, event_type_of
from orl.schemas.errors import EventDecodeError, EventEncodeError, UnknownEventTypeError
from orl.schemas.events import EVENT_TYPES
from orl.schemas.registry import default_registry

from tests.unit.event_examples import EXAMPLES, example_event, response_generated


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_every_event_type_round_trips(event_type: str) -> None:
    event = example_event(event_type)
    data = encode(event)
    assert decode(data) == event
    assert event_type_of(data) == event_type


def test_examples_cover_every_event_type() -> None:
    assert set(EXAMPLES) == set(EVENT_TYPES) == set(default_registry().event_types)


def test_wire_format_is_single_object_encoding() -> None:
    data = encode(example_event("SessionClosed"))
    assert data[:2] == b"\xc3\x01"
    assert data[2:HEADER_LEN] == default_registry().current("SessionClosed").fingerprint


def test_encoding_is_deterministic() -> None:
    assert encode(response_generated()) == encode(response_generated())


def test_a_1kb_response_is_about_1kb() -> None:
    assert 800 <= len(encode(response_generated())) <= 1200


def test_omitted_nullable_fields_decode_as_null() -> None:
    event = example_event("SessionClosed")
    del event["last_turn_id"]
    assert decode(encode(event))["last_turn_id"] is None


def test_occurred_at_stays_epoch_millis() -> None:
    event = example_event("SessionClosed")
    assert decode(encode(event))["envelope"]["occurred_at"] == event["envelope"]["occurred_at"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda e: e["response_logprobs"].__setitem__(3, "x"),
            "ResponseGenerated.response_logprobs[3]: expected float, got 'x'",
        ),
        (lambda e: e.pop("model"), "ResponseGenerated.model: missing"),
        (
            lambda e: e["sampling"].__setitem__("max_tokens", 2**40),
            "ResponseGenerated.sampling.max_tokens: expected int",
        ),
        (
            lambda e: e["sampling"].__setitem__("seed", "7"),
            "ResponseGenerated.sampling.seed: expected long, got '7'",
        ),
        (
            lambda e: e["policy_spans"][1].pop("start_token"),
            "ResponseGenerated.policy_spans[1].start_token: missing",
        ),
        (
            lambda e: e.__setitem__("prompt_tokens", True),
            "ResponseGenerated.prompt_tokens: expected int, got True",
        ),
        (
            lambda e: e.__setitem__("prompt_token_ids", "1 2 3"),
            "ResponseGenerated.prompt_token_ids: expected array<int>",
        ),
        (
            lambda e: e["envelope"].__setitem__("producer", None),
            "ResponseGenerated.envelope.producer: expected string",
        ),
        (
            lambda e: e.__setitem__("respons_text", "typo"),
            "ResponseGenerated: unknown field(s) ['respons_text']",
        ),
    ],
)
def test_encode_error_names_the_field(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    event = response_generated()
    mutate(event)
    with pytest.raises(EventEncodeError) as error:
        encode(event)
    assert message in str(error.value)


def test_encode_error_inside_an_optional_record() -> None:
    event = example_event("NextStateObserved")
    event["outcome"]["exit_code"] = "1"
    with pytest.raises(
        EventEncodeError, match=r"NextStateObserved\.outcome\.exit_code: expected int, got '1'"
    ):
        encode(event)


def test_float_arrays_carry_32_bit_floats() -> None:
    event = response_generated()
    event["response_logprobs"][0] = -0.1
    assert decode(encode(event))["response_logprobs"][0] == pytest.approx(-0.1, rel=1e-7)


def test_encode_unknown_event_type() -> None:
    event = example_event("SessionClosed")
    event["envelope"]["event_type"] = "SessionExploded"
    with pytest.raises(UnknownEventTypeError, match="unknown event_type 'SessionExploded'.*SessionClosed"):
        encode(event)


@pytest.mark.parametrize("event", [None, [], {}, {"envelope": None}, {"envelope": {"event_type": 3}}])
def test_encode_without_envelope(event: object) -> None:
    with pytest.raises(EventEncodeError):
        encode(event)  # type: ignore[arg-type]


def test_decode_too_short() -> None:
    with pytest.raises(EventDecodeError, match="too short"):
        decode(b"\xc3\x01\x00")


def test_decode_bad_marker() -> None:
    with pytest.raises(EventDecodeError, match="bad marker"):
        decode(b"{" + encode(example_event("SessionClosed"))[1:])


def test_decode_unknown_fingerprint() -> None:
    data = encode(example_event("SessionClosed"))
    with pytest.raises(EventDecodeError, match="unknown writer schema fingerprint"):
        decode(MARKER + bytes(8) + data[HEADER_LEN:])
    with pytest.raises(EventDecodeError, match="unknown writer schema fingerprint"):
        event_type_of(MARKER + bytes(8))


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_decode_every_truncation_fails_cleanly(event_type: str) -> None:
    data = encode(example_event(event_type))
    for length in range(len(data)):
        with pytest.raises(EventDecodeError):
            decode(data[:length])


def test_decode_trailing_bytes() -> None:
    with pytest.raises(EventDecodeError, match="1 trailing bytes"):
        decode(encode(example_event("SessionClosed")) + b"\x00")


def test_decode_not_bytes() -> None:
    with pytest.raises(EventDecodeError, match="expected bytes"):
        decode("c301")  # type: ignore[arg-type]


def test_decode_accepts_bytearray_and_memoryview() -> None:
    event = example_event("HintSelected")
    data = encode(event)
    assert decode(bytearray(data)) == decode(memoryview(data)) == event


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_only_ever_raise_event_decode_error(data: bytes) -> None:
    with pytest.raises(EventDecodeError):
        decode(data)


_HEADERS = [MARKER + version.fingerprint for version in default_registry().writers()]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(_HEADERS), st.binary(max_size=300))
def test_random_bodies_decode_or_raise_event_decode_error(header: bytes, body: bytes) -> None:
    try:
        decoded = decode(header + body)
    except EventDecodeError:
        return
    assert isinstance(decoded, dict) and "envelope" in decoded


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(EVENT_TYPES), st.data())
def test_corrupted_events_decode_or_raise_event_decode_error(event_type: str, data: st.DataObject) -> None:
    encoded = bytearray(encode(example_event(event_type)))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(HEADER_LEN, len(encoded) - 1))
        encoded[position] = data.draw(st.integers(0, 255))
    try:
        decoded = decode(bytes(encoded))
    except EventDecodeError:
        return
    assert isinstance(decoded, dict) and "envelope" in decoded
