"""Archive -> restore gives the same bytes; archiving is incremental; a replay can read the archive; export."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.pipeline.history.archive import archive_namespace, archived_topics, restore
from orl.pipeline.history.export import export_namespace
from orl.pipeline.history.namespace_io import NamespaceWriter, namespace_topics, partition_count, read_batches
from orl.pipeline.history.replay import REUSE_TOPICS, ReplayPlan, archive_source, replay
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.schemas.events import make_event

from tests.integration.test_replay import (
    SOURCE,
    by_turn,
    comparable,
    conversations,
    events_of,
    record,
    recorded_settings,
)

Snapshot = dict[str, list[tuple[int, int, bytes | None, bytes]]]


async def snapshot(log: EventLog, namespace: str) -> Snapshot:
    topics: Snapshot = {}
    for topic in namespace_topics(namespace):
        if await partition_count(log, topic) is None:
            continue
        rows = topics.setdefault(topic, [])
        async for records in read_batches(log, topic):
            rows.extend((r.partition, r.offset, r.key, r.value) for r in records)
    return topics


def test_archive_then_restore_gives_identical_bytes(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")

    async def scenario() -> None:
        async with open_event_log(f"sqlite:///{tmp_path / 'a.db'}") as log:
            await record(log, recorded_settings(tmp_path))
            first = await archive_namespace(log, store, SOURCE, segment_records=7)
            requests = next(i for i in archived_topics(store, SOURCE) if i.topic == f"{SOURCE}.requests")
            assert first.records > 0 and len(requests.segments) == 2  # 12 requests, 7 per segment
            again = await archive_namespace(log, store, SOURCE)
            assert again.records == 0 and again.segments == 0  # nothing new: nothing written
            writer = NamespaceWriter(log, SOURCE)
            await writer.prepare()
            await writer.write(conversations(SOURCE, 5)[-8:])  # new traffic (another session's events)
            more = await archive_namespace(log, store, SOURCE)
            assert 0 < more.records < first.records
            original = await snapshot(log, SOURCE)
        async with open_event_log(f"sqlite:///{tmp_path / 'b.db'}") as fresh:
            assert await restore(store, SOURCE, fresh) == sum(len(rows) for rows in original.values())
            assert await snapshot(fresh, SOURCE) == original
            assert await restore(store, SOURCE, fresh) == 0  # a re-run appends nothing
        assert {i.topic for i in archived_topics(store, SOURCE)} == set(original)

    asyncio.run(scenario())


def test_a_replay_from_the_archive_reproduces_the_samples(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "objects")

    async def scenario() -> None:
        async with open_event_log(f"sqlite:///{tmp_path / 'a.db'}") as log:
            settings = recorded_settings(tmp_path)
            await record(log, settings, sessions=2)
            await archive_namespace(log, store, SOURCE)
            original = by_turn(await events_of(log, SOURCE, "samples"))
        async with open_event_log(f"sqlite:///{tmp_path / 'b.db'}") as other:  # the broker lost it all
            target = recorded_settings(tmp_path, namespace="fromarchive")
            plan = ReplayPlan("fromarchive", "reuse", f"archive:{SOURCE}", "v1")
            batches = archive_source(store, SOURCE, REUSE_TOPICS)
            await replay(other, plan, batches, build_stages(target), pipeline_config(target))
            replayed = by_turn(await events_of(other, "fromarchive", "samples"))
        assert replayed.keys() == original.keys()
        assert all(comparable(replayed[t]) == comparable(original[t]) for t in original)

    asyncio.run(scenario())


def test_export_writes_one_decoded_event_per_line(tmp_path: Path) -> None:
    out_path = tmp_path / "export.jsonl"

    async def scenario() -> int:
        async with open_event_log(f"sqlite:///{tmp_path / 'a.db'}") as log:
            writer = NamespaceWriter(log, SOURCE)
            await writer.prepare()
            await writer.write(conversations(SOURCE, 1))
            dead = make_event(
                "DeadLettered", namespace=SOURCE, producer="test", occurred_at_ms=1, id_parts=[1],
                source_topic=f"{SOURCE}.requests", source_partition=0, source_offset=0,
                original_bytes=b"\x00\xffbad", error="bad marker",
            )  # fmt: skip
            from orl.connectors.event_log.base import OutgoingRecord, TopicSpec
            from orl.schemas.codec import encode

            await log.create_topics([TopicSpec(f"{SOURCE}.requests.dlq")])
            await log.append(f"{SOURCE}.requests.dlq", OutgoingRecord(encode(dead)))
            with out_path.open("w") as out:
                return await export_namespace(log, SOURCE, out)

    lines = asyncio.run(scenario())
    rows = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert len(rows) == lines == len(conversations(SOURCE, 1)) + 1
    assert rows[0]["event"]["envelope"]["event_type"] == "RequestReceived"
    assert base64.b64decode(rows[-1]["event"]["original_bytes"]) == b"\x00\xffbad"
