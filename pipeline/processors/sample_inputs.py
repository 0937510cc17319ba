"""Layer 1 of sample_builder: recording one input event into the session state (see sample_builder).

Each recorder stores what a sample needs from one event type and returns the turn id it touched
(None: no turn to decide). The first reward / hint outcome / teacher score of a turn wins;
later ones (another judge, a re-judge in the same namespace) are logged and ignored. Decided
turns ignore further inputs. SessionClosed records the close (and touches no turn).
Calls only event_building (envelopes) and sample_turns (the record format); reads and writes no
topics itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pipeline.processors.event_building import Event, State, event_id_of, occurred_at_of, turn_id_of
from pipeline.processors.sample_turns import (
    TOKEN_ARRAYS,
    TurnRecord,
    arrays_problem,
    new_turn,
    pack_token_arrays,
)

logger = logging.getLogger(__name__)


def open_turn(state: State, turn_id: str) -> TurnRecord:
    turn: TurnRecord = state["turns"].setdefault(turn_id, new_turn())
    return turn


def record_request(state: State, event: Event) -> str | None:
    turn_id = turn_id_of(event) or event["request_id"]
    turn = open_turn(state, turn_id)
    turn.update(index=int(event["turn_index"]), kind=event["turn_kind"], request_event_id=event_id_of(event))
    state["request_turns"][event["request_id"]] = turn_id
    waiting = state["waiting_responses"].pop(event["request_id"], None)
    if waiting is not None and not turn["decided"]:
        turn["response"] = waiting
    return turn_id


def response_record(event: Event, packed: bool = True) -> dict[str, Any]:
    """The exact sampled ids and their logprobs (`packed`: sample_turns.pack_token_arrays), the
    temperature they were sampled at, and whether they can make an exact sample at all."""
    arrays = [list(event[name]) for name in TOKEN_ARRAYS]
    temperature = float(event["sampling"]["temperature"])
    return {
        "event_id": event_id_of(event),
        "occurred_at_ms": occurred_at_of(event),
        **(pack_token_arrays(*arrays) if packed else dict(zip(TOKEN_ARRAYS, arrays, strict=True))),
        "problem": arrays_problem(arrays[1], arrays[2], temperature),
        "temperature": temperature,
        "policy_version": int(event["policy_version"]),
        # More than one policy produced the tokens (a checkpoint swap mid-response).
        "off_policy": bool(event.get("policy_spans")),
    }


def record_response(state: State, event: Event, packed: bool = True) -> str | None:
    turn_id = state["request_turns"].get(event["request_id"])
    if turn_id is None:
        state["waiting_responses"][event["request_id"]] = response_record(event, packed)
        return None
    turn = open_turn(state, turn_id)
    if not turn["decided"]:
        turn["response"] = response_record(event, packed)
    return turn_id


def record_next_state(state: State, event: Event) -> str | None:
    """Next states are kept by (occurred_at, id); the earliest is the sample's lineage next state.

    RewardDecided does not name the next state it judged, so waiting for one here also makes
    the lineage independent of arrival order.
    """
    turn_id = turn_id_of(event)
    if turn_id is None:
        return None
    turn = open_turn(state, turn_id)
    if not turn["decided"]:
        turn["next_states"] = sorted([*turn["next_states"], [occurred_at_of(event), event_id_of(event)]])
        turn["next_state_event_id"] = turn["next_states"][0][1]
    return turn_id


def set_first(state: State, event: Event, part: str, record: dict[str, Any]) -> str | None:
    turn_id = turn_id_of(event)
    if turn_id is None:
        return None
    turn = open_turn(state, turn_id)
    if turn["decided"]:
        return turn_id
    if turn[part] is not None:
        logger.info("turn %s: ignoring another %s %s", turn_id, part, event_id_of(event))
        return turn_id
    turn[part] = {"event_id": event_id_of(event), "occurred_at_ms": occurred_at_of(event), **record}
    return turn_id


def record_reward(state: State, event: Event) -> str | None:
    record = {
        "reward": float(event["reward"]),
        "votes": list(event["votes"]),
        "vote_ids": list(event["vote_ids"]),
    }
    return set_first(state, event, "reward", record)


def record_hint_selected(state: State, event: Event) -> str | None:
    return set_first(state, event, "hint", {"selected": True, "reason": None})


def record_hint_rejected(state: State, event: Event) -> str | None:
    return set_first(state, event, "hint", {"selected": False, "reason": event["reason"]})


def record_teacher(state: State, event: Event) -> str | None:
    record = {
        "hint_event_id": event["hint_event_id"],
        "teacher_kind": event["teacher_kind"],
        "response_token_ids": list(event["response_token_ids"]),
        "teacher_logprobs": list(event["teacher_logprobs"]),
    }
    return set_first(state, event, "teacher", record)


def record_close(state: State, event: Event) -> str | None:
    """A (re)close: the session may now be finalized (sample_decisions.settle)."""
    state["closed"] = {
        "event_id": event_id_of(event),
        "last_turn_id": event.get("last_turn_id"),
        "occurred_at_ms": occurred_at_of(event),
    }
    state["finalized"] = False
    return None


INPUT_RECORDERS: dict[str, Callable[[State, Event], str | None]] = {  # ResponseGenerated: record_response
    "RequestReceived": record_request,
    "NextStateObserved": record_next_state,
    "RewardDecided": record_reward,
    "HintSelected": record_hint_selected,
    "HintRejected": record_hint_rejected,
    "TeacherScored": record_teacher,
    "SessionClosed": record_close,
}
