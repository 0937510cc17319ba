"""Settings of `orl pipeline` (every field is a flag and an environment variable)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from orl.connectors.settings import ConnectionSettings, ServerClientSettings, setting
from orl.pipeline.processors.config import RewardRule, SampleMethod

PipelineRuntime = Literal["embedded", "faust"]
TeacherKind = Literal["frozen_reference", "live_policy"]  # orl.pipeline.effects.teacher_stage
AUTO = "auto"  # the judge choice resolved by resolved_judges


@dataclass(frozen=True)
class TeacherSettings:
    """The OPD teacher the pipeline runs: `orl pipeline`'s, and what `orl up` and `orl demo` give theirs."""

    teacher_kind: TeacherKind = setting(
        "frozen_reference", "ORL_TEACHER_KIND", "OPD teacher: frozen_reference | live_policy."
    )
    opd_topk: int = setting(
        0,
        "ORL_OPD_TOPK",
        "Top-K distillation: the teacher also records each response position's K most likely tokens "
        "(0: token-level teacher logprobs only; at most 100). The trainer uses them with --opd-loss topk.",
        advanced=True,
    )


@dataclass(frozen=True)
class PipelineMetricsSettings:
    pipeline_metrics_port: int = setting(
        0,
        "ORL_PIPELINE_METRICS_PORT",
        "Serve the pipeline's Prometheus metrics (judge votes, parse failures, events) at "
        "http://127.0.0.1:PORT/metrics (0: off); `orl up` gives its pipeline processes this port and the "
        "next ones, one each.",
        advanced=True,
    )


@dataclass(frozen=True)
class JudgeChoiceSettings:
    """Which judge scores turns and which extracts hints, in `orl pipeline`, `orl up`, the gate and replay.
    `auto` (`resolved_judges`): an LLM judge when --judge-url names an endpoint, else rules over the next
    state, since a small served model cannot judge (most of its votes do not parse)."""

    judge: str = setting(
        AUTO,
        "ORL_JUDGE",
        "Reward judge: auto (llm with --judge-url, else the 'reaction' rule judge), llm (an OpenAI-compatible "
        "endpoint: --judge-url, else the orl server), or a rule judge name from the orl.judges entry points.",
    )
    hint_judge: str = setting(
        AUTO,
        "ORL_HINT_JUDGE",
        "Hint extractor: auto (llm with --judge-url, else the 'user_hint' rules), llm, or a name from the "
        "orl.hint_extractors entry points.",
    )


def resolved_judges(judge: str, hint_judge: str, judge_url: str) -> tuple[str, str]:
    """(reward judge, hint extractor) with `auto` resolved: llm when a judge endpoint is given, else the
    rules that need no model ('reaction', 'user_hint')."""
    return (
        judge if judge != AUTO else ("llm" if judge_url else "reaction"),
        hint_judge if hint_judge != AUTO else ("llm" if judge_url else "user_hint"),
    )


@dataclass(frozen=True)
class SignalSettings:
    """What the pipeline turns judged turns into: `orl pipeline`'s, and `orl up`'s for the pipeline it starts."""

    method: SampleMethod = setting("combined", "ORL_METHOD", "Training signal: binary | opd | combined.")
    reward_rule: RewardRule = setting(
        "single",
        "ORL_REWARD_RULE",
        "How judges' rewards become a turn's reward: single (--judge alone) | step_outcome (agent "
        "tracks: every turn is a step scored by --judge on its next state, combined with the task's "
        "outcome from --outcome-judge when the session ends; method binary).",
    )
    group_advantage: bool = setting(
        False,
        "ORL_GROUP_ADVANTAGE",
        "step_outcome: normalise the step rewards of sessions that share a group id (X-Group-Id) per step index.",
        advanced=True,
    )


@dataclass(frozen=True)
class JudgeEndpointSettings:
    """An LLM judge's OpenAI-compatible endpoint (`orl pipeline`, and `orl up` for the pipeline it starts)."""

    judge_url: str = setting("", "ORL_JUDGE_URL", "Judge endpoint base URL (default: --server-url).")
    judge_api_key: str = setting(
        "",
        "ORL_JUDGE_API_KEY",
        "Judge endpoint key. Default: --api-key when the judge is the orl server itself (no --judge-url, "
        "or --judge-url equal to --server-url); an outside judge gets no key unless this is given.",
        secret=True,
        advanced=True,
    )
    judge_model: str = setting("", "ORL_JUDGE_MODEL", "Model name sent to the judge endpoint.")


@dataclass(frozen=True)
class PipelineSettings(
    ConnectionSettings,
    ServerClientSettings,
    SignalSettings,
    JudgeEndpointSettings,
    JudgeChoiceSettings,
    TeacherSettings,
    PipelineMetricsSettings,
):
    role: str = setting(
        "all",
        "ORL_PIPELINE_ROLE",
        "Stages to run: one of turn_linker, judge, vote_tally, hint_selector, teacher, "
        "sample_builder, group_advantage, a comma-separated list of them, or 'all' (the method's stages), all in this process.",
        advanced=True,
    )
    runtime: PipelineRuntime = setting(
        "embedded",
        "ORL_PIPELINE_RUNTIME",
        "embedded (StreamRunner over any log) | faust (the pure stages as faust agents on Kafka).",
    )
    outcome_judge: str = setting(
        "outcome",
        "ORL_OUTCOME_JUDGE",
        "step_outcome: the rule judge that reads the task's outcome (a connector's verdict) from a next state.",
        advanced=True,
    )
    step_weight: float = setting(
        0.5,
        "ORL_STEP_WEIGHT",
        "step_outcome: reward = w * step score + (1 - w) * outcome (0: outcome only).",
        advanced=True,
    )
    group_timeout_s: float = setting(
        600.0,
        "ORL_GROUP_TIMEOUT_S",
        "group_advantage: decide a group this long after its first rollout ended.",
        advanced=True,
    )
    judge_votes: int = setting(3, "ORL_JUDGE_VOTES", "Votes per judgement for an LLM judge (m).")
    judge_temperature: float = setting(
        0.6, "ORL_JUDGE_TEMPERATURE", "Judge sampling temperature.", advanced=True
    )
    judge_max_tokens: int = setting(
        1024, "ORL_JUDGE_MAX_TOKENS", "Judge output limit in tokens.", advanced=True
    )
    judge_timeout_s: float = setting(
        120.0, "ORL_JUDGE_TIMEOUT_S", "Timeout of one judge call.", advanced=True
    )
    idle_timeout_s: float = setting(
        1800.0, "ORL_IDLE_TIMEOUT_S", "Close a session after this long without events.", advanced=True
    )
    at_least_one: bool = setting(
        True,
        "ORL_AT_LEAST_ONE",
        "Promote a turn of every session that closes without an effective sample.",
        advanced=True,
    )
    promotion_reward: float = setting(
        0.1,
        "ORL_PROMOTION_REWARD",
        "At-least-one promotion penalty when a session's votes average 0.",
        advanced=True,
    )
    effect_concurrency: int = setting(
        4, "ORL_EFFECT_CONCURRENCY", "Concurrent judge / teacher calls.", advanced=True
    )
    tick_interval_s: float = setting(
        1.0, "ORL_TICK_INTERVAL_S", "How often idle sessions are checked.", advanced=True
    )

    def judge_key(self) -> str:
        """The key sent to the judge endpoint: --judge-api-key, else the server's own --api-key only
        when the judge is the orl server itself (no --judge-url, or the same URL as --server-url).
        An outside judge never receives the server's key."""
        if self.judge_api_key:
            return self.judge_api_key
        own_server = not self.judge_url or self.judge_url.rstrip("/") == self.server_url.rstrip("/")
        return self.api_key if own_server else ""
