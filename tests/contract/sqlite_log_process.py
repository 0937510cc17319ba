"""A separate process on the SQLite event log, for the crash and multi-process tests (run with `python -m`).

`write` appends BATCHES batches of BATCH_SIZE 1 KB records to TOPIC and, after each append returns,
prints "appended WRITER BATCH FIRST_OFFSET LAST_OFFSET" and flushes, so the test knows which appends
were reported durable before it kills the process. With --wait-for-go it prints "ready" once the log
is open and waits for a line on stdin, so that several writers start at the same moment.
`join` joins GROUP on TOPIC, prints "joined", then idles (heartbeating) until it is killed.

    python -m tests.contract.sqlite_log_process write DB TOPIC WRITER BATCHES BATCH_SIZE [--wait-for-go] [--pause-s S]
    python -m tests.contract.sqlite_log_process join DB TOPIC GROUP SESSION_TIMEOUT_S
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from orl.connectors.event_log.base import OutgoingRecord
from orl.connectors.event_log.sqlite_log import SqliteEventLog

VALUE_BYTES = 1024


def record_value(writer: str, batch: int, index: int) -> bytes:
    """A deterministic 1 KB value, so a reader can tell a torn or corrupt record from a whole one."""
    stamp = f"{writer}:{batch}:{index}|"
    return (stamp * (VALUE_BYTES // len(stamp) + 1)).encode()[:VALUE_BYTES]


def parse_value(value: bytes) -> tuple[str, int, int]:
    writer, batch, index = value.split(b"|", 1)[0].decode().split(":")
    return writer, int(batch), int(index)


async def write(args: argparse.Namespace) -> None:
    async with SqliteEventLog(args.db) as log:
        if args.wait_for_go:
            print("ready", flush=True)
            sys.stdin.readline()
        for batch in range(args.batches):
            records = [
                OutgoingRecord(
                    record_value(args.writer, batch, i), headers=(("writer", args.writer.encode()),)
                )
                for i in range(args.batch_size)
            ]
            positions = await log.append_batch(args.topic, records)
            print("appended", args.writer, batch, positions[0].offset, positions[-1].offset, flush=True)
            await asyncio.sleep(args.pause_s)  # other work between appends: lets the other writer in


async def join(args: argparse.Namespace) -> None:
    options = {
        "session_timeout_s": args.session_timeout_s,
        "heartbeat_interval_s": args.session_timeout_s / 5,
    }
    async with SqliteEventLog(args.db, **options) as log, log.consumer(args.group, [args.topic]):
        print("joined", flush=True)
        await asyncio.Event().wait()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write")
    for name in ("db", "topic", "writer"):
        writer.add_argument(name)
    writer.add_argument("batches", type=int)
    writer.add_argument("batch_size", type=int)
    writer.add_argument("--wait-for-go", action="store_true")
    writer.add_argument("--pause-s", type=float, default=0.0, help="sleep after each append")
    member = commands.add_parser("join")
    for name in ("db", "topic", "group"):
        member.add_argument(name)
    member.add_argument("session_timeout_s", type=float)
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    asyncio.run(write(arguments) if arguments.command == "write" else join(arguments))
