"""`orl status`: the lines it prints from status.json, the spools and the log's policy events."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from orl.status import SampleTally, stack_status


def envelope(event_type: str, occurred_at: int = 0) -> dict:
    return {"event_type": event_type, "occurred_at": occurred_at}


def test_status_names_each_process_the_spools_the_versions_and_the_last_sample() -> None:
    processes = {
        "serve": {"state": "running", "restarts": 0, "crash_loop": False, "last_exit_code": None},
        "train": {"state": "restarting", "restarts": 5, "crash_loop": True, "last_exit_code": 1},
    }
    events = {
        "checkpoints": [
            {"envelope": envelope("CheckpointPublished"), "version": 1},
            {"envelope": envelope("CheckpointPublished"), "version": 2},
            {"envelope": envelope("PolicyGated"), "version": 1, "decision": "promoted"},
            {"envelope": envelope("PolicyGated"), "version": 2, "decision": "held"},
        ],
        "policy_activations": [
            {"envelope": envelope("PolicyActivated"), "server_id": "serve-a", "version": 1},
            {"envelope": envelope("PolicyRejected"), "server_id": "serve-a", "version": 2},
        ],
    }
    newest = {"envelope": envelope("SampleReady", 10_000), "policy_version": 1, "method": "combined"}
    lines = stack_status(processes, {"spool-serve-a.db": 3}, events, SampleTally(1, 1, newest), now_ms=40_000)
    assert "  serve                running: 0 restarts" in lines
    assert "  train                restarting, CRASH LOOP: 5 restarts, last exit 1" in lines
    assert "  spool-serve-a.db: 3" in lines
    assert "  checkpoints: 2 published, newest v2" in lines
    assert "  gate: promoted v1, held v2" in lines
    assert "  served: v1 on serve-a" in lines
    assert "  samples: 1 built, 1 rejected; the last 30 s ago (v1, combined)" in lines


def test_status_of_a_data_dir_where_nothing_ran_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "orl.cli", "status", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "none: orl up has not run with this --data-dir" in done.stdout
    assert "served: the base model" in done.stdout
    assert "samples: none built yet, 0 rejected" in done.stdout


def test_status_reads_the_supervisors_file(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    status = {"pipeline": {"state": "stopped", "restarts": 2, "crash_loop": False, "last_exit_code": -15}}
    (tmp_path / "logs" / "status.json").write_text(json.dumps(status))
    done = subprocess.run(
        [sys.executable, "-m", "orl.cli", "status", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "pipeline             stopped: 2 restarts, last exit -15" in done.stdout


def test_the_start_banner_names_the_url_the_key_the_reward_signal_and_what_to_run_next(
    tmp_path: Path,
) -> None:
    from orl.up import UpSettings, start_banner

    banner = start_banner(
        UpSettings(data_dir=tmp_path / "my data", port=8123), "reward signal: rule judge 'reaction'"
    )
    assert "point any OpenAI client at http://127.0.0.1:8123/v1" in banner
    assert f"{tmp_path / 'my data' / 'keys.json'}" in banner
    assert "curl -s http://127.0.0.1:8123/v1/chat/completions" in banner
    assert "reward signal: rule judge 'reaction'" in banner
    assert f"orl status --data-dir '{tmp_path / 'my data'}'" in banner


def test_status_counts_the_samples_topic_from_envelope_heads_and_decodes_the_newest(tmp_path: Path) -> None:
    """On a real embedded log: two built samples and one rejection; the newest built one is decoded."""
    import asyncio
    import copy

    from orl.connectors.event_log.base import OutgoingRecord, TopicSpec
    from orl.connectors.event_log.factory import open_event_log
    from orl.schemas.codec import encode

    from orl.status import read_status_events
    from tests.unit.event_examples import example_event

    older, newer = example_event("SampleReady"), copy.deepcopy(example_event("SampleReady"))
    newer["envelope"] = {
        **newer["envelope"],
        "event_id": "SampleReady-newer",
        "occurred_at": older["envelope"]["occurred_at"] + 5,
    }
    newer["policy_version"] = older["policy_version"] + 1
    url = f"sqlite:///{tmp_path / 'log.db'}"

    async def write_then_read():
        async with open_event_log(url) as log:
            await log.create_topics([TopicSpec("live.samples", 1)])
            events = [newer, example_event("SampleRejected"), older]  # the newest is not the last written
            await log.append_batch("live.samples", [OutgoingRecord(encode(e)) for e in events])
        return await read_status_events(url, "live")

    events, tally = asyncio.run(write_then_read())
    assert (tally.built, tally.rejected) == (2, 1)
    assert tally.newest is not None and tally.newest["policy_version"] == newer["policy_version"]
    assert set(events) == {"checkpoints", "policy_activations"}
