"""`orl export --format parquet`: one typed Parquet file per event type, holding every event of the namespace."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from orl.connectors.event_log.base import OutgoingRecord, TopicSpec
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.history.namespace_io import catalog_topics, read_batches
from orl.pipeline.history.parquet_export import export_parquet
from orl.schemas.codec import decode, encode
from orl.schemas.errors import ConfigError
from orl.schemas.events import make_event

from orl.cli import main
from orl.history import ExportSettings, run_export
from tests.integration.test_replay import SOURCE, record, recorded_settings


def ms(value: Any) -> Any:
    """Arrow's timestamps back to the events' epoch milliseconds, anywhere in a row."""
    if isinstance(value, datetime):
        return round(value.timestamp() * 1000)
    if isinstance(value, dict):
        return {k: ms(v) for k, v in value.items()}
    if isinstance(value, list):
        return [ms(v) for v in value]
    return value


def test_every_event_lands_in_its_type_file_with_typed_columns(tmp_path: Path) -> None:
    folder = tmp_path / "export"

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, int]]:
        async with open_event_log(f"sqlite:///{tmp_path / 'log.db'}") as log:
            await record(log, recorded_settings(tmp_path), sessions=2)
            dead = make_event(
                "DeadLettered", namespace=SOURCE, producer="test", occurred_at_ms=1, id_parts=[1],
                source_topic=f"{SOURCE}.requests", source_partition=0, source_offset=0,
                original_bytes=b"\x00\xffbad", error="bad marker",
            )  # fmt: skip
            await log.create_topics([TopicSpec(f"{SOURCE}.requests.dlq")])
            await log.append(f"{SOURCE}.requests.dlq", OutgoingRecord(encode(dead)))
            events = []
            for topic in catalog_topics(SOURCE) + [f"{SOURCE}.requests.dlq"]:
                async for records in read_batches(log, topic):
                    events += [{"topic": r.topic, "offset": r.offset, **decode(r.value)} for r in records]
            return events, await export_parquet(log, SOURCE, folder)

    events, written = asyncio.run(scenario())
    by_type = Counter(e["envelope"]["event_type"] for e in events)
    assert written == dict(sorted(by_type.items()))
    assert {"RequestReceived", "SampleReady", "JudgeVoteCast", "DeadLettered"} <= set(written)
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{t}.parquet" for t in by_type)

    responses = pq.read_table(folder / "ResponseGenerated.parquet")
    assert responses.schema.field("response_token_ids").type.value_type == pa.int32()
    assert responses.schema.field("envelope").type.field("occurred_at").type == pa.timestamp("ms", tz="UTC")
    for event_type in by_type:
        rows = [ms(row) for row in pq.read_table(folder / f"{event_type}.parquet").to_pylist()]
        expected = [e for e in events if e["envelope"]["event_type"] == event_type]
        positions_kept = [
            {k: v for k, v in row.items() if k not in ("partition", "timestamp_ms")} for row in rows
        ]
        assert positions_kept == expected, event_type  # every value back, in offset order
    dead_row = pq.read_table(folder / "DeadLettered.parquet").to_pylist()[0]
    assert dead_row["original_bytes"] == b"\x00\xffbad"


def test_parquet_needs_a_folder_and_a_known_format(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="writes a folder"):
        run_export(ExportSettings(data_dir=tmp_path, format="parquet"))
    assert main(["export", f"--data-dir={tmp_path}", "--format=csv"]) == 1
    assert "--format: 'csv' is not one of jsonl | parquet" in capsys.readouterr().err
