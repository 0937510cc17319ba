"""`orl export --format parquet`: a namespace as Parquet files, one per event type, typed columns.

`<folder>/<EventType>.parquet` has the record's position (`topic`, `partition`, `offset`,
`timestamp_ms`) and then the event's own fields, typed from its current Avro schema: records become
structs (the envelope is one), arrays lists, `["null", T]` a nullable T, bytes binary, and the
envelope's `occurred_at` (timestamp-millis) a UTC timestamp. Events of older schema versions are
upcast by the codec first, so one event type has one table schema; an event whose payload was
forgotten (`orl forget`) is left out. Rows are written in row groups
of up to ROW_GROUP events; each file is written as `<name>.part` and renamed when complete.
Needs pyarrow (`.venv/bin/pip install -e '.[parquet]'` in the repository, or `pip install pyarrow`).
Reads: the catalog topics of the namespace (and their dead-letter topics with `dead_letters`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orl.connectors.event_log.base import EventLog
from orl.pipeline.history.namespace_io import catalog_topics, read_batches
from orl.schemas.codec import decode, event_type_of, payload_forgotten
from orl.schemas.errors import ConfigError
from orl.schemas.registry import default_registry
from orl.schemas.schema_forms import Schema
from orl.schemas.topics import dlq_topic

logger = logging.getLogger(__name__)

ROW_GROUP = 5000
POSITION_COLUMNS = ("topic", "partition", "offset", "timestamp_ms")


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise ConfigError(
            "Parquet export needs pyarrow: .venv/bin/pip install -e '.[parquet]' (or pip install pyarrow)"
        ) from error
    return pyarrow


def arrow_type(schema: Schema, named: dict[str, Any]) -> tuple[Any, bool]:
    """(Arrow type, nullable) of a self-contained Avro schema; `named` collects named types by name."""
    pa = _pyarrow()
    if isinstance(schema, list):
        branches = [branch for branch in schema if branch != "null"]
        if len(branches) != 1:
            raise ValueError(f"no Arrow type for a union of several types: {schema}")
        return arrow_type(branches[0], named)[0], "null" in schema
    if isinstance(schema, str):
        primitives = {
            "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
            "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(), "null": pa.null(),
        }  # fmt: skip
        if schema in primitives:
            return primitives[schema], schema == "null"
        return named[schema], False
    kind = schema["type"]
    if schema.get("logicalType") == "timestamp-millis":
        return pa.timestamp("ms", tz="UTC"), False
    if kind == "record":
        fields = []
        for field in schema["fields"]:
            field_type, nullable = arrow_type(field["type"], named)
            fields.append(pa.field(field["name"], field_type, nullable=nullable))
        named[schema["name"]] = pa.struct(fields)
        return named[schema["name"]], False
    if kind == "array":
        item_type, nullable = arrow_type(schema["items"], named)
        return pa.list_(pa.field("item", item_type, nullable=nullable)), False
    if kind == "map":
        value_type, _ = arrow_type(schema["values"], named)
        return pa.map_(pa.string(), value_type), False
    if kind == "enum":
        return pa.string(), False
    if kind == "fixed":
        named[schema["name"]] = pa.binary(schema["size"])
        return named[schema["name"]], False
    return arrow_type(kind, named)


def table_schema(event_type: str) -> Any:
    """The Arrow schema of an event type's Parquet file: position columns, then the event's fields."""
    pa = _pyarrow()
    event_struct, _ = arrow_type(default_registry().current(event_type).schema, {})
    position = [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp_ms", pa.int64(), nullable=False),
    ]
    return pa.schema(position + list(event_struct))


class _TypeFile:
    """One event type's Parquet file, written in row groups."""

    def __init__(self, folder: Path, event_type: str) -> None:
        pa = _pyarrow()
        self.path = folder / f"{event_type}.parquet"
        self.part = folder / f"{event_type}.parquet.part"
        self.schema = table_schema(event_type)
        self.writer = pa.parquet.ParquetWriter(self.part, self.schema)
        self.rows: list[dict[str, Any]] = []
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if len(self.rows) >= ROW_GROUP:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(_pyarrow().Table.from_pylist(self.rows, schema=self.schema))
            self.count += len(self.rows)
            self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.part.replace(self.path)


async def export_parquet(
    log: EventLog,
    namespace: str,
    folder: Path,
    dead_letters: bool = True,
    progress: Callable[[int], None] = lambda n: None,
) -> dict[str, int]:
    """Write every event of the namespace to `folder`; returns the rows written per event type."""
    _pyarrow()
    folder.mkdir(parents=True, exist_ok=True)
    topics = catalog_topics(namespace)
    if dead_letters:
        topics += [dlq_topic(t) for t in catalog_topics(namespace)]
    files: dict[str, _TypeFile] = {}
    forgotten = 0
    try:
        for topic in topics:
            async for records in read_batches(log, topic):
                for r in records:
                    if payload_forgotten(r.value):  # `orl forget`: no payload to write
                        forgotten += 1
                        continue
                    event_type = event_type_of(r.value)
                    if event_type not in files:
                        files[event_type] = _TypeFile(folder, event_type)
                    position = {"topic": r.topic, "partition": r.partition, "offset": r.offset}
                    files[event_type].add({**position, "timestamp_ms": r.timestamp_ms, **decode(r.value)})
                progress(len(records))
    except BaseException:
        for file in files.values():  # no partial file is left behind
            file.writer.close()
            file.part.unlink(missing_ok=True)
        raise
    for file in files.values():
        file.close()
    if forgotten:
        logger.info("left out %d events whose payloads were forgotten", forgotten)
    return {event_type: file.count for event_type, file in sorted(files.items())}
