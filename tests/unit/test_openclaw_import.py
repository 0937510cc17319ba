"""OpenClaw-RL record import: recorded golden files -> events; bad lines reported by file:line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from orl.pipeline.history.import_tokens import PlaceholderScorer
from orl.pipeline.history.openclaw_import import ImportFailed, ImportOptions, build_events, parse_files
from orl.schemas.codec import decode, encode

from tests.unit.pipeline_streams import token_ids

GOLDEN = Path(__file__).parents[1] / "golden" / "openclaw"
FILES = [
    GOLDEN / "qwen3_4b_record.jsonl",
    GOLDEN / "qwen3_4b_record_prm.jsonl",
    GOLDEN / "qwen3_4b_record_opd.jsonl",
]


class WordTokenizer:
    def prompt_ids(self, messages: list[dict[str, Any]] | None, prompt_text: str) -> list[int]:
        return token_ids(" ".join(str(m.get("content")) for m in messages or []) or prompt_text)

    def response_ids(self, text: str, tool_calls: list[Any] | None, finished: bool) -> list[int]:
        return token_ids(text) + ([2] if finished else [])


def imported(strict: bool = False) -> tuple[list[dict[str, Any]], list[str]]:
    parsed = parse_files(FILES, strict=strict)
    events = build_events(parsed, ImportOptions("imp"), WordTokenizer(), PlaceholderScorer(), strict=strict)
    return events, [str(p) for p in parsed.problems]


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["envelope"]["event_type"] == kind]


def test_records_become_turns_votes_and_session_ends() -> None:
    events, _ = imported()
    assert len(of_type(events, "RequestReceived")) == len(of_type(events, "ResponseGenerated")) == 3
    assert len(of_type(events, "NextStateObserved")) == 3
    assert len(of_type(events, "JudgeVoteCast")) == 9 and len(of_type(events, "HintVoteCast")) == 6
    assert {e["envelope"]["session_id"] for e in of_type(events, "SessionClosed")} == {"oc-1", "oc-2"}
    for event in events:
        assert decode(encode(event)) == event  # every event is valid on the wire


def test_imported_responses_are_marked_off_policy_with_placeholder_logprobs() -> None:
    events, _ = imported()
    for response in of_type(events, "ResponseGenerated"):
        assert response["policy_spans"] == [{"start_token": 0, "policy_version": 0}]
        assert response["response_logprobs"] == [0.0] * len(response["response_token_ids"])
    tool_turn = of_type(events, "ResponseGenerated")[0]
    assert tool_turn["finish_reason"] == "tool_calls" and "exec" in tool_turn["tool_calls_json"]


def test_votes_keep_the_recorded_scores_failures_and_raw_text() -> None:
    events, _ = imported()
    first = [v for v in of_type(events, "JudgeVoteCast") if v["envelope"]["turn_id"] == "oc-1/t0"]
    assert [v["score"] for v in first] == [1, 1, None]
    assert "boxed{1}" in first[0]["raw_output"] and first[2]["parse_error"] == "recorded as fail"
    hints = [v for v in of_type(events, "HintVoteCast") if v["envelope"]["turn_id"] == "oc-1/t1"]
    assert hints[0]["hint"] == "Answer with the file names only, on one line."
    assert all(
        v["next_state_event_id"] == of_type(events, "NextStateObserved")[1]["envelope"]["event_id"]
        for v in hints
    )


def test_bad_lines_are_reported_with_file_and_line_and_skipped() -> None:
    events, problems = imported()
    assert problems == [
        f"{FILES[0]}:4: " + problems[0].split(": ", 1)[1],
        f"{FILES[0]}:5: " + problems[1].split(": ", 1)[1],
    ]
    assert "malformed JSON" in problems[0] and "truncated line" in problems[1]
    assert not [e for e in events if e["envelope"]["session_id"] == "oc-3"]


def test_strict_aborts_on_the_first_bad_line() -> None:
    with pytest.raises(ImportFailed, match=r"qwen3_4b_record.jsonl:4: malformed JSON"):
        imported(strict=True)


def test_import_is_deterministic() -> None:
    first, _ = imported()
    second, _ = imported()
    assert [e["envelope"]["event_id"] for e in first] == [e["envelope"]["event_id"] for e in second]


def test_a_record_with_a_missing_field_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"session_id": "x", "turn": 0, "response_text": "hi"}\n')
    parsed = parse_files([path])
    assert [str(p) for p in parsed.problems] == [f"{path}:1: missing field 'timestamp'"]
    assert not parsed.conversations
