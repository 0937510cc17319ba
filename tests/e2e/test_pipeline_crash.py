"""kill -9 of `orl pipeline` mid-stream, then a restart: the samples are exactly those of an uninterrupted run.

Both runs read the same recorded stream (serving's events for many two-turn sessions whose second
request carries the user's verdict on the first answer) from their own SQLite log; judging uses the
demo's rule judge, so no model is needed. Outputs, state and input offsets commit in one SQLite
transaction, so the crash may lose nothing and duplicate nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orl.connectors.event_log.base import OutgoingRecord
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.event_log.reading import read_to_end
from orl.schemas.codec import encode
from orl.schemas.topics import topic_for_event, topic_name

from tests.unit.pipeline_streams import NAMESPACE, Conversation

SESSIONS = 3000  # long enough that the pipeline is still at work when it is killed


def recorded_stream() -> list[dict]:
    events: list[dict] = []
    for i in range(SESSIONS):
        conversation = Conversation(f"s{i:04d}")
        conversation.say(f"Question number {i}?")
        conversation.turn("A long answer " * (i % 5 + 1))
        conversation.say("Thanks, that's exactly what I needed." if i % 3 else "Too long, please redo it.")
        conversation.turn("ok")
        events.extend(conversation.events)
    return events


async def write_log(path: Path, events: list[dict]) -> str:
    url = f"sqlite:///{path}"
    async with open_event_log(url) as log:
        await create_catalog_topics(log, NAMESPACE, 1)
        by_topic: dict[str, list[OutgoingRecord]] = {}
        for event in events:
            topic = topic_name(NAMESPACE, topic_for_event(event["envelope"]["event_type"]))
            record = OutgoingRecord(value=encode(event), key=event["envelope"]["session_id"].encode())
            by_topic.setdefault(topic, []).append(record)
        for topic, records in by_topic.items():
            await log.append_batch(topic, records)
    return url


async def samples(url: str, topic: str = "samples") -> list[bytes]:
    async with open_event_log(url) as log:
        return [r.value for r in await read_to_end(log, topic_name(NAMESPACE, topic))]


def start_pipeline(url: str, data_dir: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ORL_LOG_URL": url, "ORL_DATA_DIR": str(data_dir), "ORL_NAMESPACE": NAMESPACE,
           "ORL_METHOD": "binary", "ORL_JUDGE": "user_reply", "ORL_IDLE_TIMEOUT_S": "100000000"}  # fmt: skip
    log = (data_dir / "pipeline.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "orl.cli", "pipeline"], env=env, stdout=log, stderr=log)


def wait_for_samples(
    url: str, count: int, timeout_s: float = 240, topic: str = "samples", poll_s: float = 0.5
) -> list[bytes]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = asyncio.run(samples(url, topic))
        if len(found) >= count:
            return found
        time.sleep(poll_s)
    raise AssertionError(f"only {len(asyncio.run(samples(url)))} of {count} samples after {timeout_s} s")


def test_kill_9_mid_stream_changes_nothing(tmp_path: Path) -> None:
    events = recorded_stream()
    reference_dir, crash_dir = tmp_path / "reference", tmp_path / "crash"
    reference_dir.mkdir()
    crash_dir.mkdir()
    reference_url = asyncio.run(write_log(reference_dir / "log.db", events))
    crash_url = asyncio.run(write_log(crash_dir / "log.db", events))

    reference = start_pipeline(reference_url, reference_dir)
    expected = wait_for_samples(reference_url, SESSIONS)  # one decision per judged first turn
    time.sleep(2.0)
    reference.send_signal(signal.SIGTERM)
    reference.wait(timeout=30)

    victim = start_pipeline(crash_url, crash_dir)
    # Killed as soon as the first next state is written: the linker has started, the later stages
    # barely (the whole stream takes a few seconds, so waiting for a fraction of it raced the end).
    wait_for_samples(crash_url, 1, topic="next_states", poll_s=0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    partial = len(asyncio.run(samples(crash_url)))
    assert partial < SESSIONS, "the pipeline finished before the kill: make the stream longer"
    survivor = start_pipeline(crash_url, crash_dir)
    try:
        recovered = wait_for_samples(crash_url, SESSIONS)
        time.sleep(2.0)
        recovered = asyncio.run(samples(crash_url))
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(timeout=30)

    assert len(expected) == SESSIONS
    assert sorted(recovered) == sorted(expected)  # same events, byte for byte, none twice
