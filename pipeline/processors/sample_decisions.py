"""What one judged main turn becomes for each training method: a sample, a rejection, or "wait".

Pure functions over the sample builder's turn record (see sample_builder). A record holds, once
known: "response" (exact sampled token ids, their logprobs, the temperature used, the policy
version), "reward" (RewardDecided), "hint" (HintSelected / HintRejected) and "teacher"
(TeacherScored), each with its event id and occurred_at_ms.

- binary: waits for the reward; +-1 -> sample with that reward; 0 -> rejected "reward_zero".
- opd: waits for the hint outcome (and the teacher scores if a hint was selected); sample with the
  teacher logprobs and no reward; no hint -> rejected "no_valid_hint".
- combined: waits for the reward AND the hint outcome (and the teacher if a hint was selected);
  one sample with the reward if non-zero and the teacher logprobs if any; a reward-only turn has
  teacher_logprobs None (no spurious OPD term); neither -> rejected "no_signal".
A response that cannot be trained on exactly (empty, logprobs not one per token, greedy sampling)
and teacher logprobs not aligned with the response tokens are rejected instead of padded.
Reads and writes no topics.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from typing import Any

TurnRecord = dict[str, Any]


@dataclass(frozen=True)
class Decision:
    """`reason` set: a rejection. Otherwise a sample with `reward` and/or teacher scores."""

    reason: str | None = None
    reward: float | None = None
    use_teacher: bool = False


WAIT: Decision | None = None


# A response record keeps its token arrays packed (sample_inputs.response_record): the state is
# written after every batch that touches it, and two strings cost far less to write than hundreds
# of numbers (JSON spends ~0.35 us on each float). The ids are JSON text, the logprobs the base64 of
# little-endian doubles (exact for any float). They are unpacked when a sample is built.
TOKEN_ARRAYS = ("prompt_token_ids", "response_token_ids", "response_logprobs")


def pack_token_arrays(
    prompt_ids: list[int], response_ids: list[int], logprobs: list[float]
) -> dict[str, str]:
    packed = struct.pack(f"<{len(logprobs)}d", *logprobs)
    return {
        "token_ids_json": json.dumps([prompt_ids, response_ids], separators=(",", ":")),
        "logprobs_f64": base64.b64encode(packed).decode("ascii"),
    }


def response_arrays(response: dict[str, Any]) -> dict[str, list[Any]]:
    """The token arrays of a response record (inline in a state stored before they were packed)."""
    if "token_ids_json" not in response:
        return {name: response[name] for name in TOKEN_ARRAYS}
    prompt_ids, response_ids = json.loads(response["token_ids_json"])
    raw = base64.b64decode(response["logprobs_f64"])
    logprobs = list(struct.unpack(f"<{len(raw) // 8}d", raw))
    return {"prompt_token_ids": prompt_ids, "response_token_ids": response_ids, "response_logprobs": logprobs}


def arrays_problem(token_ids: list[int], logprobs: list[float], temperature: float) -> str | None:
    """Why sampled tokens cannot become an exact training sample, or None."""
    if not token_ids:
        return "empty_response"
    if len(logprobs) != len(token_ids):
        return "logprobs_misaligned"
    if temperature <= 0:
        return "greedy_sampling"
    return None


def response_problem(response: dict[str, Any]) -> str | None:
    """Why a response cannot become an exact training sample, or None (decided when recorded)."""
    if "problem" in response:
        problem: str | None = response["problem"]
        return problem
    arrays = response_arrays(response)
    return arrays_problem(arrays["response_token_ids"], arrays["response_logprobs"], response["temperature"])


def teacher_problem(turn: TurnRecord) -> str | None:
    teacher, response, hint = turn["teacher"], turn["response"], turn["hint"]
    if teacher["hint_event_id"] != hint["event_id"]:
        return "teacher_for_another_hint"
    token_ids = response_arrays(response)["response_token_ids"]
    if teacher["response_token_ids"] != token_ids:
        return "teacher_tokens_differ"
    if len(teacher["teacher_logprobs"]) != len(token_ids):
        return "teacher_misaligned"
    return None


def hint_ready(turn: TurnRecord) -> bool:
    """The hint outcome is known and, if a hint was selected, so are the teacher scores."""
    hint = turn["hint"]
    return hint is not None and (not hint["selected"] or turn["teacher"] is not None)


def decide_binary(turn: TurnRecord) -> Decision | None:
    if turn["reward"] is None:
        return WAIT
    reward = float(turn["reward"]["reward"])
    return Decision(reward=reward) if reward != 0 else Decision(reason="reward_zero")


def decide_opd(turn: TurnRecord) -> Decision | None:
    if not hint_ready(turn):
        return WAIT
    if not turn["hint"]["selected"]:
        return Decision(reason="no_valid_hint")
    problem = teacher_problem(turn)
    return Decision(reason=problem) if problem else Decision(use_teacher=True)


def decide_combined(turn: TurnRecord) -> Decision | None:
    if turn["reward"] is None or not hint_ready(turn):
        return WAIT
    reward = float(turn["reward"]["reward"])
    use_teacher = bool(turn["hint"]["selected"]) and teacher_problem(turn) is None
    if reward == 0 and not use_teacher:
        return Decision(reason="no_signal")
    return Decision(reward=reward if reward != 0 else None, use_teacher=use_teacher)


DECIDERS = {"binary": decide_binary, "opd": decide_opd, "combined": decide_combined}


def decide_turn(turn: TurnRecord, method: str) -> Decision | None:
    """The decision for a main turn whose response is known, or None to keep waiting."""
    decision = DECIDERS[method](turn)
    if decision is None:
        return WAIT
    problem = response_problem(turn["response"])
    return Decision(reason=problem) if problem else decision


# The inputs each method waits for: only these go into a sample's lineage and occurred_at, so
# an input the method ignores (a hint under binary) never makes the output depend on arrival order.
METHOD_INPUTS = {"binary": ("reward",), "opd": ("hint", "teacher"), "combined": ("reward", "hint", "teacher")}


def used_inputs(turn: TurnRecord, method: str) -> dict[str, dict[str, Any]]:
    return {name: turn[name] for name in METHOD_INPUTS[method] if turn.get(name) is not None}


def lineage(turn: TurnRecord, method: str, reward_event_id: str | None = None) -> dict[str, Any]:
    """The ids a sample was built from; `reward_event_id` overrides the turn's (promotion)."""
    used = {name: str(record["event_id"]) for name, record in used_inputs(turn, method).items()}
    return {
        "request_event_id": turn["request_event_id"],
        "response_event_id": turn["response"]["event_id"],
        "next_state_event_id": turn.get("next_state_event_id"),
        "reward_event_id": reward_event_id if reward_event_id is not None else used.get("reward"),
        "hint_event_id": used.get("hint"),
        "teacher_event_id": used.get("teacher"),
    }


def sample_payload(
    turn: TurnRecord, method: str, decision: Decision, *, promoted: bool, reward_event_id: str | None = None
) -> dict[str, Any]:
    """The SampleReady fields (besides the envelope) of a turn."""
    response = turn["response"]
    arrays = response_arrays(response)
    teacher = turn["teacher"] if decision.use_teacher else None
    return {
        "method": method,
        "prompt_token_ids": arrays["prompt_token_ids"],
        "response_token_ids": arrays["response_token_ids"],
        "old_logprobs": arrays["response_logprobs"],
        "temperature": response["temperature"],
        "reward": decision.reward,
        "teacher_logprobs": teacher["teacher_logprobs"] if teacher else None,
        "teacher_kind": teacher["teacher_kind"] if teacher else None,
        "policy_version": response["policy_version"],
        "promoted": promoted,
        "off_policy": response["off_policy"],
        "lineage": lineage(turn, method, reward_event_id),
    }


def inputs_occurred_at_ms(turn: TurnRecord, method: str) -> int:
    """The latest occurred_at among the inputs the method used: independent of their arrival order."""
    times = [int(record["occurred_at_ms"]) for record in used_inputs(turn, method).values()]
    return max([int(turn["response"]["occurred_at_ms"]), *times])
