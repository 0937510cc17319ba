"""Rule judges over the user's next message: read it like the PRM and hint-judge prompts do, no LLM.

A small model on a CPU cannot judge reliably (SmolLM2-135M's votes mostly fail to parse), so these
built-in rule judges (pipeline/effects/rule_judges.py) are what `orl up` and the demo use without a
judge endpoint. Like the real judges, they take their signal from the user's reaction (the next
state), never from the response's style: `request_messages` and `response_text` are accepted for
the common judge signature and deliberately ignored.

- `user_reply_judge`: +1 when the reply is satisfied (thanks, "exactly", "perfect"), -1 when it asks for a
  redo or corrects (redo, "try again", "too long", "don't ..."), else 0. A correction wins over thanks
  ("Thanks, but it's too long" is -1).
- `user_hint_extractor`: (1, hint) when the reply contains a directive correction; the hint is its
  directive sentences (at most 3), rewritten as instructions to the assistant ("Please keep it short."
  gives "Keep it short."). Otherwise (-1, None).

The next state is the NextStateObserved payload (a mapping whose "content" is the text) or the text.
Keyword patterns are fixed and case-insensitive, so the judges are deterministic.
Reads and writes no topics or object keys.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

CORRECTION = re.compile(
    r"\b(redo|re-do|try (that |it )?again|not quite|not like that|not what i|differently|too long|too short|"
    r"instead|don't|do not|leave out|drop the|skip the|stick to|actually answer|under \d+ words|shorter|"
    r"the problem is|wrong|doesn't|does not|isn't|is not right)\b",
    re.IGNORECASE,
)
SATISFIED = re.compile(
    r"\b(thanks|thank you|exactly|perfect|just right|helpful|that works|great|just what i|looking for|"
    r"well done|love it)\b",
    re.IGNORECASE,
)
# An actionable sentence: it tells the assistant what to do (or not do) next time.
DIRECTIVE = re.compile(
    r"\b(please|don't|do not|keep it|answer in|write|leave out|drop the|skip the|stick to|mention|"
    r"point to|make it|say something|under \d+ words)\b",
    re.IGNORECASE,
)
_LEAD_IN = re.compile(
    r"^(next time,?\s+|from now on,?\s+|can you\s+|could you\s+|would you\s+)*(please,?\s+)?", re.IGNORECASE
)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
MAX_HINT_SENTENCES = 3
MIN_HINT_CHARS = 11  # the OPD hint selector drops hints of 10 characters or fewer


def next_state_content(next_state: Mapping[str, Any] | str) -> str:
    """The text of a next state: its "content" field, or the string itself."""
    if isinstance(next_state, str):
        return next_state
    content = next_state.get("content")
    return content if isinstance(content, str) else ""


def user_reply_judge(
    request_messages: Sequence[Mapping[str, Any]], response_text: str, next_state: Mapping[str, Any] | str
) -> tuple[int, str]:
    """(+1 | 0 | -1, explanation) from the user's next message alone; see the module docstring."""
    text = next_state_content(next_state)
    correction = CORRECTION.search(text)
    if correction:
        return -1, f"the user asked for a redo or corrected the response ({correction.group(0)!r})"
    satisfied = SATISFIED.search(text)
    if satisfied:
        return 1, f"the user was satisfied ({satisfied.group(0)!r})"
    return 0, "the user's reply shows neither satisfaction nor a correction"


def user_hint_extractor(
    request_messages: Sequence[Mapping[str, Any]], response_text: str, next_state: Mapping[str, Any] | str
) -> tuple[int, str | None, str]:
    """(1, hint, explanation) for a directive correction, else (-1, None, explanation)."""
    text = next_state_content(next_state)
    if not CORRECTION.search(text):
        return -1, None, "the user's reply corrects nothing, so there is no hindsight hint"
    directives = [as_instruction(s) for s in sentences(text) if DIRECTIVE.search(s)]
    hint = " ".join(directives[:MAX_HINT_SENTENCES])
    if len(hint) < MIN_HINT_CHARS:
        return -1, None, "the user corrected the response but said nothing actionable"
    return 1, hint, f"hint from the user's directive correction ({len(directives)} sentence(s))"


def sentences(text: str) -> list[str]:
    """The text split after '.', '!' or '?' followed by whitespace; empty pieces dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def as_instruction(sentence: str) -> str:
    """A user's request as an instruction: lead-ins ("Next time, please", "Can you") removed, ends with '.'."""
    core = _LEAD_IN.sub("", sentence).rstrip(" ?!.")
    if not core:
        return ""
    return core[0].upper() + core[1:] + "."
