"""Small administrative commands: create topics, show settings, list the events
the servers' spools set aside (reads the `spool-*.db` files in --data-dir)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from orl.connectors.settings import ConnectionSettings, setting
from orl.schemas.errors import ConfigError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdminSettings(ConnectionSettings):
    pass


@dataclass(frozen=True)
class ShowSettings(ConnectionSettings):
    of: str = setting(
        "up", "ORL_SETTINGS_OF", "The command whose settings to show (serve, train, ...).", positional=True
    )


def print_settings(settings: ShowSettings) -> int:
    """Every setting `orl <of>` would start with here: value and source (its variable, the config file
    and key, or the default), secrets masked. Flags are the command's own, so none shows here."""
    from orl.cli import COMMANDS, settings_of_every_command
    from orl.settings_binding import effective_settings

    settings_of = settings_of_every_command()
    if settings.of not in settings_of:
        names = ", ".join(command.name for command in COMMANDS)
        raise ConfigError(f"orl settings: no command {settings.of!r} (commands: {names})")
    rows = effective_settings(settings_of[settings.of], settings.of, settings_of)
    width = max(len(name) for name, _, _ in rows)
    print(f"orl {settings.of}: {len(rows)} settings")
    for name, value, source in rows:
        print(f"  {name:<{width}}  {value or chr(39) * 2:<24}  {source}")
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
