"""Small administrative commands: create topics, prepare the base model, show settings."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from connectors.settings import ConnectionSettings, masked

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdminSettings(ConnectionSettings):
    pass


def print_settings(settings: AdminSettings) -> int:
    print(json.dumps(masked(settings), indent=2))
    return 0


def prepare_model(settings: AdminSettings) -> int:
    from connectors.model_files import resolve_model

    folder = resolve_model(settings.model, settings.model_cache_dir)
    print(f"model ready: {folder}")
    return 0


def create_topics(settings: AdminSettings) -> int:
    from connectors.event_log.catalog import create_catalog_topics
    from connectors.event_log.factory import open_event_log

    async def run() -> None:
        async with open_event_log(settings.effective_log_url()) as log:
            for name in await create_catalog_topics(log, settings.namespace, settings.topic_partitions):
                print(f"topic ready: {name} ({settings.topic_partitions} partitions)")

    asyncio.run(run())
    return 0
