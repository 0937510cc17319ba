"""Small administrative commands: create topics, prepare the base model, show settings, list the events
the servers' spools set aside (reads the `spool-*.db` files in --data-dir)."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from orl.connectors.settings import ConnectionSettings, masked

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdminSettings(ConnectionSettings):
    pass


def print_settings(settings: AdminSettings) -> int:
    print(json.dumps(masked(settings), indent=2))
    return 0


def prepare_model(settings: AdminSettings) -> int:
    from orl.connectors.model_files import resolve_model

    folder = resolve_model(settings.model, settings.model_cache_dir)
    print(f"model ready: {folder}")
    return 0


def create_topics(settings: AdminSettings) -> int:
    from orl.connectors.event_log.catalog import create_catalog_topics
    from orl.connectors.event_log.factory import open_event_log

    async def run() -> None:
        async with open_event_log(settings.effective_log_url(), settings.topic_policy()) as log:
            for name in await create_catalog_topics(log, settings.namespace, settings.topic_partitions):
                print(f"topic ready: {name} ({settings.topic_partitions} partitions)")

    asyncio.run(run())
    return 0


def list_set_aside(settings: AdminSettings) -> int:
    """`orl spool`: every event a server's spool set aside because the log refused it for good."""
    from datetime import UTC, datetime

    from orl.serving.spool import EventSpool

    paths = sorted(settings.data_dir.glob("spool-*.db"))
    if not paths:
        print(f"no server spool in {settings.data_dir}")
    for path in paths:
        spool = EventSpool(path)
        try:
            events, depth = spool.set_aside_events(), spool.depth()
        finally:
            spool.close()
        print(f"{path}: {depth} event(s) waiting for the log, {len(events)} set aside")
        for event in events:
            when = datetime.fromtimestamp(event.set_aside_at_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
            print(f"  #{event.seq} {event.topic} {len(event.value)} bytes, set aside {when}: {event.reason}")
    return 0
