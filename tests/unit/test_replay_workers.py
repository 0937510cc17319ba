"""Replay shards: sessions dealt by key, vote counts merged, and worker processes that fail loudly."""

from __future__ import annotations

import asyncio

import pytest
from orl.pipeline.history.replay_shard import RecordedVotes, shard_of, split_by_shard
from orl.pipeline.history.replay_workers import (
    DEFAULT_MAX_WORKERS,
    ReplayWorkerError,
    WorkerShard,
    shard_pool,
    workers_for,
)
from orl.pipeline.processors.config import PipelineConfig


def test_a_key_always_lands_in_one_shard_and_order_is_kept_within_it() -> None:
    batch = [(f"s{n % 7}".encode(), f"event {n}".encode()) for n in range(70)] + [(None, b"unkeyed")]
    parts = split_by_shard(batch, 3)
    assert sorted((record for part in parts for record in part), key=repr) == sorted(batch, key=repr)
    for index, part in enumerate(parts):
        assert all(shard_of(key, 3) == index for key, _ in part)
        assert part == [record for record in batch if shard_of(record[0], 3) == index]
    assert (None, b"unkeyed") in parts[0]
    assert {len(part) > 0 for part in parts} == {True}  # 7 sessions spread over the 3 shards
    assert split_by_shard(batch, 1) == [batch]


def test_merged_votes_take_the_largest_m_per_vote_type_and_every_version() -> None:
    merged = RecordedVotes.merge(
        [
            RecordedVotes({"JudgeVoteCast": 3}, frozenset({"a"})),
            RecordedVotes({"JudgeVoteCast": 2, "HintVoteCast": 5}, frozenset({"b"})),
            RecordedVotes({}, frozenset()),
        ]
    )
    assert merged == RecordedVotes({"JudgeVoteCast": 3, "HintVoteCast": 5}, frozenset({"a", "b"}))


def test_a_failed_call_in_a_worker_fails_with_its_traceback_and_the_worker_goes_on() -> None:
    async def scenario() -> None:
        async with shard_pool(2, [], PipelineConfig(), "target") as shards:
            assert all(isinstance(shard, WorkerShard) for shard in shards)
            await asyncio.gather(*(shard.submit("start", {}, False) for shard in shards))
            with pytest.raises(ReplayWorkerError, match="failed in feed:(.|\n)*EventDecodeError"):
                await shards[0].submit("feed", [(b"s1", b"not an event")])
            assert await shards[0].submit("feed", []) == []
            assert await shards[1].submit("watermark") == 0

    asyncio.run(scenario())


def test_a_worker_that_dies_fails_the_next_call() -> None:
    async def scenario() -> None:
        async with shard_pool(2, [], PipelineConfig(), "target") as shards:
            worker = shards[1]
            assert isinstance(worker, WorkerShard)
            worker.process.kill()
            worker.process.join()
            with pytest.raises(ReplayWorkerError, match="died"):
                await worker.submit("watermark")

    asyncio.run(scenario())


def test_the_default_is_one_worker_per_core_up_to_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    assert workers_for(3) == 3
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert workers_for(0) == 2
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert workers_for(0) == DEFAULT_MAX_WORKERS
    monkeypatch.setattr("os.cpu_count", lambda: None)
    assert workers_for(0) == 1
