"""The pipeline topology, declared once as data: which stage reads and writes which topic.

Pure stages are processors (pipeline/processors/contract.py) run by a runtime; effect stages call models
(judge, teacher) and are run by the effect runner. Topic creation, docs and the "every produced
topic has a consumer" test derive from `STAGES`, `EXTERNAL_PRODUCERS` and `EXTERNAL_CONSUMERS`.
Topic names are catalog names (orl.schemas.topics); the namespace prefix is added by the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StageKind = Literal["pure", "effect"]


@dataclass(frozen=True)
class Stage:
    name: str
    kind: StageKind
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    role: str


STAGES: tuple[Stage, ...] = (
    Stage(
        "turn_linker",
        "pure",
        inputs=("requests", "responses", "next_states", "sessions"),
        outputs=("next_states", "sessions"),
        role="joins requests and responses into turns; the next main request (or the session end) "
        "becomes the previous main turn's next state; closes idle sessions",
    ),
    Stage(
        "judge",
        "effect",
        inputs=("requests", "responses", "next_states"),
        outputs=("judge_votes", "hints"),
        role="casts m reward votes (JudgeVoteCast) and m hint votes (HintVoteCast) per next state",
    ),
    Stage(
        "vote_tally",
        "pure",
        inputs=("judge_votes",),
        outputs=("rewards",),
        role="majority of a judgement's votes -> RewardDecided",
    ),
    Stage(
        "hint_selector",
        "pure",
        inputs=("hints",),
        outputs=("hints",),
        role="longest valid hint among hint votes -> HintSelected, or HintRejected with the reason",
    ),
    Stage(
        "teacher",
        "effect",
        inputs=("requests", "responses", "hints"),
        outputs=("teacher_scores",),
        role="teacher logprobs of the response tokens under the hint-enhanced prompt",
    ),
    Stage(
        "sample_builder",
        "pure",
        inputs=("requests", "responses", "next_states", "rewards", "hints", "teacher_scores", "sessions"),
        outputs=("samples", "rewards", "trajectories"),
        role="one SampleReady / SampleRejected per judged main turn; at-least-one promotion per session; "
        "under step_outcome, a step's combined reward, and a grouped session's trajectory",
    ),
    Stage(
        "group_advantage",
        "pure",
        inputs=("trajectories",),
        outputs=("rewards",),
        role="the step rewards of a rollout group's sessions, normalised per step index -> RewardDecided",
    ),
)

# Topics written from outside the pipeline, and by whom.
EXTERNAL_PRODUCERS: dict[str, tuple[str, ...]] = {
    "requests": ("serving",),
    "responses": ("serving",),
    "next_states": ("connectors",),
    "sessions": ("serving",),
}

# Terminal topics: produced by the pipeline, consumed outside it.
EXTERNAL_CONSUMERS: dict[str, tuple[str, ...]] = {
    "samples": ("trainer",),
}


def stage_named(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise KeyError(f"no pipeline stage named {name!r}")


def pipeline_topics() -> tuple[str, ...]:
    """Every topic the pipeline reads or writes, in first-mention order."""
    topics: dict[str, None] = {}
    for stage in STAGES:
        topics.update(dict.fromkeys(stage.inputs + stage.outputs))
    return tuple(topics)


def producers_by_topic() -> dict[str, list[str]]:
    """topic -> the stages (and external producers) that write it."""
    producers: dict[str, list[str]] = {topic: list(names) for topic, names in EXTERNAL_PRODUCERS.items()}
    for stage in STAGES:
        for topic in stage.outputs:
            producers.setdefault(topic, []).append(stage.name)
    return producers


def consumers_by_topic() -> dict[str, list[str]]:
    """Every produced topic -> the stages (and external consumers) that read it; [] if none."""
    consumers: dict[str, list[str]] = {topic: [] for topic in producers_by_topic()}
    for stage in STAGES:
        for topic in stage.inputs:
            consumers.setdefault(topic, []).append(stage.name)
    for topic, names in EXTERNAL_CONSUMERS.items():
        consumers.setdefault(topic, []).extend(names)
    return consumers


def unconsumed_topics() -> list[str]:
    """Produced topics nobody reads: must stay empty."""
    return sorted(topic for topic, names in consumers_by_topic().items() if not names)


def unproduced_topics() -> list[str]:
    """Topics some stage reads that nobody writes: must stay empty."""
    producers = producers_by_topic()
    return sorted(topic for stage in STAGES for topic in stage.inputs if not producers.get(topic))
