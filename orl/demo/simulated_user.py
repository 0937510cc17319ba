"""The demo's scripted user: reacts to a response like a person with the scenario's preference would.

No LLM: the reaction is chosen from phrase tables with a caller-supplied `random.Random`, so a seed
fixes the whole conversation. A response that scores 1 gets a satisfied reply; any other response gets
a redo request that says what was wrong (a complaint) and what to do instead (a directive correction
such as "Please keep it under 40 words in plain sentences and don't use bold text."), built from the
scorer's violations. The directive sentence is what the demo's hint extractor turns into an OPD hint.
With `restate_length`, a redo of an answer that was short enough also restates the word limit ("...
and keep it under 40 words"), as a user who asked for short answers before would: without it, the
hint for a short off-topic answer asks only for the question, and the base model with that hint
writes 58 words on average (docs/demo/ablations.md).
`redo_variants` enumerates every text the user can produce for a set of violations (for tests).
Reads and writes no topics or object keys.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from orl.demo.scenarios import Scenario
from orl.gate.scoring import (
    BOLD,
    FINAL_ANSWER,
    HEADER,
    LENGTH,
    LIST,
    MIN_DETAILED_WORDS,
    NOT_FRIENDLY,
    NOT_SPECIFIC,
    OFF_TOPIC,
    TEMPLATE,
    TOO_SHORT,
    VIOLATION_ORDER,
    keywords,
    parse_grading_prompt,
    tokens,
)

SATISFIED_REPLIES = (
    "Thanks, that's exactly what I needed.",
    "Perfect, thank you!",
    "Great, that works for me. Thanks!",
    "That's just right, thanks.",
    "Thank you, this is really helpful.",
    "Nice, exactly what I was looking for. Thanks!",
)

REDO_OPENERS = (
    "Hmm, can you redo that?",
    "That's not quite what I wanted.",
    "Could you try that again?",
    "Not like that.",
    "I need this done differently.",
)

# "{}" is the violations' complaints joined ("it's too long and it uses bold text").
COMPLAINT_FRAMES = ("The problem is that {}.", "Right now {}.", "Honestly, {}.")

# "{}" is the violations' directives joined; every frame says "please" and stays one sentence.
DIRECTIVE_FRAMES = ("Please {}.", "Next time, please {}.", "From now on, please {}.")

COMPLAINTS = {
    LENGTH: "it's too long",
    TOO_SHORT: "it's too short to really explain it",
    BOLD: "it uses bold text",
    LIST: "it's broken into a list",
    HEADER: "it has headers",
    FINAL_ANSWER: "it ends with a 'Final Answer' line",
    TEMPLATE: "it reads like a rubric form",
    OFF_TOPIC: "it doesn't answer my question",
    NOT_SPECIFIC: "it says nothing about what the student actually wrote",
    NOT_FRIENDLY: "it sounds cold",
}

# Two phrasings ("styles") of each directive; one style is used for a whole message.
DIRECTIVES = {
    LENGTH: ("keep it under 40 words in plain sentences", "answer in under 40 words of plain sentences"),
    TOO_SHORT: (
        f"explain it in more detail, in at least {MIN_DETAILED_WORDS} words",
        f"write a fuller answer of at least {MIN_DETAILED_WORDS} words with an example",
    ),
    BOLD: ("don't use bold text", "leave out the bold"),
    LIST: ("write plain sentences instead of a list", "skip the numbered steps and bullet points"),
    HEADER: ("don't add headers", "skip the headings"),
    FINAL_ANSWER: ("drop the 'Final Answer' line", "don't end with a 'Final Answer' line"),
    TEMPLATE: ("don't use a score or rubric labels", "skip the grade and the rubric headings"),
    OFF_TOPIC: ("actually answer what I asked ('{question}')", "stick to my question ('{question}')"),
    NOT_SPECIFIC: (
        "mention something specific from the answer like '{detail}'",
        "point to something the student wrote such as '{detail}'",
    ),
    NOT_FRIENDLY: (
        "start with a warm word like 'Nice work'",
        "make it friendly and open with 'Great thinking'",
    ),
}
DIRECTIVE_STYLES = 2


@dataclass(frozen=True)
class UserReaction:
    """The user's next message, whether they were satisfied, and the scorer's violations behind it."""

    text: str
    satisfied: bool
    violations: list[str]


@dataclass(frozen=True)
class RedoChoice:
    """Which phrasing a redo request uses: indexes into the opener, frame and style tables."""

    opener: int
    complaint_frame: int
    directive_frame: int
    style: int


def react(
    scenario: Scenario, prompt: str, response: str, rng: random.Random, restate_length: bool = False
) -> UserReaction:
    """The user's reply to `response`: satisfied iff the scenario's scorer gives 1, else a redo request
    (which, with `restate_length`, also restates the scenario's word limit when the answer kept it)."""
    breakdown = scenario.scorer(prompt, response)
    if not breakdown.violations:
        return UserReaction(rng.choice(SATISFIED_REPLIES), satisfied=True, violations=[])
    choice = RedoChoice(
        opener=rng.randrange(len(REDO_OPENERS)),
        complaint_frame=rng.randrange(len(COMPLAINT_FRAMES)),
        directive_frame=rng.randrange(len(DIRECTIVE_FRAMES)),
        style=rng.randrange(DIRECTIVE_STYLES),
    )
    violations = list(breakdown.violations)
    length = scenario.length_check
    standing = (length,) if restate_length and length not in violations else ()
    text = redo_text(violations, prompt, choice, standing)
    return UserReaction(text, satisfied=False, violations=violations)


def redo_text(violations: list[str], prompt: str, choice: RedoChoice, standing: Sequence[str] = ()) -> str:
    """A redo request: opener, one complaint sentence, one directive sentence (what to do instead).

    `standing`: checks the answer passed whose directive the user repeats after the others."""
    ordered = [v for v in VIOLATION_ORDER if v in violations]
    fill = {"question": inline_question(prompt), "detail": detail_word(prompt)}
    complaints = [COMPLAINTS[v].format(**fill) for v in ordered]
    directives = [DIRECTIVES[v][choice.style].format(**fill) for v in [*ordered, *standing]]
    return " ".join(
        (
            REDO_OPENERS[choice.opener],
            COMPLAINT_FRAMES[choice.complaint_frame].format(joined(complaints)),
            DIRECTIVE_FRAMES[choice.directive_frame].format(joined(directives)),
        )
    )


def redo_variants(violations: list[str], prompt: str) -> Iterator[str]:
    """Every redo text the user can produce for these violations (all openers, frames and styles)."""
    for opener, complaint, directive, style in itertools.product(
        range(len(REDO_OPENERS)),
        range(len(COMPLAINT_FRAMES)),
        range(len(DIRECTIVE_FRAMES)),
        range(DIRECTIVE_STYLES),
    ):
        yield redo_text(violations, prompt, RedoChoice(opener, complaint, directive, style))


def joined(parts: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def inline_question(prompt: str) -> str:
    """The prompt as a quotable clause inside one sentence: no inner sentence breaks, no end punctuation."""
    clause = re.sub(r"[.!?]+\s+", "; ", prompt.strip()).rstrip(" .!?")
    return clause[:1].lower() + clause[1:]


def detail_word(prompt: str) -> str:
    """The first alphabetic content word of the graded student answer (or of the prompt): what to cite."""
    _, answer = parse_grading_prompt(prompt)
    for source in (answer, prompt):
        content = keywords(source)
        for token in tokens(source):
            if token in content and token.isalpha():
                return token
    return "it"
