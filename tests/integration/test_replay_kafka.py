"""Replay and audit on the Kafka log (the test broker), as test_replay and test_audit do on SQLite.

History is recorded on Kafka the way live traffic makes it (serving events, then every stage as a
StreamRunner over the broker), replayed with the recorded votes into a new namespace, replayed
again (nothing added), and a replayed sample is audited back to the judge's raw words.
Each test uses fresh namespaces: the broker lives for the whole session.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.history.audit import audit_id
from orl.pipeline.history.audit_index import AuditIndex
from orl.pipeline.history.replay import REUSE_TOPICS, ReplayPlan, log_source, replay
from orl.pipeline.runtime.main import build_stages, pipeline_config

from tests.integration.test_replay import by_turn, comparable, events_of, record, recorded_settings

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]


def test_reuse_on_kafka_reproduces_the_samples_a_rerun_adds_nothing_and_audit_finds_the_votes(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    source, target = f"rk{uuid.uuid4().hex[:8]}", f"rk{uuid.uuid4().hex[:8]}"
    log_url = f"kafka://{kafka_bootstrap}"

    async def scenario() -> None:
        async with open_event_log(log_url) as log:
            settings = recorded_settings(tmp_path, namespace=source)
            await record(log, settings, sessions=2)
            original = by_turn(await events_of(log, source, "samples"))
            assert original

            target_settings = recorded_settings(tmp_path, namespace=target)
            plan = ReplayPlan(target, "reuse", f"log:{source}", "v1")

            async def run() -> int:
                report = await replay(
                    log, plan, log_source(log, source, REUSE_TOPICS), build_stages(target_settings),
                    pipeline_config(target_settings), source_namespace=source,
                )  # fmt: skip
                return report.copied

            assert await run() > 0
            replayed = by_turn(await events_of(log, target, "samples"))
            assert replayed.keys() == original.keys()
            assert all(comparable(replayed[t]) == comparable(original[t]) for t in original)
            counts = {t: len(await events_of(log, target, t)) for t in ("requests", "judge_votes", "samples")}
            assert await run() == 0
            assert {t: len(await events_of(log, target, t)) for t in counts} == counts

            ready = next(s for s in replayed.values() if s["envelope"]["event_type"] == "SampleReady")
            index = AuditIndex(tmp_path / "audit.sqlite", target)
            try:
                chain = await audit_id(log, index, ready["envelope"]["event_id"])
            finally:
                index.close()
            assert [s["event_id"] for s in chain["samples"]] == [ready["envelope"]["event_id"]]
            assert chain["votes"] and all(
                v["raw_output"] and v["judge_config_version"] for v in chain["votes"]
            )
            assert chain["request"]["event_id"] == ready["lineage"]["request_event_id"]
            assert chain["rewards"] and chain["rewards"][0]["rule"]

    asyncio.run(scenario())
