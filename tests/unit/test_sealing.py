"""Sealing (orl.schemas.sealing) with the real key store (orl.connectors.key_store): every event that
names a session round-trips sealed, a forgotten session's payloads raise PayloadForgotten with the
clear envelope, tampering is caught, and forgetting leaves no key byte in the key store's file."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from orl.connectors.key_store import CACHE_CHECK_S, KeyStore
from orl.pipeline.history.namespace_io import envelope_head, envelope_keys, with_namespace
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.registry import PURE_PROCESSORS
from orl.pipeline.runtime.memory_runner import MemoryRunner
from orl.schemas.codec import FORGOTTEN, Codec, decode_or_forgotten, install_data_keys, payload_forgotten
from orl.schemas.errors import EventDecodeError
from orl.schemas.ids import side_session
from orl.schemas.registry import default_registry
from orl.schemas.sealing import (
    PayloadForgotten,
    UnknownDataKey,
    is_sealed,
    open_blob,
    seal_blob,
)
from orl.schemas.topics import topic_for_event

from tests.unit.event_examples import EXAMPLES, SESSION_ID, example_event
from tests.unit.pipeline_streams import Conversation

CANARY = "canary-7d1e5b-the-users-secret"


@pytest.fixture
def keys(tmp_path: Path) -> KeyStore:
    store = KeyStore(tmp_path / "keys.db")
    yield store
    store.close()


def _codec(keys: KeyStore | None) -> Codec:
    return Codec(default_registry(), keys)


def test_every_event_type_round_trips_sealed_and_hides_its_text(keys: KeyStore) -> None:
    codec, clear = _codec(keys), _codec(None)
    for event_type in EXAMPLES:
        event = example_event(event_type)
        data = codec.encode(event)
        if event["envelope"].get("session_id"):
            assert is_sealed(data), event_type
            assert codec.decode(data) == clear.decode(clear.encode(event)), event_type
            assert codec.event_type_of(data) == event_type
        else:
            assert not is_sealed(data), f"{event_type} names no session: written in clear"


def test_request_text_is_not_in_the_sealed_bytes(keys: KeyStore) -> None:
    event = example_event("RequestReceived")
    event["messages_json"] = event["messages_json"].replace("Run the tests", CANARY)
    sealed = _codec(keys).encode(event)
    assert CANARY.encode() not in sealed
    assert CANARY.encode() in _codec(None).encode(event)
    assert SESSION_ID.encode() in sealed  # the envelope stays in clear


def test_sealing_is_deterministic_so_a_rewrite_is_the_same_bytes(keys: KeyStore) -> None:
    # a stage restarted after kill -9, a second worker and a replay must write byte-identical events
    first, second = example_event("RequestReceived"), example_event("RequestReceived")
    codec = _codec(keys)
    assert codec.encode(first) == codec.encode(second)
    second["messages_json"] = second["messages_json"].replace("Run the tests", CANARY)
    assert codec.encode(first) != codec.encode(second)
    assert seal_blob(b"state", "s1", "changelog:judge", keys) == seal_blob(
        b"state", "s1", "changelog:judge", keys
    )
    other = KeyStore(keys.path.parent / "other.db")  # another deployment: its own key, other bytes
    try:
        assert _codec(other).encode(first) != codec.encode(first)
    finally:
        other.close()


def test_the_clear_envelope_reads_without_the_key(keys: KeyStore) -> None:
    event = example_event("JudgeVoteCast")
    sealed = _codec(keys).encode(event)
    head = envelope_head(sealed)
    assert head is not None and head.sealed
    assert head.event_type == "JudgeVoteCast"
    assert head.event_id == event["envelope"]["event_id"]
    assert envelope_keys(sealed) == envelope_keys(_codec(None).encode(event))
    moved = with_namespace(sealed, head, "replay-1")  # a replay rewrites the namespace in place
    assert _codec(keys).decode(moved)["envelope"]["namespace"] == "replay-1"


def test_forgotten_payload_says_so_and_keeps_the_envelope(keys: KeyStore) -> None:
    codec = _codec(keys)
    event = example_event("ResponseGenerated")
    data = codec.encode(event)
    [forgotten] = keys.forget_sessions([SESSION_ID])
    assert forgotten.keys_destroyed == 1
    with pytest.raises(PayloadForgotten) as caught:
        codec.decode(data)
    assert caught.value.session_id == SESSION_ID
    assert caught.value.envelope == event["envelope"]
    assert keys.forgotten_sessions() == {SESSION_ID}


def test_a_running_process_sees_another_process_forget(tmp_path: Path) -> None:
    writer, forgetter = KeyStore(tmp_path / "keys.db"), KeyStore(tmp_path / "keys.db")
    codec = _codec(writer)
    data = codec.encode(example_event("NextStateObserved"))
    assert codec.decode(data)  # cached the key
    forgetter.forget_sessions([SESSION_ID])
    time.sleep(CACHE_CHECK_S + 0.05)  # a process looks at the store's version at most this often
    with pytest.raises(PayloadForgotten):
        codec.decode(data)
    fresh = codec.encode(example_event("NextStateObserved"))  # what the session says next gets a new key
    assert codec.decode(fresh)["envelope"]["session_id"] == SESSION_ID
    writer.close()
    forgetter.close()


def test_tampered_or_moved_payload_does_not_open(keys: KeyStore) -> None:
    codec = _codec(keys)
    data = bytearray(codec.encode(example_event("RequestReceived")))
    data[-1] ^= 1
    with pytest.raises(EventDecodeError, match="does not authenticate"):
        codec.decode(bytes(data))


def test_a_key_the_store_never_had_is_not_forgotten(tmp_path: Path, keys: KeyStore) -> None:
    data = _codec(keys).encode(example_event("RequestReceived"))
    other = KeyStore(tmp_path / "other.db")
    with pytest.raises(UnknownDataKey):
        _codec(other).decode(data)
    with pytest.raises(EventDecodeError, match="no key store"):
        _codec(None).decode(data)
    other.close()


def test_decode_or_forgotten_and_payload_forgotten(keys: KeyStore) -> None:
    install_data_keys(keys)
    try:
        event = example_event("SampleReady")
        data = _codec(keys).encode(event)
        assert not payload_forgotten(data)
        keys.forget_sessions([SESSION_ID])
        assert payload_forgotten(data)
        assert decode_or_forgotten(data) == {"envelope": event["envelope"], FORGOTTEN: True}
    finally:
        install_data_keys(None)


def test_blobs_seal_and_forget(keys: KeyStore) -> None:
    sealed = seal_blob(CANARY.encode(), "s1", "changelog:judge", keys)
    assert CANARY.encode() not in sealed
    assert open_blob(sealed, "s1", "changelog:judge", keys) == CANARY.encode()
    with pytest.raises(EventDecodeError):
        open_blob(sealed, "s1", "changelog:other", keys)  # bound to its purpose
    keys.forget_sessions(["s1"])
    with pytest.raises(PayloadForgotten):
        open_blob(sealed, "s1", "changelog:judge", keys)


def test_forgetting_leaves_no_key_bytes_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "keys.db"
    keys = KeyStore(path)
    live = [keys.key_for_writing(f"s{i}")[1] for i in range(50)]
    keys.assign_tenant("s3", "tenant-a")
    keys.assign_tenant("s4", "tenant-a")
    assert all(key in path.read_bytes() for key in live)
    forgotten = keys.forget_tenant("tenant-a")
    assert [f.session_id for f in forgotten] == ["s3", "s4"]
    content = path.read_bytes()
    assert live[3] not in content and live[4] not in content
    assert all(key in content for i, key in enumerate(live) if i not in (3, 4))
    assert not list(tmp_path.glob("keys.db-*"))  # no journal or WAL keeps old pages
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    keys.close()


def test_one_live_key_per_session_across_stores(tmp_path: Path) -> None:
    first, second = KeyStore(tmp_path / "keys.db"), KeyStore(tmp_path / "keys.db")
    assert first.key_for_writing("s") == second.key_for_writing("s")
    first.close()
    second.close()


def test_forgetting_a_session_forgets_its_side_sessions(keys: KeyStore) -> None:
    """The judge's calls about a session are recorded in its side session (orl.schemas.ids.side_session)."""
    codec = _codec(keys)
    judged = example_event("RequestReceived")
    judged["envelope"]["session_id"] = side_session(SESSION_ID, "judge")
    own, side = codec.encode(example_event("RequestReceived")), codec.encode(judged)
    other = example_event("RequestReceived")
    other["envelope"]["session_id"] = SESSION_ID + "x/judge"  # a prefix is not a side session
    unrelated = codec.encode(other)
    [forgotten] = keys.forget_sessions([SESSION_ID])
    assert forgotten.keys_destroyed == 2
    for data in (own, side):
        with pytest.raises(PayloadForgotten):
            codec.decode(data)
    assert codec.decode(unrelated)["envelope"]["session_id"] == SESSION_ID + "x/judge"


def test_a_forgotten_sessions_state_is_dropped_not_carried_on(keys: KeyStore) -> None:
    """A processor holding a session's state in memory when it is forgotten drops it at the next
    tick (nothing is written again under a new key), and a later event of the session starts from none."""
    runner = MemoryRunner([PURE_PROCESSORS["turn_linker"]], PipelineConfig())
    chat = Conversation("kept")
    chat.say(f"My code is {CANARY}")
    chat.turn("Noted.")
    for event in chat.events:
        runner.feed(topic_for_event(event["envelope"]["event_type"]), event)
    states = runner.states["turn_linker"]
    assert "kept" in states
    install_data_keys(keys)
    try:
        keys.key_for_writing("kept")
        keys.forget_sessions(["kept"])
        assert runner.tick(PURE_PROCESSORS["turn_linker"], chat.tick()) == []
        assert "kept" not in states
        host = runner.hosts["turn_linker"]
        assert host.forgotten("kept") and not host.forgotten("other")
    finally:
        install_data_keys(None)


def test_forget_finds_a_named_tenants_sessions_by_name_and_a_client_keys_by_the_key(keys: KeyStore) -> None:
    from orl.schemas.errors import ConfigError
    from orl.serving.tenancy import key_id

    from orl.forget import ForgetSettings, _sessions

    alice_old, alice_new, plain = key_id(b"alice-old"), key_id(b"alice-new"), key_id(b"plain-key")
    keys.name_tenant(alice_old, "alice")
    keys.name_tenant(alice_new, "alice")  # alice's key was replaced: both keys' sessions are hers
    for session, owner in (("a1", alice_old), ("a2", alice_new), ("p1", plain)):
        keys.assign_tenant(session, owner)
    assert keys.tenant_names() == {alice_old: "alice", alice_new: "alice"}
    assert _sessions(ForgetSettings(tenant="alice"), keys) == (["a1", "a2"], "alice")
    assert _sessions(ForgetSettings(client_key="plain-key"), keys) == (["p1"], plain)
    assert _sessions(ForgetSettings(session=("p1", "a1")), keys) == (["a1", "p1"], None)
    with pytest.raises(ConfigError, match="no tenant named 'bob' .*named tenants: alice"):
        _sessions(ForgetSettings(tenant="bob"), keys)
    with pytest.raises(ConfigError, match="exactly one of"):
        _sessions(ForgetSettings(tenant="alice", session=("a1",)), keys)
    with pytest.raises(ConfigError, match="no session opened by that client key"):
        _sessions(ForgetSettings(client_key="unknown-key"), keys)
