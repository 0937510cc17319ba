"""Import of OpenClaw-RL's recorded JSONL files as orl events (reference/openclaw-rl.md section 5).

Conversation records `{session_id, turn, timestamp, messages, prompt_text, response_text,
tool_calls, next_state}` (Tinker's have no `messages`) become RequestReceived, ResponseGenerated
and, when `next_state` is set, NextStateObserved. Judge records become votes on that next state:
PRM `{session_id, turn, score, votes: [int|"fail"], representative_eval}` (Tinker: `representative`)
-> JudgeVoteCast per vote; OPD/Combine `{session_id, turn, accepted, hint, votes: [{vote_id, score,
hint, raw}]}` -> HintVoteCast per vote; Tinker `opd_scores` (`hint_raw`, no votes) -> one
HintVoteCast; Tinker `combine_scores` (`eval_score`, `eval_raw`, `hint_raw`) -> one of each.
Each line is classified by its keys, so a file may mix both kinds. Every session also gets a
SessionClosed (the files hold finished turns), so the at-least-one promotion applies.

Imported responses have no sampled ids: `orl.pipeline.history.import_tokens` tokenizes them and supplies old
logprobs, and each is marked off-policy with a single policy span (`start_token` 0, version 0): the
span is what the sample builder reads to set `SampleReady.off_policy`. Event ids are deterministic
from (namespace, session, turn), so importing the same file twice adds nothing.

Bad input: a line that is not JSON (malformed or truncated) or lacks a required field is reported
as `file:line: why` and skipped, or, with `strict`, the whole import raises ImportFailed before
anything is built; a record yields all of its events or none. Timestamps ("%Y-%m-%d %H:%M:%S",
written in the recorder's local time) are read as UTC.
Reads files; writes no topics itself (replay writes the events).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from orl.pipeline.history.import_tokens import ImportTokenizer, LogprobScorer
from orl.schemas.errors import OrlError
from orl.schemas.event_constructors import (
    hint_vote_cast,
    judge_vote_cast,
    next_state_observed,
    request_received,
    response_generated,
    session_closed,
)
from orl.schemas.event_types import Envelope, SamplingParams
from orl.schemas.events import EventOrigin
from orl.schemas.messages import Message

PRODUCER = "pipeline.history.openclaw_import/1"
JUDGE_CONFIG_VERSION = "openclaw-rl-import"
PRM_JUDGE_ID = "openclaw-prm"
HINT_JUDGE_ID = "openclaw-hint"
NOT_RECORDED = "(not recorded by OpenClaw-RL)"
Event = dict[str, Any]


class ImportFailed(OrlError):
    """A strict import met a bad line; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    path: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}"


@dataclass(frozen=True)
class Line:
    path: str
    line: int
    record: dict[str, Any]


@dataclass
class ParsedFiles:
    conversations: list[Line] = field(default_factory=list)
    judgements: list[Line] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


@dataclass(frozen=True)
class ImportOptions:
    namespace: str
    model: str = "smollm2-135m"
    temperature: float = 1.0


def read_lines(path: Path) -> Iterator[Line | Problem]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            truncated = not raw.endswith(b"\n")
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                kind = "truncated line" if truncated else "malformed JSON"
                yield Problem(str(path), number, f"{kind}: {error}")
                continue
            if not isinstance(record, dict):
                yield Problem(str(path), number, f"expected a JSON object, got {type(record).__name__}")
                continue
            yield Line(str(path), number, record)


def _require(record: dict[str, Any], fields: dict[str, tuple[type, ...]]) -> str | None:
    for name, types in fields.items():
        if name not in record:
            return f"missing field {name!r}"
        if not isinstance(record[name], types) or isinstance(record[name], bool) and bool not in types:
            return f"field {name!r} has type {type(record[name]).__name__}"
    return None


_KEYS: dict[str, tuple[type, ...]] = {"session_id": (str,), "turn": (int,)}
_CONVERSATION: dict[str, tuple[type, ...]] = {**_KEYS, "timestamp": (str,), "response_text": (str,)}


def classify(line: Line, parsed: ParsedFiles) -> None:
    record = line.record
    if "response_text" in record:
        why = _require(record, _CONVERSATION) or _check_timestamp(record["timestamp"])
        why = why or _check_optional(record, {"messages": list, "tool_calls": list, "next_state": dict})
        target = parsed.conversations
    elif any(k in record for k in ("score", "accepted", "eval_score")):
        why = _require(record, _KEYS)
        target = parsed.judgements
    else:
        why, target = "neither a conversation record (response_text) nor a judge record", parsed.judgements
    if why:
        parsed.problems.append(Problem(line.path, line.line, why))
    else:
        target.append(line)


def _check_timestamp(value: str) -> str | None:
    try:
        datetime.strptime(value, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return f"timestamp {value!r} is not '%Y-%m-%d %H:%M:%S'"
    return None


def _check_optional(record: dict[str, Any], fields: dict[str, type]) -> str | None:
    for name, kind in fields.items():
        if record.get(name) is not None and not isinstance(record[name], kind):
            return f"field {name!r} must be a {kind.__name__} or null"
    return None


def parse_files(paths: Iterable[Path], strict: bool = False) -> ParsedFiles:
    parsed = ParsedFiles()
    for path in paths:
        for item in read_lines(path):
            if isinstance(item, Problem):
                parsed.problems.append(item)
            else:
                classify(item, parsed)
            if strict and parsed.problems:
                raise ImportFailed(f"{parsed.problems[0]} (--strict: nothing was imported)")
    return parsed


def turn_id_for(session_id: str, turn: int) -> str:
    return f"{session_id}/t{turn}"


def epoch_ms(timestamp: str) -> int:
    moment = datetime.strptime(timestamp, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _sampling(temperature: float, max_tokens: int) -> SamplingParams:
    return {
        "temperature": temperature,
        "top_p": 1.0,
        "max_tokens": max_tokens,
        "stop": [],
        "seed": None,
        "constraint": None,
    }


def conversation_events(
    record: dict[str, Any], options: ImportOptions, tokenizer: ImportTokenizer, scorer: LogprobScorer
) -> list[Event]:
    """Request, response and (if recorded) next state of one turn."""
    session, turn = record["session_id"], record["turn"]
    turn_id, at_ms = turn_id_for(session, turn), epoch_ms(record["timestamp"])
    request_id = f"openclaw:{session}:{turn}"
    messages = record.get("messages") or [{"role": "user", "content": record.get("prompt_text") or ""}]
    tool_calls = record.get("tool_calls") or None
    prompt_ids = tokenizer.prompt_ids(record.get("messages"), str(record.get("prompt_text") or ""))
    response_ids = tokenizer.response_ids(record["response_text"], tool_calls, finished=True)
    logprobs = scorer.logprobs(prompt_ids, response_ids, options.temperature)
    sampling = _sampling(options.temperature, len(response_ids))

    def origin(occurred_at_ms: int, *id_parts: object) -> EventOrigin:
        return EventOrigin(
            namespace=options.namespace,
            producer=PRODUCER,
            occurred_at_ms=occurred_at_ms,
            id_parts=id_parts,
            session_id=session,
            turn_id=turn_id,
        )

    request = request_received(
        origin(at_ms, request_id),
        request_id=request_id,
        turn_kind="main",
        turn_index=turn,
        previous_turn_id=turn_id_for(session, turn - 1) if turn else None,
        link_method="import",
        messages_json=json.dumps(messages, ensure_ascii=False),
        tools_json=None,
        tool_choice_json=None,
        sampling=sampling,
        model=options.model,
        stream=False,
        client_id="openclaw-rl",
        group_id=None,
        group_size=None,
    )
    response = response_generated(
        origin(at_ms + 1, request_id, "response"),
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        response_token_ids=response_ids,
        response_logprobs=logprobs,
        response_text=record["response_text"],
        reasoning_text=None,
        tool_calls_json=json.dumps(tool_calls, ensure_ascii=False) if tool_calls else None,
        finish_reason="tool_calls" if tool_calls else "stop",
        sampling=sampling,
        policy_version=0,
        policy_spans=[{"start_token": 0, "policy_version": 0}],
        latency_ms=0.0,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(response_ids),
        model=f"openclaw-rl-import:{options.model}",
        policy_run=None,  # OpenClaw-RL's own run, not one of orl's
    )
    events: list[Event] = [dict(request), dict(response)]
    if record.get("next_state"):
        events.append(
            next_state_event(record["next_state"], origin(at_ms + 2, turn_id, "openclaw-next-state"))
        )
    return events


def next_state_event(state: Message, origin: EventOrigin) -> Event:
    content = state.get("content")
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    event = next_state_observed(
        origin,
        source="openclaw_import",
        role=str(state.get("role") or "user"),
        content=text or "",
        messages_json=json.dumps([state], ensure_ascii=False),
        outcome=None,
    )
    return dict(event)


def judge_votes(record: dict[str, Any]) -> list[tuple[str, int | None, str, str | None, str | None]]:
    """(kind, score, raw, hint, parse_error) per vote recorded in a judge record."""
    votes: list[tuple[str, int | None, str, str | None, str | None]] = []
    if "score" in record and isinstance(record.get("votes"), list):  # PRM record
        representative = str(record.get("representative_eval") or record.get("representative") or "")
        given = False
        for vote in record["votes"]:
            score = vote if isinstance(vote, int) and not isinstance(vote, bool) else None
            raw = ""
            if score is not None and not given and float(score) == float(record["score"]) and representative:
                raw, given = representative, True
            votes.append(
                ("reward", score, raw or NOT_RECORDED, None, None if score is not None else str(vote))
            )
    elif "accepted" in record and isinstance(record.get("votes"), list):  # OPD / Combine judge record
        for vote in record["votes"]:
            if isinstance(vote, dict):
                score = vote.get("score") if isinstance(vote.get("score"), int) else None
                hint = vote.get("hint") or None
                votes.append(("hint", score, str(vote.get("raw") or NOT_RECORDED), hint, None))
    elif "accepted" in record:  # Tinker opd_scores: one hint judgement
        hint = record.get("hint") or None
        votes.append(
            ("hint", 1 if record["accepted"] else -1, str(record.get("hint_raw") or NOT_RECORDED), hint, None)
        )
    elif "eval_score" in record:  # Tinker combine_scores
        score = record["eval_score"] if isinstance(record["eval_score"], int) else None
        votes.append(("reward", score, str(record.get("eval_raw") or NOT_RECORDED), None, None))
        if record.get("hint_raw"):
            votes.append(
                (
                    "hint",
                    1 if record.get("hint") else -1,
                    str(record["hint_raw"]),
                    record.get("hint") or None,
                    None,
                )
            )
    return votes


def vote_events(record: dict[str, Any], next_state: Event) -> list[Event]:
    envelope: Envelope = next_state["envelope"]
    events: list[Event] = []
    counters = {"reward": 0, "hint": 0}
    for kind, score, raw, hint, parse_error in judge_votes(record):
        index = counters[kind]
        counters[kind] += 1
        judge_id = PRM_JUDGE_ID if kind == "reward" else HINT_JUDGE_ID
        origin = EventOrigin(
            namespace=envelope["namespace"],
            producer=PRODUCER,
            occurred_at_ms=envelope["occurred_at"] + 1 + index,
            id_parts=(envelope["event_id"], judge_id, JUDGE_CONFIG_VERSION, index),
            session_id=envelope["session_id"],
            turn_id=envelope["turn_id"],
        )
        error = None if score is not None else f"recorded as {parse_error or 'no score'}"
        events.append(
            vote_event(kind, origin, judge_id, index, raw, score, error, hint, envelope["event_id"])
        )
    return events


def vote_event(
    kind: str,
    origin: EventOrigin,
    judge_id: str,
    index: int,
    raw: str,
    score: int | None,
    parse_error: str | None,
    hint: str | None,
    next_state_event_id: str,
) -> Event:
    """A JudgeVoteCast (`kind` "reward") or HintVoteCast of an imported vote; what the recorder did not
    keep (prompt, sampling, usage) is marked as not recorded."""
    if kind == "reward":
        vote = judge_vote_cast(
            origin,
            judge_id=judge_id,
            judge_kind="llm",
            judge_config_version=JUDGE_CONFIG_VERSION,
            model=None,
            model_version=None,
            vote_index=index,
            prompt_sha256=hashlib.sha256(NOT_RECORDED.encode()).hexdigest(),
            prompt_text=NOT_RECORDED,
            sampling=_sampling(0.6, 0),
            raw_output=raw,
            score=score,
            parse_error=parse_error,
            latency_ms=0.0,
            prompt_tokens=0,
            completion_tokens=0,
            next_state_event_id=next_state_event_id,
        )
        return dict(vote)
    hint_vote = hint_vote_cast(
        origin,
        judge_id=judge_id,
        judge_kind="llm",
        judge_config_version=JUDGE_CONFIG_VERSION,
        model=None,
        model_version=None,
        vote_index=index,
        prompt_sha256=hashlib.sha256(NOT_RECORDED.encode()).hexdigest(),
        prompt_text=NOT_RECORDED,
        sampling=_sampling(0.6, 0),
        raw_output=raw,
        score=score,
        parse_error=parse_error,
        latency_ms=0.0,
        prompt_tokens=0,
        completion_tokens=0,
        next_state_event_id=next_state_event_id,
        hint=hint,
    )
    return dict(hint_vote)


def session_closed_events(turns: dict[str, list[Event]], namespace: str) -> list[Event]:
    """One SessionClosed per imported session, after its last turn."""
    last: dict[str, Event] = {}
    for events in turns.values():
        request = events[0]
        session = request["envelope"]["session_id"]
        if session not in last or request["turn_index"] > last[session]["turn_index"]:
            last[session] = request
    closed: list[Event] = []
    for session, request in sorted(last.items()):
        origin = EventOrigin(
            namespace=namespace,
            producer=PRODUCER,
            occurred_at_ms=request["envelope"]["occurred_at"] + 1000,
            id_parts=(session, "openclaw-import-end"),
            session_id=session,
        )
        event = session_closed(origin, reason="import_end", last_turn_id=request["envelope"]["turn_id"])
        closed.append(dict(event))
    return closed


def build_events(
    parsed: ParsedFiles,
    options: ImportOptions,
    tokenizer: ImportTokenizer,
    scorer: LogprobScorer,
    strict: bool = False,
) -> list[Event]:
    """Every event of the parsed files, in time order; judge records of unknown turns are problems."""
    turns: dict[str, list[Event]] = {}
    for line in parsed.conversations:
        key = turn_id_for(line.record["session_id"], line.record["turn"])
        turns.setdefault(key, conversation_events(line.record, options, tokenizer, scorer))
    votes: list[Event] = []
    for line in parsed.judgements:
        events = turns.get(turn_id_for(line.record["session_id"], line.record["turn"]))
        next_states = [e for e in events or [] if e["envelope"]["event_type"] == "NextStateObserved"]
        if not next_states:
            parsed.problems.append(Problem(line.path, line.line, "judge record of a turn with no next state"))
            if strict:
                raise ImportFailed(f"{parsed.problems[-1]} (--strict: nothing was imported)")
            continue
        votes.extend(vote_events(line.record, next_states[0]))
    everything = [e for events in turns.values() for e in events] + votes
    everything += session_closed_events(turns, options.namespace)
    return sorted(everything, key=lambda e: e["envelope"]["occurred_at"])
