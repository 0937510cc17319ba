"""A stage's task may end only when the pipeline is asked to stop (pipeline/runtime/main.py,
`run_until_stopped`): a stage that returned, or was ended by a CancelledError nobody sent its task,
makes the process exit (StageStopped) instead of leaving its input unread."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from orl.pipeline.runtime.main import StageStopped, run_until_stopped


@dataclass
class Runner:
    """Stands in for a StreamRunner: `run` does what `behaviour` says."""

    behaviour: str
    processor: Any = field(default_factory=lambda: SimpleNamespace(name="turn_linker"))

    async def run(self, stop: asyncio.Event) -> None:
        if self.behaviour == "returns":
            return
        if self.behaviour == "stray cancel":  # what aiokafka's stop let out (aio-libs/aiokafka#647)
            inner = asyncio.create_task(asyncio.sleep(10))
            await asyncio.sleep(0)
            inner.cancel()
            await inner
        await stop.wait()


async def test_a_stage_that_returns_while_the_pipeline_runs_stops_the_process() -> None:
    with pytest.raises(StageStopped, match="turn_linker stopped by itself"):
        await run_until_stopped(Runner("returns"), asyncio.Event())  # type: ignore[arg-type]


async def test_a_stray_cancelled_error_stops_the_process_instead_of_the_stage_alone() -> None:
    with pytest.raises(StageStopped, match="stray CancelledError"):
        await run_until_stopped(Runner("stray cancel"), asyncio.Event())  # type: ignore[arg-type]


async def test_a_stage_asked_to_stop_ends_quietly_and_a_cancel_of_its_task_cancels_it() -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(run_until_stopped(Runner("waits"), stop))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    stop.set()
    await task
    task = asyncio.create_task(run_until_stopped(Runner("waits"), asyncio.Event()))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
