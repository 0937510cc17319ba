"""Settings of the pure processors, one frozen section per processor, each with a content version.

A section's `version` is a hash of its fields: it goes into the ids of the events the processor
emits, so changing a setting that changes outputs gives new ids (a replay with a new config never
collides with the old one), while the same config reproduces the same ids byte for byte. It is
computed once per section object, as it is read for every emitted event (a per-object cache, not
one keyed by value: equal sections such as 600 and 600.0 hash to different versions).
Reads no topics; read once at start-up by the runtime and passed down.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Literal

from orl.schemas.errors import ConfigError

SampleMethod = Literal["binary", "opd", "combined"]
SAMPLE_METHODS: tuple[str, ...] = ("binary", "opd", "combined")
RewardRule = Literal["single", "step_outcome"]
REWARD_RULES: tuple[str, ...] = ("single", "step_outcome")
STEP_RULE = "step_outcome"  # the rule name of a step's combined RewardDecided
GROUP_RULE = "group_step_normalised"  # the rule name of a group's normalised RewardDecided (group_advantage)


def content_version(section: Any) -> str:
    """A short, stable hash of a frozen dataclass's class name and fields."""
    payload = {"type": type(section).__name__, "fields": asdict(section)}
    encoded = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


@dataclass(frozen=True)
class LinkerConfig:
    """turn_linker: when a quiet session is closed and how long its tombstone is kept."""

    idle_timeout_s: float = 1800.0
    closed_retention_s: float = 3600.0

    @cached_property
    def version(self) -> str:
        return content_version(self)


@dataclass(frozen=True)
class TallyConfig:
    """vote_tally: how many votes make a judgement, and how long to wait for missing ones."""

    votes_per_judgement: int = 3
    rule_votes_per_judgement: int = 1
    vote_timeout_s: float = 900.0
    retention_s: float = 3600.0

    @cached_property
    def version(self) -> str:
        return content_version(self)


@dataclass(frozen=True)
class HintSelectionConfig:
    """hint_selector: votes per judgement and the minimum useful hint length (strictly greater)."""

    votes_per_judgement: int = 3
    min_hint_chars: int = 10
    vote_timeout_s: float = 900.0
    retention_s: float = 3600.0

    @cached_property
    def version(self) -> str:
        return content_version(self)


@dataclass(frozen=True)
class SampleConfig:
    """sample_builder: the training method and the at-least-one guarantee per session.

    `promotion_reward`: when a closed session earned no sample, its last judged turn is promoted
    with the mean of its valid votes, or, if that is 0, with `-promotion_reward`. A session that
    never earned a positive signal is mildly discouraged, and the promoted sample then moves the
    gradient (the original promoted a 0-reward turn, which is a gradient no-op).
    """

    method: SampleMethod = "binary"
    at_least_one: bool = True
    promotion_reward: float = 0.1
    settle_timeout_s: float = 900.0
    closed_retention_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.method not in SAMPLE_METHODS:
            raise ConfigError(f"method must be one of {SAMPLE_METHODS}, not {self.method!r}")
        if self.promotion_reward < 0:
            raise ConfigError("promotion_reward must be >= 0 (it is applied as a penalty)")

    @cached_property
    def version(self) -> str:
        return content_version(self)


@dataclass(frozen=True)
class RewardRuleConfig:
    """sample_builder: how the rewards of several judges become one reward per turn.

    - "single": one judge; its RewardDecided is the turn's reward (the default).
    - "step_outcome" (general-agent tracks): every main turn of a session is a step, judged by the
      process judge on its own next state; the task's outcome is the outcome judge's reward on any
      turn of the session (the connector's verdict). When the session is over, each step gets
      `step_weight * process + (1 - step_weight) * outcome` (rules/step_rewards.py), as
      a RewardDecided of its own that names both parts. With `group_advantage`, sessions that carry
      a group id then wait for their group's normalisation (group_advantage stage) before sampling.
    """

    rule: RewardRule = "single"
    process_judge_id: str = "prm"
    outcome_judge_id: str = "prm:outcome"
    step_weight: float = 0.5
    group_advantage: bool = False

    def __post_init__(self) -> None:
        if self.rule not in REWARD_RULES:
            raise ConfigError(f"reward rule must be one of {REWARD_RULES}, not {self.rule!r}")
        if not 0.0 <= self.step_weight <= 1.0:
            raise ConfigError(f"step_weight must be in [0, 1], not {self.step_weight}")
        if self.rule == "step_outcome" and self.process_judge_id == self.outcome_judge_id:
            raise ConfigError("step_outcome needs two judges: the process judge and the outcome judge differ")
        if self.group_advantage and self.rule != "step_outcome":
            raise ConfigError("group advantages normalise step rewards: they need the step_outcome rule")

    @cached_property
    def version(self) -> str:
        return content_version(self)


@dataclass(frozen=True)
class GroupConfig:
    """group_advantage: how long a group waits for its missing rollouts, and its state's retention.

    A group is decided when `group_size` trajectories arrived, or `timeout_s` after its first one
    with those that did. Kept shorter than sample_builder's `closed_retention_s`, which is how long
    a finished session waits for its group's rewards.
    """

    timeout_s: float = 600.0
    retention_s: float = 3600.0

    @cached_property
    def version(self) -> str:
        return content_version(self)


@dataclass(frozen=True)
class PipelineConfig:
    """Everything the pure processors need; `seen_window` bounds the redelivery memory per session.

    `compact_states`: sample_builder packs the token arrays it keeps (two strings instead of hundreds
    of numbers), as runtimes serialise a state after every batch that touches it; a runtime that
    keeps states in memory only (a reuse replay's shards) turns that off. Neither changes an output,
    so neither is part of a section version.
    """

    linker: LinkerConfig = field(default_factory=LinkerConfig)
    tally: TallyConfig = field(default_factory=TallyConfig)
    hints: HintSelectionConfig = field(default_factory=HintSelectionConfig)
    samples: SampleConfig = field(default_factory=SampleConfig)
    rewards: RewardRuleConfig = field(default_factory=RewardRuleConfig)
    groups: GroupConfig = field(default_factory=GroupConfig)
    seen_window: int = 512
    compact_states: bool = True

    def __post_init__(self) -> None:
        if self.rewards.rule == "step_outcome" and self.samples.method != "binary":
            raise ConfigError("the step_outcome reward rule trains with method binary (no OPD term yet)")
