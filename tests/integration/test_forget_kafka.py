"""Erasure on the Kafka log: `orl forget --session` on history recorded on the test broker.

Two sessions are recorded as live traffic makes them (serving events, then every stage as a
StreamRunner over the broker, with their changelogs); one carries a planted canary. The canary reads
back through `orl export`, yet no file of the broker holds it in clear: the log segments of every
topic, changelogs included, keep sealed bytes only. After `orl forget --session`, export and replay
say the session's payloads are forgotten (the other session's stay readable) and the audit's
lineage still finds the session's samples.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest
from orl.connectors.event_log.factory import open_event_log
from orl.pipeline.history.namespace_io import NamespaceWriter
from orl.pipeline.runtime.main import build_stages, pipeline_config
from orl.pipeline.runtime.stream_runner import StreamRunner

from orl.cli import main
from tests.fixtures.kafka_broker import TEST_KAFKA_VARIABLE
from tests.integration.test_replay import events_of, recorded_settings
from tests.unit.pipeline_streams import Conversation

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
CANARY = "okapi-canary-93be07"


def _conversation(session: str, namespace: str, secret: str) -> list[dict]:
    chat = Conversation(session, namespace=namespace)
    chat.say(f"My passport number is {secret}. How do I simplify 18/24?")
    chat.turn("Divide both by 6 to get 3/4.")
    chat.say(f"Please redo this and keep {secret} in mind.")
    last = chat.turn("3/4.")
    chat.say("Thanks, that works.")
    chat.close(last.turn_id)
    return chat.events


async def _record(log_url: str, namespace: str, data_dir: Path) -> None:
    settings = recorded_settings(data_dir, namespace=namespace, method="binary")
    async with open_event_log(log_url) as log:
        writer = NamespaceWriter(log, namespace)
        await writer.prepare()
        await writer.write(
            _conversation("secret", namespace, CANARY) + _conversation("plain", namespace, "-")
        )
        config = pipeline_config(settings)
        for stage in build_stages(settings):
            if stage.name != "teacher":
                await StreamRunner(log, stage, config, namespace).run_until_idle(idle_polls=1)


async def _samples(log_url: str, namespace: str) -> list[dict]:
    async with open_event_log(log_url) as log:
        return await events_of(log, namespace, "samples")


def _broker_files_holding(needle: bytes, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    dirs = sorted(tmp_path_factory.getbasetemp().glob("kafka*"))
    if not os.environ.get(TEST_KAFKA_VARIABLE):
        assert dirs, "the broker this session started keeps its log under the test's base temp"
    return sorted(str(p) for d in dirs for p in d.rglob("*") if p.is_file() and needle in p.read_bytes())


def test_forget_a_session_on_kafka(
    tmp_path: Path,
    kafka_bootstrap: str,
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace, copy = f"fk{uuid.uuid4().hex[:8]}", f"fk{uuid.uuid4().hex[:8]}"
    log_url = f"kafka://{kafka_bootstrap}"
    asyncio.run(_record(log_url, namespace, tmp_path))
    samples = asyncio.run(_samples(log_url, namespace))
    assert {s["envelope"]["session_id"] for s in samples} == {"secret", "plain"}
    where = ["--data-dir", str(tmp_path), "--log-url", log_url, "--namespace", namespace]

    assert main(["export", *where]) == 0
    assert CANARY in capsys.readouterr().out  # readable with the key store
    assert _broker_files_holding(CANARY.encode(), tmp_path_factory) == []  # sealed at rest

    assert main(["forget", *where, "--session", "secret", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(s["session_id"], s["keys_destroyed"]) for s in report["sessions"]] == [("secret", 1)]

    assert main(["export", *where]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    forgotten = {r["event"]["envelope"]["session_id"] for r in rows if r["event"].get("payload_forgotten")}
    assert forgotten == {"secret"}
    assert CANARY not in json.dumps(rows)
    assert any(
        r["event"]["envelope"].get("session_id") == "plain" and "messages_json" in r["event"] for r in rows
    )

    assert main(["replay", *where, "--target-namespace", copy, "--method", "binary", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "payloads were forgotten" in out
    assert {s["envelope"]["session_id"] for s in asyncio.run(_samples(log_url, copy))} == {"plain"}

    assert main(["audit", "--session", "secret", *where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples_ready"] == len(
        [
            s
            for s in samples
            if s["envelope"]["session_id"] == "secret" and s["envelope"]["event_type"] == "SampleReady"
        ]
    )
    assert _broker_files_holding(CANARY.encode(), tmp_path_factory) == []
