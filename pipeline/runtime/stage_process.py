"""The second process of `orl pipeline --role all`: the downstream stages on a core of their own.

One Python process runs its stages on one core. With two or more cores, `--role all` runs the
upstream stages (turn_linker, judge, teacher) in the `orl pipeline` process and the downstream
stages (vote_tally, hint_selector, sample_builder) in a child process started from here; on the
benchmark stream the two halves cost about the same CPU. Each stage stays one consumer group that
commits its outputs, state and offsets in one transaction, so which process runs it changes
nothing about crash safety. The two processes live and die together:

- the child is killed by the kernel when the parent dies, even by kill -9 (Linux PR_SET_PDEATHSIG;
  elsewhere a watchdog polls the parent pid), so a restarted pipeline never meets a stale member;
- when the parent stops (SIGTERM, SIGINT) it stops the child and waits for it;
- when the child exits on its own, the parent fails with StageProcessError (and is restarted by
  its supervisor), rather than running half a pipeline.

The settings reach the child as JSON on its stdin (not argv: they may hold keys).
Reads and writes the topics of the stages it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.runtime.settings import PipelineSettings
from schemas.errors import OrlError

logger = logging.getLogger(__name__)

CHILD_STAGES = ("vote_tally", "hint_selector", "sample_builder")
STOP_GRACE_S = 30.0
PARENT_POLL_S = 0.5
PR_SET_PDEATHSIG = 1


class StageProcessError(OrlError):
    """The stage process of `--role all` exited while the pipeline was running."""


def split_stages(names: Sequence[str], role: str, cpus: int | None) -> tuple[list[str], list[str]]:
    """(stages run in this process, stages run in the child): a split only for `--role all` on 2+ cores."""
    here = [name for name in names if name not in CHILD_STAGES]
    there = [name for name in names if name in CHILD_STAGES]
    if role != "all" or (cpus or 1) < 2 or not here or not there:
        return list(names), []
    return here, there


def settings_json(settings: PipelineSettings) -> str:
    values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
    return json.dumps({name: str(v) if isinstance(v, Path) else v for name, v in values.items()})


def settings_from_json(text: str) -> PipelineSettings:
    values: dict[str, Any] = json.loads(text)
    for f in dataclasses.fields(PipelineSettings):
        if isinstance(f.default, Path) and f.name in values:
            values[f.name] = Path(values[f.name])
    return PipelineSettings(**values)


async def start_stage_process(settings: PipelineSettings, names: Sequence[str]) -> asyncio.subprocess.Process:
    """Start `python -m pipeline.runtime.stage_process` running `names` (as a comma-separated --role)."""
    child_settings = dataclasses.replace(settings, role=",".join(names))
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pipeline.runtime.stage_process", "--parent-pid", str(os.getpid()),
        "--log-level", str(level), stdin=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None
    process.stdin.write(settings_json(child_settings).encode())
    await process.stdin.drain()
    process.stdin.close()
    logger.info("stage process %d runs: %s", process.pid, ", ".join(names))
    return process


async def supervise(process: asyncio.subprocess.Process, stop: asyncio.Event) -> None:
    """Until `stop`: raise StageProcessError if the child exits; then stop the child and wait for it."""
    exited = asyncio.ensure_future(process.wait())
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({exited, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not exited.done():
            await stop_stage_process(process)
        exited.cancel()
    if not stop.is_set():
        raise StageProcessError(f"the stage process {process.pid} exited with code {process.returncode}")


async def stop_stage_process(process: asyncio.subprocess.Process, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM (the child finishes its batch), then SIGKILL after `grace_s`."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        await asyncio.wait_for(process.wait(), grace_s)
    except TimeoutError:
        logger.warning("stage process %d did not stop in %.0f s: killing it", process.pid, grace_s)
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux), and exit if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
    if os.getppid() != parent_pid:
        os._exit(1)  # the parent died before the request above took effect


async def watch_parent(parent_pid: int) -> None:
    """The portable fallback of die_with_parent: exit at once (no cleanup) when the parent is gone."""
    while True:
        await asyncio.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the child: read the settings from stdin, run their stages until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    die_with_parent(args.parent_pid)
    settings = settings_from_json(sys.stdin.read())
    from pipeline.runtime.main import run_pipeline  # here: pipeline.runtime.main imports this module

    async def body() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watchdog = asyncio.create_task(watch_parent(args.parent_pid))
        try:
            await run_pipeline(settings, stop)
        finally:
            watchdog.cancel()

    asyncio.run(body())
    return 0


if __name__ == "__main__":
    sys.exit(main())
