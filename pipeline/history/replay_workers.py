"""The shards of a reuse replay, run in this process (one shard) or in one worker process each.

A worker process holds one ReplayShard (pipeline/history/replay_shard.py) and answers calls sent over a
pipe, `(method, args)`, with `("ok", result)` or `("error", traceback)`; `None` stops it, and so does
the pipe closing (the driver died). The driver submits a call and gets a future at once: a worker's
calls are sent and their replies received on a thread of its own, one at a time, so the event loop
goes on reading and writing the log while the workers compute. A worker that fails, or dies, fails
the replay with a ReplayWorkerError that says why. Workers are started with "spawn" (a fresh
interpreter: the driver's threads and event loop are not forked).
Reads and writes no topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import traceback
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Protocol

from orl.pipeline.history.namespace_io import EncodedEvent
from orl.pipeline.history.replay_shard import ReplayShard
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import Processor
from orl.pipeline.runtime.gc_tuning import tuned_for_streams
from orl.schemas.codec import install_data_keys, installed_data_keys
from orl.schemas.errors import OrlError
from orl.schemas.sealing import DataKeys

STOP_TIMEOUT_S = 10.0


DEFAULT_MAX_WORKERS = 4  # beyond that the driver's reading and writing is the limit (RESULTS-replay-audit.md)


def workers_for(setting: int) -> int:
    """The number of shards for a --workers setting (0: one per CPU core, at most DEFAULT_MAX_WORKERS)."""
    return setting if setting > 0 else max(1, min(os.cpu_count() or 1, DEFAULT_MAX_WORKERS))


class ReplayWorkerError(OrlError):
    """A replay worker process failed or died."""


class Shard(Protocol):
    def submit(self, method: str, *args: Any) -> asyncio.Future[Any]: ...

    def close(self) -> None: ...


class LocalShard:
    """A shard in the driver's process: a call runs when submitted."""

    def __init__(self, shard: ReplayShard) -> None:
        self.shard = shard

    def submit(self, method: str, *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        try:
            future.set_result(getattr(self.shard, method)(*args))
        except Exception as error:  # the caller gets it when it awaits the call
            future.set_exception(error)
        return future

    def close(self) -> None:
        pass


class WorkerShard:
    """A shard in a worker process of its own."""

    def __init__(
        self, index: int, stages: Sequence[Processor | None], config: PipelineConfig, target: str
    ) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=serve,
            args=(child, stages, config, target, installed_data_keys()),
            name=f"orl-replay-{index}",
            daemon=True,
        )
        self.process.start()
        child.close()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"orl-replay-{index}")
        self._in_flight = 0

    def submit(self, method: str, *args: Any) -> asyncio.Future[Any]:
        self._in_flight += 1
        future = asyncio.get_running_loop().run_in_executor(self._thread, self._call, method, args)
        future.add_done_callback(self._done)
        return future

    def _done(self, _: asyncio.Future[Any]) -> None:
        self._in_flight -= 1

    def _call(self, method: str, args: tuple[Any, ...]) -> Any:
        try:
            self.connection.send((method, args))
            status, result = self.connection.recv()
        except (EOFError, OSError) as error:
            self.process.join(1.0)
            raise ReplayWorkerError(
                f"replay worker {self.process.name} died (exit code {self.process.exitcode})"
            ) from error
        if status == "error":
            raise ReplayWorkerError(f"replay worker {self.process.name} failed in {method}:\n{result}")
        return result

    def close(self) -> None:
        """Stop the worker: told to when idle, else (a replay that failed) killed at once."""
        self._thread.shutdown(wait=False, cancel_futures=True)
        if self._in_flight == 0:
            with contextlib.suppress(OSError):
                self.connection.send(None)
            self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()


def serve(
    connection: Connection,
    stages: Sequence[Processor | None],
    config: PipelineConfig,
    target: str,
    data_keys: DataKeys | None,
) -> None:
    """A worker process's loop: one ReplayShard, one call at a time, until told to stop (with the
    driver's key store, which travels by its path)."""
    install_data_keys(data_keys)
    shard = ReplayShard(stages, config, target)
    with tuned_for_streams():
        while True:
            try:
                call = connection.recv()
            except EOFError:
                return  # the driver is gone
            if call is None:
                return
            method, args = call
            try:
                result = getattr(shard, method)(*args)
                if isinstance(result, list):  # NamedTuples pickle ten times slower than tuples
                    result = [tuple(item) if isinstance(item, EncodedEvent) else item for item in result]
                reply = ("ok", result)
            except Exception:
                reply = ("error", traceback.format_exc())
            connection.send(reply)


@contextlib.asynccontextmanager
async def shard_pool(
    workers: int, stages: Sequence[Processor | None], config: PipelineConfig, target: str
) -> AsyncIterator[list[Shard]]:
    """`workers` shards: 1 runs in this process, more run one worker process each."""
    if workers < 1:
        raise ValueError(f"a replay needs at least one worker, not {workers}")
    shards: list[Shard] = []
    try:
        if workers == 1:
            shards.append(LocalShard(ReplayShard(stages, config, target)))
        else:
            shards += [WorkerShard(index, stages, config, target) for index in range(workers)]
        yield shards
    finally:
        for shard in shards:
            shard.close()
