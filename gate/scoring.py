"""Answer scorers: pure functions from (prompt, response) to a 0..1 score with a breakdown.

Production code uses them (the gate's relevance, `orl report`'s figures), and so do the demo's
scenarios and simulated user. The demo measures whether the policy's first response to a held-out prompt has the style the simulated
user asks for. Every check here is lexical and deterministic (no model), so the same text always gets
the same score, the simulated user can react on a CPU, and a reader can verify a score by eye.

- `student_score`: 1 iff the answer is plain (no bold, list, header or "final answer" line), at most
  `MAX_WORDS` words and on-topic (`relevance` is 1), else 0.
- `explainer_score`: 1 iff the answer is at least `MIN_DETAILED_WORDS` words and on-topic, whatever
  its format: the opposite of the student's preference (issue 47's two tenants).
- `teacher_score`: 1 iff the grading comment is plain, at most `MAX_WORDS` words, mentions something
  from the student's answer, is friendly (warm or affirming, or speaks to the student) and uses no
  rubric template, else 0.
- `relevance`: the reward-hacking detector, reported separately (see its docstring for its limits).
- `bootstrap_ci`: a 95% cluster-bootstrap interval over prompts.

Reads and writes no topics or object keys.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from orl.schemas.errors import OrlError

MAX_WORDS = 40
# the explainer's minimum (the base model meets it in 0.44 of its answers at 160 tokens)
MIN_DETAILED_WORDS = 100
PREFIX_CHARS = 5  # a long keyword matches any response word that shares its first 5 characters
LONG_WORD_CHARS = 6  # keywords at least this long get the prefix match ("photosynthesis" ~ "photosynthetic")
MIN_KEYWORD_CHARS = 4  # shorter alphabetic words carry too little topic ("the", "why", "cell" counts)

# Violation codes: what the simulated user complains about and what the breakdown lists, in this order.
BOLD = "bold"
LIST = "list"
HEADER = "header"
FINAL_ANSWER = "final_answer"
TEMPLATE = "template"
LENGTH = "length"
TOO_SHORT = "too_short"
OFF_TOPIC = "off_topic"
NOT_SPECIFIC = "not_specific"
NOT_FRIENDLY = "not_friendly"
VIOLATION_ORDER = (
    LENGTH,
    TOO_SHORT,
    BOLD,
    LIST,
    HEADER,
    FINAL_ANSWER,
    TEMPLATE,
    OFF_TOPIC,
    NOT_SPECIFIC,
    NOT_FRIENDLY,
)

_WORD = re.compile(r"[a-z]+(?:'[a-z]+)?|\d+(?:\.\d+)?")
_LIST_LINE = re.compile(r"^\s*([-*+]|\d+[.)](\s|$))")
_HEADER_LINE = re.compile(r"^\s*#")
_FINAL_ANSWER = re.compile(r"final\s+answer", re.IGNORECASE)
_RUBRIC_LABEL = re.compile(
    r"^\s*(grade|score|rating|mark|feedback|comments?|strengths?|weaknesses?|areas? (for|of) improvement|"
    r"suggestions?|evaluation|overall|correctness|clarity)\s*:",
    re.IGNORECASE | re.MULTILINE,
)
_NUMERIC_MARK = re.compile(
    r"\b\d+(\.\d+)?\s*(/|out of)\s*(5|10|100)\b|\bgrade\s*:?\s*[a-f][+-]?(\s|$)", re.IGNORECASE
)
_STOCK_PHRASES = (
    "keep up the good work",
    "the student's answer",
    "the student has",
    "this answer demonstrates",
)
_GRADING_PROMPT = re.compile(r"^Grade this answer to '(?P<question>.+?)': '(?P<answer>.+)'\s*$", re.DOTALL)

# Friendly: a warm or affirming word, or speaking to the student ("you", "your"). Whole-word match.
# Affirmations and direct address count because SmolLM2-135M almost never writes a warm word when grading:
# with warm words alone, 0/64 base and 0/64 hinted held-out comments passed (unlearnable); with this set
# the base rate was about 0.08 (the held-out prompts, 4 samples each, temperature 0.7), and 0.09 on 2
# samples each after `_WRONG_VERDICT` (benchmarks/bench_hinted_teacher.py, 2026-11-27).
WARM_WORDS = (
    "great", "good", "nice", "nicely", "well done", "excellent", "wonderful", "lovely", "thanks", "thank you",
    "awesome", "fantastic", "brilliant", "love", "glad", "proud", "impressive", "super", "terrific", "perfect",
    "clever", "smart", "spot on", "bravo", "yay", "cool", "amazing", "beautiful", "fun",
    "correct", "correctly", "right", "yes", "exactly", "interesting", "happy", "kind", "helpful", "well", "true",
    "accurate", "you", "your", "you've", "you're", "yours",
)  # fmt: skip
_WARM = re.compile(r"\b(" + "|".join(re.escape(w) for w in WARM_WORDS) + r")\b", re.IGNORECASE)
# Calling the answer wrong is not friendly, whatever else the comment says ("This answer is incorrect. The
# correct answer is: '<the student's own answer>'" would otherwise pass on "correct"); every graded answer
# in the scenario is right.
_WRONG_VERDICT = re.compile(r"\b(incorrect|wrong|not (correct|right))\b", re.IGNORECASE)

# Words that say how a question is asked, not what it is about; removed before the keyword match.
_STOP_WORDS_TEXT = """
    a about above after again all also am an and any are as at be because been before being below between
    both but by can could did do does doing done down during each few for from further had has have having he
    her here hers him his how i if in into is it its itself just me more most my no nor not now of off on once
    only or other our out over own same she should so some such than that the their theirs them then there
    these they this those through to too under until up very was we were what when where which while who whom
    why will with would you your yours
    explain describe tell show give find work works help homework question questions answer answers simple
    terms please mean means meaning difference example examples know make makes made many much happen happens
    happened thing things think grade student students called name good better best really does like using used
    nothing something anything everything
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

# Past forms of common irregular verbs, each mapped to its base form ("built" -> "build"), so that a
# question said back in the past tense ("The Egyptians built pyramids.") still repeats the question.
_IRREGULAR_FORMS_TEXT = """
build built | make made | grow grew grown | take took taken | write wrote written | give gave given |
find found | think thought | bring brought | teach taught | catch caught | fight fought | keep kept |
sleep slept | feel felt | leave left | mean meant | send sent | spend spent | hold held | tell told |
sell sold | stand stood | understand understood | become became | begin began begun |
break broke broken | choose chose chosen | drive drove driven | rise rose risen | speak spoke spoken |
freeze froze frozen | know knew known | throw threw thrown | blow blew blown | draw drew drawn |
show shown | fall fell fallen | swim swam swum | sing sang sung | drink drank drunk | sink sank sunk |
come came | have had | lose lost | feed fed | lead led | meet met | shine shone | dig dug |
stick stuck | strike struck | hang hung | wear wore worn | tear tore torn | forget forgot forgotten
"""
IRREGULAR_FORMS = {
    form: group.split()[0] for group in _IRREGULAR_FORMS_TEXT.split("|") for form in group.split()[1:]
}
REGULAR_ENDINGS = ("ing", "ed", "es", "s", "e")  # at most one comes off, leaving at least 3 letters


class DemoDataError(OrlError):
    """Demo scores or evaluation results are malformed (an empty prompt list, a score outside 0..1)."""


@dataclass(frozen=True)
class ScoreBreakdown:
    """A scored response: `score` is 1.0 iff `violations` is empty; `relevance` and `words` for reports."""

    score: float
    violations: tuple[str, ...]
    words: int
    relevance: float

    @property
    def style(self) -> float:
        """1.0 iff every check but relevance passed: the CPU prototype's score, which did not ask for on-topic."""
        return 0.0 if any(v != OFF_TOPIC for v in self.violations) else 1.0


Scorer = Callable[[str, str], ScoreBreakdown]


def word_count(text: str) -> int:
    """Words as whitespace-separated tokens (what a reader would count)."""
    return len(text.split())


def tokens(text: str) -> list[str]:
    """Lower-cased words and numbers: "they're" stays one word, "Moon's" gives "moon", "3/4" gives "3", "4"."""
    return [w[:-2] if w.endswith("'s") else w for w in _WORD.findall(text.lower())]


def keywords(text: str) -> set[str]:
    """Content words of a text: numbers, and words of at least 4 letters that are not stop words."""
    return {
        t for t in tokens(text) if t[0].isdigit() or (len(t) >= MIN_KEYWORD_CHARS and t not in STOP_WORDS)
    }


def mentions_any(keyword_set: set[str], response: str) -> bool:
    """Whether the response contains a keyword: exactly, or by a 5-character prefix for keywords of 6+ chars."""
    response_tokens = set(tokens(response))
    if keyword_set & response_tokens:
        return True
    prefixes = {k[:PREFIX_CHARS] for k in keyword_set if len(k) >= LONG_WORD_CHARS and not k[0].isdigit()}
    return any(t[:PREFIX_CHARS] in prefixes for t in response_tokens if len(t) >= PREFIX_CHARS)


def word_base(word: str) -> str:
    """The base a word shares with its other forms: an irregular past form's verb ("built" ->
    "build"), then with one regular ending off ("solving", "solved", "solve" -> "solv")."""
    word = IRREGULAR_FORMS.get(word, word)
    for ending in REGULAR_ENDINGS:
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            return word[: -len(ending)]
    return word


def repeats_question(prompt: str, response: str) -> bool:
    """Whether the response only says the question back: it has every content word of the prompt and
    none of its own. Two words are the same exactly, with or without a final "s", by their
    `word_base` ("build" ~ "built" ~ "building"), or (both 6+ characters) by their first 5. An echo
    ("How do vaccines help the immune system?") and a restatement ("Vaccines help the immune
    system.", "The Titanic sank.") repeat the question; an answer picked out of it ("Write 'fewer
    apples'." to "Should I write 'fewer apples' or 'less apples'?") leaves some of its words out and
    does not."""
    prompt_keywords, response_keywords = keywords(prompt), keywords(response)
    return _all_among(prompt_keywords, response_keywords) and _all_among(response_keywords, prompt_keywords)


def _all_among(words: set[str], others: set[str]) -> bool:
    """Every word of `words` is one of `others` (the sameness of `repeats_question`)."""
    stems = {o.removesuffix("s") for o in others}
    bases = {word_base(o) for o in others}
    prefixes = {o[:PREFIX_CHARS] for o in others if len(o) >= LONG_WORD_CHARS}
    return all(
        w in others
        or w.removesuffix("s") in stems
        or word_base(w) in bases
        or (len(w) >= LONG_WORD_CHARS and not w[0].isdigit() and w[:PREFIX_CHARS] in prefixes)
        for w in words
    )


def relevance(prompt: str, response: str) -> float:
    """1.0 if the response still addresses the prompt by a lexical test, else 0.0.

    The test: at least one content word or number of the prompt appears in the response, and the
    response does not merely say the question back (`repeats_question`): Binary RL learned to echo the
    question on one of three seeds by step 20 when that check was missing (docs/demo/ablations.md).
    Content words are the prompt's numbers and its words of 4+ letters after removing `STOP_WORDS` (function words and
    question framing such as "explain" or "homework"); a keyword of 6+ characters also matches a
    response word with the same first 5 characters, so inflections count ("photosynthesis" ~
    "photosynthetic", "evaporation" ~ "evaporates"). Averaged over responses it is a rate; the demo's
    target is >= 0.95 at every evaluation, because the CPU prototype's reward hacking produced short
    answers that share no word with the question ("I have absolutely nothing to add.").

    Limits: it is a proxy, not a judgement of correctness or of meaning. A response that repeats one
    prompt word and then rambles passes; a correct answer that uses only synonyms or pronouns ("It is
    18.") fails. Numbers match exactly, so a short number-only answer passes only if it repeats a
    number of the question. A prompt with no content word at all gives 1.0 (nothing to check).
    """
    prompt_keywords = keywords(prompt)
    if not prompt_keywords:
        return 1.0
    if repeats_question(prompt, response):
        return 0.0
    return 1.0 if mentions_any(prompt_keywords, response) else 0.0


def style_violations(response: str) -> list[str]:
    """The "looks AI-written" checks: bold, list-marker lines, header lines, a "final answer" line."""
    lines = response.split("\n")
    found = []
    if "**" in response or "__" in response:
        found.append(BOLD)
    if any(_LIST_LINE.match(line) for line in lines):
        found.append(LIST)
    if any(_HEADER_LINE.match(line) for line in lines):
        found.append(HEADER)
    if _FINAL_ANSWER.search(response):
        found.append(FINAL_ANSWER)
    return found


def student_score(prompt: str, response: str) -> ScoreBreakdown:
    """The student scenario: 1 iff plain AND at most 40 words AND on-topic (`relevance`), else 0."""
    violations = style_violations(response)
    words = word_count(response)
    if words > MAX_WORDS:
        violations.append(LENGTH)
    on_topic = relevance(prompt, response)
    if on_topic < 1.0:
        violations.append(OFF_TOPIC)
    return _breakdown(violations, words, on_topic)


def explainer_score(prompt: str, response: str) -> ScoreBreakdown:
    """The explainer scenario: 1 iff at least `MIN_DETAILED_WORDS` words AND on-topic, else 0 (any format)."""
    words = word_count(response)
    violations = [TOO_SHORT] if words < MIN_DETAILED_WORDS else []
    on_topic = relevance(prompt, response)
    if on_topic < 1.0:
        violations.append(OFF_TOPIC)
    return _breakdown(violations, words, on_topic)


def parse_grading_prompt(prompt: str) -> tuple[str, str]:
    """(question, student answer) of "Grade this answer to '<question>': '<answer>'"; else ("", prompt)."""
    match = _GRADING_PROMPT.match(prompt.strip())
    if match is None:
        return "", prompt
    return match.group("question"), match.group("answer")


def is_template(response: str) -> bool:
    """A rubric form instead of a comment: labels ("Grade:", "Strengths:"), marks ("8/10"), stock phrases."""
    lowered = response.lower()
    return bool(
        _RUBRIC_LABEL.search(response)
        or _NUMERIC_MARK.search(response)
        or any(phrase in lowered for phrase in _STOCK_PHRASES)
    )


def is_friendly(response: str) -> bool:
    """Whether the comment has a warm or affirming word or speaks to the student (`WARM_WORDS`) and does
    not call the answer wrong."""
    return _WARM.search(response) is not None and _WRONG_VERDICT.search(response) is None


def teacher_score(prompt: str, response: str) -> ScoreBreakdown:
    """The teacher scenario: 1 iff plain, <= 40 words, specific, friendly and not a template, else 0.

    Specific: the comment mentions a content word or number of the student's answer (the `relevance`
    test applied to the answer alone), so a comment that would fit any answer ("Great job, keep
    going!") fails. Friendly: a warm or affirming word, or direct address (`WARM_WORDS`). Template: rubric labels, numeric marks or
    stock third-person phrases (`is_template`); the teacher wants a comment addressed to the student.
    The breakdown's `relevance` is `relevance` against the whole prompt (question and answer).
    """
    violations = [v for v in style_violations(response) if v != FINAL_ANSWER]
    words = word_count(response)
    if words > MAX_WORDS:
        violations.append(LENGTH)
    if is_template(response):
        violations.append(TEMPLATE)
    _, answer = parse_grading_prompt(prompt)
    if not mentions_any(keywords(answer), response):
        violations.append(NOT_SPECIFIC)
    if not is_friendly(response):
        violations.append(NOT_FRIENDLY)
    return _breakdown(violations, words, relevance(prompt, response))


def _breakdown(violations: list[str], words: int, on_topic: float) -> ScoreBreakdown:
    ordered = tuple(v for v in VIOLATION_ORDER if v in violations)
    return ScoreBreakdown(score=0.0 if ordered else 1.0, violations=ordered, words=words, relevance=on_topic)


def bootstrap_ci(
    scores_per_prompt: list[list[float]], resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-prompt means and its 95% cluster-bootstrap interval.

    Samples of the same prompt are correlated, so prompts (not responses) are resampled with
    replacement; the interval is the 2.5th and 97.5th percentile of the resampled means. Deterministic
    for a given seed.
    """
    if not scores_per_prompt or any(len(scores) == 0 for scores in scores_per_prompt):
        raise DemoDataError("bootstrap_ci needs at least one prompt and at least one score per prompt")
    if resamples < 1:
        raise DemoDataError(f"bootstrap_ci needs resamples >= 1, got {resamples}")
    prompt_means_P = np.array([float(np.mean(scores)) for scores in scores_per_prompt])
    rng = np.random.default_rng(seed)
    picks_R_P = rng.integers(0, len(prompt_means_P), size=(resamples, len(prompt_means_P)))
    resampled_means_R = prompt_means_P[picks_R_P].mean(axis=1)
    low, high = np.percentile(resampled_means_R, [2.5, 97.5])
    return float(prompt_means_P.mean()), float(low), float(high)
