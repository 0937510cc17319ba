"""Rule judges: plain functions that score a turn without a model, and how they are found.

A rule judge is a callable `(request_messages, response_text, next_state) -> (score, explanation)`
with score in {-1, 0, 1} or None (cannot tell). Plugins register one under the entry-point group
"orl.judges" (e.g. `[project.entry-points."orl.judges"] my_judge = "pkg.mod:judge"`). Built in:

- `outcome`: the next state's structured outcome (an explicit reward, thumbs, tests, an exit code);
- `user_reply`: the user's next message, by keywords (pipeline/effects/reply_rules.py);
- `reaction`: `outcome` when the next state carries one, else `user_reply`: every signal that is
  real without a capable judge model (`orl up`'s default when no judge endpoint is given).

And one hint extractor, `user_hint` (directive corrections in the user's next message). The judge
effect stage casts one JudgeVoteCast (judge_kind "rule") per rule judge; vote_tally turns it into a
RewardDecided with reason "outcome".
Reads and writes no topics.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from orl.pipeline.effects.reply_rules import user_hint_extractor, user_reply_judge
from orl.schemas.errors import ConfigError
from orl.schemas.messages import Message

ENTRY_POINT_GROUP = "orl.judges"
HINT_ENTRY_POINT_GROUP = "orl.hint_extractors"

RuleJudge = Callable[[list[Message], str, dict[str, Any]], tuple[int | None, str]]
# (request_messages, response_text, next_state) -> (score 1/-1 or None, hint or None, explanation)
HintExtractor = Callable[[list[Message], str, dict[str, Any]], tuple[int | None, str | None, str]]


def sign(value: float) -> int:
    return (value > 0) - (value < 0)


def outcome_judge(
    request_messages: list[Message], response_text: str, next_state: dict[str, Any]
) -> tuple[int | None, str]:
    """Score from the next state's outcome: explicit reward, then thumbs, then tests, then exit code."""
    outcome = next_state.get("outcome")
    if not outcome:
        return None, "the next state carries no outcome"
    if outcome.get("reward") is not None:
        return sign(float(outcome["reward"])), f"outcome reward {outcome['reward']}"
    if outcome.get("thumbs") is not None:
        return sign(int(outcome["thumbs"])), f"thumbs {outcome['thumbs']:+d}"
    tests = _tests_verdict(outcome)
    if tests is not None:
        return tests
    if outcome.get("exit_code") is not None:
        code = int(outcome["exit_code"])
        return (1 if code == 0 else -1), f"exit code {code}"
    return None, f"outcome of kind {outcome.get('kind')!r} has no reward, thumbs, tests or exit code"


def _tests_verdict(outcome: dict[str, Any]) -> tuple[int, str] | None:
    passed, failed, errors = (outcome.get(key) for key in ("passed", "failed", "errors"))
    if passed is None and failed is None and errors is None:
        return None
    summary = f"tests passed={passed} failed={failed} errors={errors}"
    if (failed or 0) > 0 or (errors or 0) > 0:
        return -1, summary
    if (passed or 0) > 0:
        return 1, summary
    return 0, summary


def reaction_judge(
    request_messages: list[Message], response_text: str, next_state: dict[str, Any]
) -> tuple[int | None, str]:
    """The next state's outcome when it carries one (feedback routes, connectors), else the user's reply."""
    if next_state.get("outcome"):
        return outcome_judge(request_messages, response_text, next_state)
    return user_reply_judge(request_messages, response_text, next_state)


BUILT_IN_RULE_JUDGES: dict[str, RuleJudge] = {
    "outcome": outcome_judge,
    "user_reply": user_reply_judge,
    "reaction": reaction_judge,
}
BUILT_IN_HINT_EXTRACTORS: dict[str, HintExtractor] = {"user_hint": user_hint_extractor}


def load_rule_judge(name: str) -> RuleJudge:
    """A built-in rule judge, or one registered under the "orl.judges" entry-point group."""
    if name in BUILT_IN_RULE_JUDGES:
        return BUILT_IN_RULE_JUDGES[name]
    judge: RuleJudge = _load_entry_point(ENTRY_POINT_GROUP, name, sorted(BUILT_IN_RULE_JUDGES))
    return judge


def load_hint_extractor(name: str) -> HintExtractor:
    """A built-in hint extractor, or one registered under the "orl.hint_extractors" entry-point group."""
    if name in BUILT_IN_HINT_EXTRACTORS:
        return BUILT_IN_HINT_EXTRACTORS[name]
    extractor: HintExtractor = _load_entry_point(
        HINT_ENTRY_POINT_GROUP, name, sorted(BUILT_IN_HINT_EXTRACTORS)
    )
    return extractor


def _load_entry_point(group: str, name: str, built_in: list[str]) -> Any:
    for entry_point in entry_points(group=group):
        if entry_point.name == name:
            return entry_point.load()
    known = built_in + sorted(ep.name for ep in entry_points(group=group))
    raise ConfigError(f"no entry point {name!r} in group {group!r}; known: {', '.join(known) or 'none'}")
