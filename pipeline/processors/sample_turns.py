"""The sample builder's turn record: its fields and the packed token arrays of its response.

The bottom layer under sample_inputs (which fills records), sample_decisions (which decides on them)
and sample_events (which turns them into events); it calls nothing of ours. A record holds, once
known: index, kind, request_event_id, "response" (exact sampled token ids, their logprobs, the
temperature used, the policy version), next_states (and the earliest one's event id), "reward"
(RewardDecided), "hint" (HintSelected / HintRejected), "teacher" (TeacherScored), and decided;
under the step_outcome rule also "judge_rewards" (judge id -> its RewardDecided), added when the
first one arrives, so the default rule's states stay as small as before.
Reads and writes no topics.
"""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

TurnRecord = dict[str, Any]


def new_turn() -> TurnRecord:
    return {
        "index": None,
        "kind": None,
        "request_event_id": None,
        "response": None,
        "next_states": [],
        "next_state_event_id": None,
        "reward": None,
        "hint": None,
        "teacher": None,
        "decided": False,
    }


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
