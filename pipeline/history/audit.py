"""`orl audit`: the whole chain behind any id, from the user's request to the responses it later shaped.

Given a turn id or the event id of a request, response, next state, vote, reward, hint, teacher
score, sample, train step or checkpoint, `audit_id` returns: the request, the response, the next
states, each vote (judge, config version, model, raw output, score or parse failure), the rewards
(rule, version, votes, reason; a combined reward's parts, its arithmetic, and the rewards and votes
it read from other turns, such as a task's outcome), the hint decision, the teacher score, the samples or why they were
rejected, the training steps that consumed them, the checkpoints those steps published and the
first responses served by those versions. `audit_session` lists the checkpoints a session
influenced. Lookups go through the audit index (pipeline/history/audit_index.py); bodies are read from the
log by position, so the cost does not grow with history.
With the object store, checkpoints also show their lineage across runs (`orl train --init-from`,
recorded in every manifest): a checkpoint's `started_from` chain back to the base model, and for a
session the checkpoints of runs started from one it influenced (`derived_checkpoints`).
Reads: the catalog topics of one namespace (by position), the audit index, checkpoint manifests.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

from orl.connectors.checkpoint_store import checkpoint_ancestors, checkpoint_descendants
from orl.connectors.event_log.base import Consumer, EventLog, TopicPartition
from orl.connectors.object_store.base import ObjectStore
from orl.pipeline.history.audit_index import AuditIndex
from orl.pipeline.history.namespace_io import catalog_topics, partition_count
from orl.schemas.codec import FORGOTTEN, decode_or_forgotten
from orl.schemas.errors import OrlError
from orl.schemas.event_types import (
    CheckpointPublished,
    HintVoteCast,
    JudgeVoteCast,
    PolicyActivated,
    PolicyGated,
    PolicyRejected,
    ResponseGenerated,
    TrainStepCompleted,
)

Event = dict[str, Any]
Vote = JudgeVoteCast | HintVoteCast
# The events a version chain starts from (audit_id dispatches on their event_type).
VersionEvent = TrainStepCompleted | CheckpointPublished | PolicyActivated
SERVED_SHOWN = 5
TEXT_SHOWN = 400


class NotFound(OrlError):
    """No event and no turn has that id in the namespace."""


class EventFetcher:
    """Reads single records by position with one consumer over the namespace's topics."""

    def __init__(self, log: EventLog, namespace: str) -> None:
        self.log, self.namespace = log, namespace
        self._consumer: Consumer | None = None

    async def __aenter__(self) -> EventFetcher:
        topics = [t for t in catalog_topics(self.namespace) if await partition_count(self.log, t) is not None]
        self._consumer = self.log.consumer(f"audit-{uuid.uuid4().hex}", topics)
        await self._consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._consumer is not None:
            await self._consumer.close()

    async def get(self, index: AuditIndex, event_id: str) -> Event:
        position = index.position(event_id)
        assert position is not None and self._consumer is not None
        topic, partition, offset = position
        tp = TopicPartition(topic, partition)
        for tp_other in await self._consumer.assignment():  # read only this partition
            await self._consumer.seek(tp_other, 1 << 62)
        await self._consumer.seek(tp, offset)
        for record in await self._consumer.poll(max_records=1, timeout_s=5.0):
            if record.offset == offset and record.partition == partition:
                return decode_or_forgotten(record.value)
        raise NotFound(
            f"{event_id} is indexed at {topic}[{partition}]@{offset} but the log has no such record"
        )


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= TEXT_SHOWN:
        return text
    return text[:TEXT_SHOWN] + f"... [{len(text) - TEXT_SHOWN} more characters]"


def _message_view(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    return {**message, "content": _short(content)} if isinstance(content, str) else message


def _vote_view(vote: Vote) -> dict[str, Any]:
    return {
        "event_id": vote["envelope"]["event_id"],
        "type": vote["envelope"]["event_type"],
        "judge_id": vote["judge_id"],
        "judge_kind": vote["judge_kind"],
        "judge_config_version": vote["judge_config_version"],
        "model": vote["model"],
        "vote_index": vote["vote_index"],
        "seed": vote["sampling"].get("seed"),
        "score": vote["score"],
        "parse_error": vote["parse_error"],
        "hint": vote.get("hint"),
        "raw_output": vote["raw_output"],
        "prompt_sha256": vote["prompt_sha256"],
        "prompt_text": vote["prompt_text"],  # what the judge saw (the readable form leaves it out)
    }


def _event_view(event: Mapping[str, Any]) -> dict[str, Any]:
    """An event's fields for the chain, with token arrays summarised."""
    kind = event["envelope"]["event_type"]
    if event.get(FORGOTTEN):  # `orl forget`: the envelope is all there is
        return {"event_id": event["envelope"]["event_id"], "type": kind, FORGOTTEN: True}
    if kind in ("JudgeVoteCast", "HintVoteCast"):
        return _vote_view(cast(Vote, event))
    view: dict[str, Any] = {"event_id": event["envelope"]["event_id"], "type": kind}
    for name, value in event.items():
        if name == "envelope":
            continue
        if isinstance(value, list) and value and isinstance(value[0], int | float) and name != "votes":
            view[name] = f"[{len(value)} values]"
        elif isinstance(value, str):
            view[name] = _short(value)
        else:
            view[name] = value
    return view


async def _turn_chain(index: AuditIndex, fetch: EventFetcher, turn_id: str) -> dict[str, Any]:
    chain: dict[str, Any] = {
        "turn_id": turn_id,
        "request": None,
        "response": None,
        "next_states": [],
        "votes": [],
        "hint_votes": [],
        "rewards": [],
        "hint_decisions": [],
        "teacher_scores": [],
        "samples": [],
        "forgotten": [],  # events of the turn whose payloads were forgotten (`orl forget`)
    }
    slots = {
        "NextStateObserved": "next_states",
        "JudgeVoteCast": "votes",
        "HintVoteCast": "hint_votes",
        "RewardDecided": "rewards",
        "HintSelected": "hint_decisions",
        "HintRejected": "hint_decisions",
        "TeacherScored": "teacher_scores",
        "SampleReady": "samples",
        "SampleRejected": "samples",
    }
    for event_id, kind in index.turn_events(turn_id):
        event = await fetch.get(index, event_id)
        view = _event_view(event)
        if event.get(FORGOTTEN):  # only the envelope is left; a sample's training is still traced
            (chain["samples"] if kind in ("SampleReady", "SampleRejected") else chain["forgotten"]).append(
                view
            )
        elif kind == "RequestReceived":  # parsed whole, then each message's text shortened
            del view["messages_json"]
            view["messages"] = [_message_view(m) for m in json.loads(event["messages_json"] or "[]")]
            chain["request"] = view
        elif kind == "ResponseGenerated":
            chain["response"] = view
        elif kind in slots:
            chain[slots[kind]].append(view)
    await _add_reward_parts(index, fetch, chain)
    for sample in chain["samples"]:
        sample["training"] = await _training_of(index, fetch, sample["event_id"])
    return chain


async def _add_reward_parts(index: AuditIndex, fetch: EventFetcher, chain: dict[str, Any]) -> None:
    """The rewards a combined reward read (a step's outcome is decided on the task's last turn) and
    their votes, marked with the turn they belong to, so a step's chain reaches the judges' words."""
    shown = {reward["event_id"] for reward in chain["rewards"]}
    pending = [part["reward_event_id"] for reward in chain["rewards"] for part in reward.get("parts") or []]
    while pending:
        reward_id = pending.pop(0)
        if reward_id in shown or index.position(reward_id) is None:
            continue
        shown.add(reward_id)
        event = await fetch.get(index, reward_id)
        if event.get(FORGOTTEN):
            continue
        turn_id = event["envelope"]["turn_id"]
        chain["rewards"].append(_event_view(event) | {"from_turn": turn_id})
        for vote_id in event["vote_ids"]:
            if index.position(vote_id) is not None:
                chain["votes"].append(_event_view(await fetch.get(index, vote_id)) | {"from_turn": turn_id})
        pending += [part["reward_event_id"] for part in event.get("parts") or []]


async def _training_of(index: AuditIndex, fetch: EventFetcher, sample_id: str) -> list[dict[str, Any]]:
    """The steps that consumed a sample, each with its checkpoint and what that version served."""
    steps = []
    for step_id in index.linking_to(sample_id, "consumed"):  # train steps
        step = cast(TrainStepCompleted, await fetch.get(index, step_id))
        steps.append(await _step_view(index, fetch, step))
    return steps


async def _step_view(index: AuditIndex, fetch: EventFetcher, step: TrainStepCompleted) -> dict[str, Any]:
    version, run_id = int(step["policy_version"]), step["run_id"]
    checkpoints = [await fetch.get(index, cid) for cid in index.by_version(version, "checkpoint", run_id)]
    return {
        "train_step": {k: v for k, v in _event_view(step).items() if k != "sample_ids"}
        | {"samples_consumed": len(step["sample_ids"])},
        "checkpoints": [_event_view(c) for c in checkpoints],
        "served": await _served(index, fetch, version, run_id),
    }


async def _served(index: AuditIndex, fetch: EventFetcher, version: int, run_id: str) -> dict[str, Any]:
    """What a run's version served once a server activated it (none if no server did)."""
    served = index.by_version(version, "served", run_id, SERVED_SHOWN)
    shown = [cast(ResponseGenerated, await fetch.get(index, rid)) for rid in served]
    return {
        "policy_version": version,
        "responses": index.count_version(version, "served", run_id),
        "activations": index.count_version(version, "activated", run_id),
        "refusals": [
            {"event_id": e["envelope"]["event_id"], "by": e["server_id"], "reason": e["reason"]}
            for e in [
                cast(PolicyRejected, await fetch.get(index, rid))
                for rid in index.by_version(version, "refused", run_id)
            ]
        ],
        "gate": [
            {
                "event_id": e["envelope"]["event_id"],
                "decision": e["decision"],
                "baseline_version": e["baseline_version"],
                "reason": e["reason"],
            }
            for e in [
                cast(PolicyGated, await fetch.get(index, gid))
                for gid in index.by_version(version, "gated", run_id)
            ]
        ],
        "first": [
            {
                "event_id": r["envelope"]["event_id"],
                "turn_id": r["envelope"]["turn_id"],
                "text": _short(r["response_text"]),
            }
            for r in shown
        ],
    }


async def _version_chain(
    index: AuditIndex, fetch: EventFetcher, event: VersionEvent, store: ObjectStore | None
) -> dict[str, Any]:
    """For a train step or checkpoint: the samples behind it (with their turns) and what it served."""
    kind = event["envelope"]["event_type"]
    if kind == "TrainStepCompleted":
        version = int(cast(TrainStepCompleted, event)["policy_version"])
    else:
        version = int(cast(CheckpointPublished | PolicyActivated, event)["version"])
    steps = [
        cast(TrainStepCompleted, await fetch.get(index, sid))
        for sid in index.by_version(version, "trained", event["run_id"])
    ]
    samples = []
    for step in steps:
        for sample_id in step["sample_ids"]:
            turn = index.turn_of(sample_id)
            samples.append({"sample_id": sample_id, "turn_id": turn, "indexed": turn is not None})
    chain = {
        "id_kind": kind,
        "event": _event_view(event),
        "train_steps": [await _step_view(index, fetch, s) for s in steps],
        "samples": samples,
    }
    if store is not None and kind == "CheckpointPublished":
        checkpoint = cast(CheckpointPublished, event)
        chain["started_from"] = _lineage(checkpoint_ancestors, store, checkpoint["manifest_key"])
    return chain


def _lineage(
    lookup: Callable[[ObjectStore, Any], list[dict[str, Any]]], store: ObjectStore, argument: Any
) -> list[dict[str, Any]] | str:
    """A lineage lookup, or what kept it from being made (the chain does not need the store)."""
    try:
        return lookup(store, argument)
    except OrlError as error:
        return f"unavailable: {error}"


async def audit_id(
    log: EventLog, index: AuditIndex, any_id: str, store: ObjectStore | None = None
) -> dict[str, Any]:
    """The chain behind an id; NotFound if the namespace has no such event or turn."""
    await index.catch_up(log)
    kind = index.event_type(any_id)
    async with EventFetcher(log, index.namespace) as fetch:
        if kind in ("TrainStepCompleted", "CheckpointPublished", "PolicyActivated"):
            event = cast(VersionEvent, await fetch.get(index, any_id))
            return await _version_chain(index, fetch, event, store)
        turn_id = index.turn_of(any_id) if kind else (any_id if index.is_turn(any_id) else None)
        if turn_id is None:
            if kind is None:
                raise NotFound(f"no event or turn with id {any_id!r} in namespace {index.namespace!r}")
            return {"id_kind": kind, "event": _event_view(await fetch.get(index, any_id))}
        chain = await _turn_chain(index, fetch, turn_id)
        return {"id_kind": kind or "turn", "id": any_id, **chain}


async def audit_session(
    log: EventLog, index: AuditIndex, session_id: str, store: ObjectStore | None = None
) -> dict[str, Any]:
    """The checkpoints a session's samples went into (and, with the store, those derived from them)."""
    await index.catch_up(log)
    samples = index.session_samples(session_id)
    if (
        not samples
        and not index.db.execute(
            "SELECT 1 FROM events WHERE session_id = ? LIMIT 1", (session_id,)
        ).fetchone()
    ):
        raise NotFound(f"no session {session_id!r} in namespace {index.namespace!r}")
    influenced: dict[tuple[str, int], dict[str, Any]] = {}
    async with EventFetcher(log, index.namespace) as fetch:
        for sample_id in samples:
            for step_id in index.linking_to(sample_id, "consumed"):
                step = cast(TrainStepCompleted, await fetch.get(index, step_id))
                key = (step["run_id"], int(step["policy_version"]))
                entry = influenced.setdefault(
                    key, {"run_id": key[0], "version": key[1], "train_step": step["step"], "samples": []}
                )
                entry["samples"].append(sample_id)
                for cid in index.by_version(key[1], "checkpoint", key[0]):
                    checkpoint = cast(CheckpointPublished, await fetch.get(index, cid))
                    entry["checkpoint_uri"] = checkpoint["uri"]
                    entry["checkpoint_event_id"] = cid
                    entry["manifest_key"] = checkpoint["manifest_key"]
    chain: dict[str, Any] = {
        "session_id": session_id,
        "samples_ready": len(samples),
        "checkpoints": [influenced[k] for k in sorted(influenced)],
    }
    keys = [c["manifest_key"] for c in chain["checkpoints"] if "manifest_key" in c]
    if store is not None and keys:
        chain["derived_checkpoints"] = _lineage(checkpoint_descendants, store, keys)
    return chain


Add = Callable[[int, str], None]  # one line of the rendered chain, at an indent


def render_chain(chain: dict[str, Any]) -> str:
    """The chain as readable text (the JSON form is the same dict): a session's, an event's without a
    turn (a checkpoint, a train step), or a turn's."""
    lines: list[str] = []

    def add(indent: int, text: str) -> None:
        lines.append("  " * indent + text.replace("\n", "\\n"))  # one line per item

    if "session_id" in chain:
        _render_session(add, chain)
    elif "turn_id" not in chain:
        _render_event(add, chain)
    else:
        _render_turn(add, chain)
    return "\n".join(lines)


def _render_session(add: Add, chain: dict[str, Any]) -> None:
    add(0, f"session {chain['session_id']}: {chain['samples_ready']} samples ready")
    for c in chain["checkpoints"]:
        add(1, f"run {c['run_id']} v{c['version']} (step {c['train_step']}, {len(c['samples'])} samples) "
               f"{c.get('checkpoint_uri', '(no checkpoint published)')}")  # fmt: skip
    if not chain["checkpoints"]:
        add(1, "no checkpoint trained on this session yet")
    derived = chain.get("derived_checkpoints")
    for d in derived if isinstance(derived, list) else []:
        add(1, f"run {d['run_id']} v{d['version']} (started from {d['via']}) {d['manifest_key']}")
    if isinstance(derived, str):
        add(1, f"derived checkpoints {derived}")


def _render_event(add: Add, chain: dict[str, Any]) -> None:
    add(0, f"{chain['id_kind']} {chain['event']['event_id']}")
    for name, value in chain["event"].items():
        add(1, f"{name}: {value}")
    started = chain.get("started_from")
    for origin in started if isinstance(started, list) else []:
        where = origin.get("base_model") or f"run {origin['run_id']} v{origin['version']}"
        add(1, f"started from {where}")
    if isinstance(started, str):
        add(1, f"started from: {started}")
    for step in chain.get("train_steps", []):
        _render_step(add, step, 1)
    for sample in chain.get("samples", []):
        add(1, f"sample {sample['sample_id']} from turn {sample['turn_id']}")


def _render_turn(add: Add, chain: dict[str, Any]) -> None:
    add(0, f"turn {chain['turn_id']} (looked up by {chain['id_kind']} {chain['id']})")
    request, response = chain["request"], chain["response"]
    if request:
        add(1, f"request {request['event_id']} ({request['turn_kind']}, model {request['model']})")
        for message in request["messages"][-3:]:
            add(2, f"{message.get('role')}: {_short(str(message.get('content')))}")
    if response:
        add(1, f"response {response['event_id']} (policy v{response['policy_version']}, "
               f"T={response['sampling']['temperature']}): {response['response_text']}")  # fmt: skip
    for ns in chain["next_states"]:
        add(1, f"next state {ns['event_id']} ({ns['source']}, {ns['role']}): {ns['content']}")
    for vote in chain["votes"] + chain["hint_votes"]:
        score = vote["score"] if vote["parse_error"] is None else f"failed ({vote['parse_error']})"
        add(1, f"{vote['type']} {vote['event_id']} judge {vote['judge_id']} config {vote['judge_config_version']} "
               f"vote {vote['vote_index']}: score {score}" + (f", hint {vote['hint']!r}" if vote["hint"] else "")
               + _from_turn(vote))  # fmt: skip
        add(2, f"raw: {_short(vote['raw_output'])}")
    for reward in chain["rewards"]:
        judge = f", judge {reward['judge_id']}" if reward.get("judge_id") else ""
        add(1, f"reward {reward['event_id']}: {reward['reward']} by rule {reward['rule']} v{reward['rule_version']}{judge} "
               f"because {reward['reason']} (votes {reward['votes']})" + (" [promoted]" if reward["promoted"] else "")
               + _from_turn(reward))  # fmt: skip
        for part in reward.get("parts") or []:
            source = f"judge {part['judge_id']}" if part["judge_id"] else "a combined reward"
            add(2, f"part {part['reward_event_id']} ({source}): {part['reward']} x weight {part['weight']}")
        if reward.get("explanation"):
            add(2, f"= {reward['explanation']}")
    for hint in chain["hint_decisions"]:
        what = (
            f"selected {hint['hint']!r}" if hint["type"] == "HintSelected" else f"rejected: {hint['reason']}"
        )
        add(1, f"hint {hint['event_id']}: {what}")
    for teacher in chain["teacher_scores"]:
        add(1, f"teacher {teacher['event_id']} ({teacher['teacher_kind']}, v{teacher['policy_version']})")
    if not chain["samples"]:
        add(1, "no sample yet (the turn is not decided)")
    if chain["forgotten"]:
        add(1, f"{len(chain['forgotten'])} events forgotten (orl forget): "
               + ", ".join(f"{e['type']} {e['event_id']}" for e in chain["forgotten"]))  # fmt: skip
    for sample in chain["samples"]:
        if sample.get(FORGOTTEN):
            add(1, f"{sample['type']} {sample['event_id']}: payload forgotten (orl forget)")
        elif sample["type"] == "SampleRejected":
            add(1, f"sample rejected {sample['event_id']}: {sample['reason']}")
            continue
        else:
            add(1, f"sample {sample['event_id']} ({sample['method']}, reward {sample['reward']}, "
                   f"off_policy {sample['off_policy']}, promoted {sample['promoted']})")  # fmt: skip
        if not sample["training"]:
            add(2, "not trained on yet")
        for step in sample["training"]:
            _render_step(add, step, 2)


def _from_turn(view: Mapping[str, Any]) -> str:
    return f" [of turn {view['from_turn']}]" if view.get("from_turn") else ""


def _render_step(add: Add, step: dict[str, Any], indent: int) -> None:
    s = step["train_step"]
    add(indent, f"train step {s['event_id']} run {s['run_id']} step {s['step']} -> v{s['policy_version']} "
                f"(loss {s['loss']:.4f}, {s['samples_consumed']} samples)")  # fmt: skip
    for c in step["checkpoints"]:
        add(indent + 1, f"checkpoint {c['event_id']} v{c['version']} {c['kind']} {c['uri']}")
    served = step["served"]
    add(indent + 1, f"v{served['policy_version']} served {served['responses']} responses, "
                    f"activated {served['activations']} times")  # fmt: skip
    for refusal in served["refusals"]:
        add(indent + 1, f"refused by {refusal['by']} ({refusal['event_id']}): {refusal['reason']}")
    for gated in served["gate"]:
        add(indent + 1, f"{gated['decision']} by the gate against v{gated['baseline_version']} "
                        f"({gated['event_id']}): {gated['reason']}")  # fmt: skip
    for r in served["first"]:
        add(indent + 2, f"{r['turn_id']} {r['event_id']}: {r['text']}")
