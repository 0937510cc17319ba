"""Layer 1 of sample_builder: recording one input event into the session state (see sample_builder).

Each recorder stores what a sample needs from one event type and returns the turn id it touched
(None: no turn to decide). The first reward / hint outcome / teacher score of a turn wins;
later ones (another judge, a re-judge in the same namespace) are logged and ignored. Under the
step_outcome rule each judge's rewards are kept apart (step_decisions.better_reward picks one per
judge) and only a group's normalised reward is the turn's own. A request's rollout group (id,
size) is the session's. Decided
turns ignore further inputs. SessionClosed records the close (and touches no turn).
Calls only event_building (envelopes) and sample_turns (the record format); reads and writes no
topics itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from orl.pipeline.processors.config import RewardRuleConfig
from orl.pipeline.processors.event_building import AnyEvent, State, event_id_of, occurred_at_of, turn_id_of
from orl.pipeline.processors.sample_turns import (
    TOKEN_ARRAYS,
    TurnRecord,
    arrays_problem,
    new_turn,
    pack_token_arrays,
)
from orl.pipeline.processors.step_decisions import GROUP_RULE, better_reward
from orl.schemas.event_types import (
    HintRejected,
    HintSelected,
    NextStateObserved,
    RequestReceived,
    ResponseGenerated,
    RewardDecided,
    SessionClosed,
    TeacherScored,
)

logger = logging.getLogger(__name__)


def open_turn(state: State, turn_id: str) -> TurnRecord:
    turn: TurnRecord = state["turns"].setdefault(turn_id, new_turn())
    return turn


def record_request(state: State, event: RequestReceived) -> str | None:
    turn_id = turn_id_of(event) or event["request_id"]
    turn = open_turn(state, turn_id)
    turn.update(index=int(event["turn_index"]), kind=event["turn_kind"], request_event_id=event_id_of(event))
    state["request_turns"][event["request_id"]] = turn_id
    if event.get("group_id") is not None and state.get("group") is None:
        state["group"] = {"id": event["group_id"], "size": event.get("group_size")}
    waiting = state["waiting_responses"].pop(event["request_id"], None)
    if waiting is not None and not turn["decided"]:
        turn["response"] = waiting
    return turn_id


def response_record(event: ResponseGenerated, packed: bool = True) -> dict[str, Any]:
    """The exact sampled ids and their logprobs (`packed`: sample_turns.pack_token_arrays), the
    temperature they were sampled at, and whether they can make an exact sample at all."""
    # In TOKEN_ARRAYS order; named one by one so that mypy checks the field names.
    prompt_ids, response_ids = list(event["prompt_token_ids"]), list(event["response_token_ids"])
    logprobs = list(event["response_logprobs"])
    arrays = (prompt_ids, response_ids, logprobs)
    temperature = float(event["sampling"]["temperature"])
    return {
        "event_id": event_id_of(event),
        "occurred_at_ms": occurred_at_of(event),
        **(pack_token_arrays(*arrays) if packed else dict(zip(TOKEN_ARRAYS, arrays, strict=True))),
        "problem": arrays_problem(response_ids, logprobs, temperature),
        "temperature": temperature,
        "policy_version": int(event["policy_version"]),
        # More than one policy produced the tokens (a checkpoint swap mid-response).
        "off_policy": bool(event.get("policy_spans")),
    }


def record_response(state: State, event: ResponseGenerated, packed: bool = True) -> str | None:
    turn_id = state["request_turns"].get(event["request_id"])
    if turn_id is None:
        state["waiting_responses"][event["request_id"]] = response_record(event, packed)
        return None
    turn = open_turn(state, turn_id)
    if not turn["decided"]:
        turn["response"] = response_record(event, packed)
    return turn_id


def record_next_state(state: State, event: NextStateObserved) -> str | None:
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


def set_first(state: State, event: AnyEvent, part: str, record: dict[str, Any]) -> str | None:
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


def record_reward(state: State, event: RewardDecided, rules: RewardRuleConfig) -> str | None:
    record = {
        "reward": float(event["reward"]),
        "votes": list(event["votes"]),
        "vote_ids": list(event["vote_ids"]),
        "judge_id": event.get("judge_id"),
    }
    if rules.rule == "single" or event["rule"] == GROUP_RULE:
        return set_first(state, event, "reward", record)
    return record_judge_reward(state, event, record, rules)


def record_judge_reward(
    state: State, event: RewardDecided, record: dict[str, Any], rules: RewardRuleConfig
) -> str | None:
    """A judge's reward of a step (step_outcome rule), kept per judge until the session decides."""
    turn_id, judge_id = turn_id_of(event), event.get("judge_id")
    if turn_id is None:
        return None
    if judge_id not in (rules.process_judge_id, rules.outcome_judge_id):
        logger.info("turn %s: ignoring reward %s of judge %s", turn_id, event_id_of(event), judge_id)
        return turn_id
    turn = open_turn(state, turn_id)
    if turn["decided"]:
        return turn_id
    full = {
        "event_id": event_id_of(event),
        "occurred_at_ms": occurred_at_of(event),
        "reason": event["reason"],
        **record,
    }
    by_judge = turn.setdefault("judge_rewards", {})
    if better_reward(by_judge.get(judge_id), full):
        by_judge[judge_id] = full
    return turn_id


def record_hint_selected(state: State, event: HintSelected) -> str | None:
    return set_first(state, event, "hint", {"selected": True, "reason": None})


def record_hint_rejected(state: State, event: HintRejected) -> str | None:
    return set_first(state, event, "hint", {"selected": False, "reason": event["reason"]})


def record_teacher(state: State, event: TeacherScored) -> str | None:
    record = {
        "hint_event_id": event["hint_event_id"],
        "teacher_kind": event["teacher_kind"],
        "response_token_ids": list(event["response_token_ids"]),
        "teacher_logprobs": list(event["teacher_logprobs"]),
        # top-K distillation data; events written before it existed decode with None here
        "teacher_top_ids": event.get("teacher_top_ids"),
        "teacher_top_logprobs": event.get("teacher_top_logprobs"),
    }
    return set_first(state, event, "teacher", record)


def record_close(state: State, event: SessionClosed) -> str | None:
    """A (re)close: the session may now be finalized (sample_decisions.settle)."""
    state["closed"] = {
        "event_id": event_id_of(event),
        "last_turn_id": event.get("last_turn_id"),
        "occurred_at_ms": occurred_at_of(event),
    }
    state["finalized"] = False
    return None


# Dispatch on envelope.event_type: each recorder takes the TypedDict of the event type it is filed under.
INPUT_RECORDERS: dict[str, Callable[[State, Any], str | None]] = {  # and record_response, record_reward
    "RequestReceived": record_request,
    "NextStateObserved": record_next_state,
    "HintSelected": record_hint_selected,
    "HintRejected": record_hint_rejected,
    "TeacherScored": record_teacher,
    "SessionClosed": record_close,
}
