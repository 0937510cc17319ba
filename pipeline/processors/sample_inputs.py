"""Layer 1 of sample_builder: the session's recorded inputs, their codec, and recording one event.

The state of one session is a frozen `SessionSamples`: recording an event returns a new one. Per
turn (`Turn`) it holds, once known: index, kind, the request's event id, the `Response` (exact
sampled token ids, their logprobs, the temperature used, the policy version), the next states (the
earliest one's event id is the lineage's), the `Reward`, the `Hint` outcome, the `Teacher` scores,
and whether the turn is decided; under the step_outcome rule also each judge's reward
(`judge_rewards`). The first reward / hint outcome / teacher score of a turn wins; later ones
(another judge, a re-judge in the same namespace) are logged and ignored. Under step_outcome the
valid reward (not "no_valid_votes") with the earliest (occurred_at, event id) counts per judge,
and only a group's normalised reward is the turn's own. A request's rollout group (id, size) is
the session's. Decided turns ignore further inputs. SessionClosed records the close.

A response keeps its token arrays packed (`PackedArrays`, with `PipelineConfig.compact_states`):
the state is written after every batch that touches it, and two strings cost far less to write than
hundreds of numbers (JSON spends ~0.35 us on each float). The ids are JSON text, the logprobs the
base64 of little-endian doubles (exact for any float); sample_decisions unpacks them when it decides.

`SAMPLE_STATE` is the codec (state_codec.frozen_state); states the dict state stored before
2026-12-02 keep loading (`response_layout`). Calls only event_building (envelopes); reads and writes no topics.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from orl.pipeline.processors.config import GROUP_RULE, PipelineConfig, RewardRuleConfig
from orl.pipeline.processors.event_building import (
    Event,
    emitted_by,
    event_id_of,
    event_type_of,
    namespace_of,
    occurred_at_of,
    remembered,
    session_id_of,
    turn_id_of,
)
from orl.pipeline.processors.state_codec import evolved, frozen_state
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

NAME = "sample_builder"
NO_VALID_VOTES = "no_valid_votes"


@dataclass(frozen=True)
class PackedArrays:
    token_ids_json: str  # [prompt ids, response ids] as compact JSON
    logprobs_f64: str  # base64 of the little-endian doubles


@dataclass(frozen=True)
class InlineArrays:
    prompt_token_ids: Sequence[int]
    response_token_ids: Sequence[int]
    response_logprobs: Sequence[float]


@dataclass(frozen=True)
class Response:
    event_id: str
    occurred_at_ms: int
    arrays: PackedArrays | InlineArrays
    problem: str | None  # why it cannot make an exact sample (decided when recorded), or None
    temperature: float
    policy_version: int
    off_policy: bool  # more than one policy produced the tokens (a checkpoint swap mid-response)
    policy_run: str | None = (
        None  # the run whose policy_version it is (None: recorded before servers named it)
    )


@dataclass(frozen=True)
class Reward:
    """A RewardDecided; `reason` is kept for a judge's reward under the step_outcome rule."""

    event_id: str
    occurred_at_ms: int
    reward: float
    votes: Sequence[int | None]
    vote_ids: Sequence[str]
    judge_id: str | None
    reason: str | None = None


@dataclass(frozen=True)
class Hint:
    event_id: str
    occurred_at_ms: int
    selected: bool
    reason: str | None


@dataclass(frozen=True)
class Teacher:
    event_id: str
    occurred_at_ms: int
    hint_event_id: str
    teacher_kind: str
    response_token_ids: Sequence[int]
    teacher_logprobs: Sequence[float]
    # top-K distillation data; events (and states) written before it existed read None here
    teacher_top_ids: Sequence[Sequence[int]] | None = None
    teacher_top_logprobs: Sequence[Sequence[float]] | None = None


@dataclass(frozen=True)
class Turn:
    index: int | None = None
    kind: str | None = None
    request_event_id: str | None = None
    response: Response | None = None
    next_states: tuple[tuple[int, str], ...] = ()  # (occurred_at, event id), earliest first
    next_state_event_id: str | None = None
    reward: Reward | None = None
    hint: Hint | None = None
    teacher: Teacher | None = None
    decided: bool = False
    judge_rewards: Mapping[str, Reward] = field(default_factory=dict)  # step_outcome: judge id -> reward


@dataclass(frozen=True)
class Closed:
    event_id: str
    last_turn_id: str | None
    occurred_at_ms: int


@dataclass(frozen=True)
class Group:
    id: str
    size: int | None


@dataclass(frozen=True)
class SessionSamples:
    """One session's state: `seen` is the bounded redelivery memory; `request_turns` maps request
    ids to turn ids; `waiting_responses` holds responses read before their request."""

    namespace: str
    session_id: str | None
    seen: tuple[str, ...] = ()
    turns: Mapping[str, Turn] = field(default_factory=dict)
    request_turns: Mapping[str, str] = field(default_factory=dict)
    waiting_responses: Mapping[str, Response] = field(default_factory=dict)
    ready_count: int = 0
    closed: Closed | None = None
    finalized: bool = False
    group: Group | None = None


class Recorded(NamedTuple):  # a tuple: one is made per event, and tuples are the cheapest to make
    """What recording one event gave: the new state, the turn it touched (None: no turn), and
    whether anything may now be decided (False: a redelivery, an own output, an ignored type)."""

    state: SessionSamples
    turn_id: str | None
    may_decide: bool


def record(state: SessionSamples | None, event: Event, config: PipelineConfig) -> Recorded:
    """`event` recorded into its session's state (None: nothing stored yet)."""
    if state is None:
        state = SessionSamples(namespace=namespace_of(event), session_id=session_id_of(event))
    seen = remembered(state.seen, event_id_of(event), config.seen_window)
    if seen is None:
        return Recorded(state, None, False)
    state = evolved(state, seen=seen)
    event_type = event_type_of(event)
    if emitted_by(event, NAME) or event_type not in RECORDED_TYPES:
        return Recorded(state, None, False)
    if event_type == "ResponseGenerated":
        state, turn_id = record_response(state, cast(ResponseGenerated, event), config.compact_states)
    elif event_type == "RewardDecided":
        state, turn_id = record_reward(state, cast(RewardDecided, event), config.rewards)
    elif event_type == "RequestReceived":
        state, turn_id = record_request(state, cast(RequestReceived, event))
    elif event_type == "NextStateObserved":
        state, turn_id = record_next_state(state, cast(NextStateObserved, event))
    elif event_type == "HintSelected":
        hint_selected = cast(HintSelected, event)
        state, turn_id = record_hint(state, hint_selected, selected=True, reason=None)
    elif event_type == "HintRejected":
        hint_rejected = cast(HintRejected, event)
        state, turn_id = record_hint(state, hint_rejected, selected=False, reason=hint_rejected["reason"])
    elif event_type == "TeacherScored":
        state, turn_id = record_teacher(state, cast(TeacherScored, event))
    else:
        state, turn_id = record_close(state, cast(SessionClosed, event))
    return Recorded(state, turn_id, True)


RECORDED_TYPES = frozenset(
    (
        "RequestReceived",
        "ResponseGenerated",
        "NextStateObserved",
        "RewardDecided",
        "HintSelected",
        "HintRejected",
        "TeacherScored",
        "SessionClosed",
    )
)


def with_turn(state: SessionSamples, turn_id: str, turn: Turn) -> SessionSamples:
    """The state with `turn` as the record of `turn_id` (the state itself if it already is)."""
    if state.turns.get(turn_id) is turn:
        return state
    return evolved(state, turns={**state.turns, turn_id: turn})


def record_request(state: SessionSamples, event: RequestReceived) -> tuple[SessionSamples, str | None]:
    request_id = event["request_id"]
    turn_id = turn_id_of(event) or request_id
    turn = evolved(
        state.turns.get(turn_id, Turn()),
        index=int(event["turn_index"]),
        kind=event["turn_kind"],
        request_event_id=event_id_of(event),
    )
    group = state.group
    group_id = event["group_id"]
    if group_id is not None and group is None:
        group = Group(group_id, event["group_size"])
    waiting = dict(state.waiting_responses)
    response = waiting.pop(request_id, None)
    if response is not None and not turn.decided:
        turn = evolved(turn, response=response)
    state = evolved(
        state,
        turns={**state.turns, turn_id: turn},
        request_turns={**state.request_turns, request_id: turn_id},
        group=group,
        waiting_responses=waiting,
    )
    return state, turn_id


def response_of(event: ResponseGenerated, packed: bool) -> Response:
    """The exact sampled ids and their logprobs, the temperature they were sampled at, and whether
    they can make an exact sample at all."""
    prompt_ids, response_ids = list(event["prompt_token_ids"]), list(event["response_token_ids"])
    logprobs = list(event["response_logprobs"])
    temperature = float(event["sampling"]["temperature"])
    return Response(
        event_id=event_id_of(event),
        occurred_at_ms=occurred_at_of(event),
        arrays=pack_token_arrays(prompt_ids, response_ids, logprobs)
        if packed
        else InlineArrays(prompt_ids, response_ids, logprobs),
        problem="constrained_decoding"
        if event["sampling"]["constraint"]
        else arrays_problem(response_ids, logprobs, temperature),
        temperature=temperature,
        policy_version=int(event["policy_version"]),
        off_policy=bool(event["policy_spans"]),
        policy_run=event["policy_run"],
    )


def record_response(
    state: SessionSamples, event: ResponseGenerated, packed: bool
) -> tuple[SessionSamples, str | None]:
    request_id = event["request_id"]
    turn_id = state.request_turns.get(request_id)
    if turn_id is None:
        waiting = {**state.waiting_responses, request_id: response_of(event, packed)}
        return evolved(state, waiting_responses=waiting), None
    turn = state.turns.get(turn_id, Turn())
    if not turn.decided:
        turn = evolved(turn, response=response_of(event, packed))
    return with_turn(state, turn_id, turn), turn_id


def record_next_state(state: SessionSamples, event: NextStateObserved) -> tuple[SessionSamples, str | None]:
    """Next states are kept by (occurred_at, id); the earliest is the sample's lineage next state.

    RewardDecided does not name the next state it judged, so waiting for one here also makes
    the lineage independent of arrival order.
    """
    turn_id = turn_id_of(event)
    if turn_id is None:
        return state, None
    turn = state.turns.get(turn_id, Turn())
    if not turn.decided:
        next_states = tuple(sorted((*turn.next_states, (occurred_at_of(event), event_id_of(event)))))
        turn = evolved(turn, next_states=next_states, next_state_event_id=next_states[0][1])
    return with_turn(state, turn_id, turn), turn_id


def named_turn(state: SessionSamples, event: Mapping[str, Any]) -> tuple[str | None, Turn]:
    """The id of the turn an input names, and its record (a new one if the turn is not known yet)."""
    turn_id = turn_id_of(event)
    return turn_id, Turn() if turn_id is None else state.turns.get(turn_id, Turn())


def record_reward(
    state: SessionSamples, event: RewardDecided, rules: RewardRuleConfig
) -> tuple[SessionSamples, str | None]:
    turn_id, turn = named_turn(state, event)
    if turn_id is None:
        return state, None
    reward = Reward(
        event_id=event_id_of(event),
        occurred_at_ms=occurred_at_of(event),
        reward=float(event["reward"]),
        votes=list(event["votes"]),
        vote_ids=list(event["vote_ids"]),
        judge_id=event["judge_id"],
    )
    if rules.rule == "single" or event["rule"] == GROUP_RULE:
        if turn.decided:
            return with_turn(state, turn_id, turn), turn_id
        if turn.reward is not None:
            logger.info("turn %s: ignoring another reward %s", turn_id, reward.event_id)
            return with_turn(state, turn_id, turn), turn_id
        return with_turn(state, turn_id, evolved(turn, reward=reward)), turn_id
    judge_id = reward.judge_id
    if judge_id not in (rules.process_judge_id, rules.outcome_judge_id):
        logger.info("turn %s: ignoring reward %s of judge %s", turn_id, reward.event_id, judge_id)
        return state, turn_id
    if turn.decided:
        return with_turn(state, turn_id, turn), turn_id
    candidate = evolved(reward, reason=event["reason"])
    if judge_id is not None and better_reward(turn.judge_rewards.get(judge_id), candidate):
        turn = evolved(turn, judge_rewards={**turn.judge_rewards, judge_id: candidate})
    return with_turn(state, turn_id, turn), turn_id


def better_reward(current: Reward | None, candidate: Reward) -> bool:
    """Does `candidate` replace a judge's `current` reward of a turn? Valid beats invalid, then the
    earliest (occurred_at, event id): the choice does not depend on arrival order."""
    if current is None:
        return True
    current_valid, candidate_valid = current.reason != NO_VALID_VOTES, candidate.reason != NO_VALID_VOTES
    if current_valid != candidate_valid:
        return candidate_valid
    return (candidate.occurred_at_ms, candidate.event_id) < (current.occurred_at_ms, current.event_id)


def record_hint(
    state: SessionSamples, event: HintSelected | HintRejected, *, selected: bool, reason: str | None
) -> tuple[SessionSamples, str | None]:
    turn_id, turn = named_turn(state, event)
    if turn_id is None:
        return state, None
    if not turn.decided and turn.hint is not None:
        logger.info("turn %s: ignoring another hint %s", turn_id, event_id_of(event))
    elif not turn.decided:
        turn = evolved(turn, hint=Hint(event_id_of(event), occurred_at_of(event), selected, reason))
    return with_turn(state, turn_id, turn), turn_id


def record_teacher(state: SessionSamples, event: TeacherScored) -> tuple[SessionSamples, str | None]:
    turn_id, turn = named_turn(state, event)
    if turn_id is None:
        return state, None
    if not turn.decided and turn.teacher is not None:
        logger.info("turn %s: ignoring another teacher %s", turn_id, event_id_of(event))
    elif not turn.decided:
        teacher = Teacher(
            event_id=event_id_of(event),
            occurred_at_ms=occurred_at_of(event),
            hint_event_id=event["hint_event_id"],
            teacher_kind=event["teacher_kind"],
            response_token_ids=list(event["response_token_ids"]),
            teacher_logprobs=list(event["teacher_logprobs"]),
            teacher_top_ids=event["teacher_top_ids"],
            teacher_top_logprobs=event["teacher_top_logprobs"],
        )
        turn = evolved(turn, teacher=teacher)
    return with_turn(state, turn_id, turn), turn_id


def record_close(state: SessionSamples, event: SessionClosed) -> tuple[SessionSamples, str | None]:
    """A (re)close: the session may now be finalized (sample_decisions.settle)."""
    closed = Closed(event_id_of(event), event["last_turn_id"], occurred_at_of(event))
    return evolved(state, closed=closed, finalized=False), None


def pack_token_arrays(prompt_ids: list[int], response_ids: list[int], logprobs: list[float]) -> PackedArrays:
    packed = struct.pack(f"<{len(logprobs)}d", *logprobs)
    return PackedArrays(
        token_ids_json=json.dumps([prompt_ids, response_ids], separators=(",", ":")),
        logprobs_f64=base64.b64encode(packed).decode("ascii"),
    )


def arrays_problem(token_ids: Sequence[int], logprobs: Sequence[float], temperature: float) -> str | None:
    """Why sampled tokens cannot become an exact training sample, or None."""
    if not token_ids:
        return "empty_response"
    if len(logprobs) != len(token_ids):
        return "logprobs_misaligned"
    if temperature <= 0:
        return "greedy_sampling"
    return None


def response_layout(raw: dict[str, Any]) -> dict[str, Any]:
    """A response record as the dict state stored it (before 2026-12-02): its token arrays inline in
    it and, before 2026-11-22, inline lists and no "problem"."""
    if "arrays" in raw:
        return raw
    names = ("token_ids_json", "logprobs_f64") if "token_ids_json" in raw else INLINE_ARRAYS
    upgraded = {name: value for name, value in raw.items() if name not in names}
    upgraded["arrays"] = {name: raw[name] for name in names}
    if "problem" not in raw:
        upgraded["problem"] = arrays_problem(
            raw["response_token_ids"], raw["response_logprobs"], raw["temperature"]
        )
    return upgraded


INLINE_ARRAYS = ("prompt_token_ids", "response_token_ids", "response_logprobs")
SAMPLE_STATE = frozen_state(SessionSamples, upgrades={Response: response_layout})
