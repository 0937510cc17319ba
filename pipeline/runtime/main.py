"""`orl pipeline`: builds the stages from settings and runs them over the event log.

Each stage is one StreamRunner (one consumer group); every stage of `--role` runs in this process
(one core). `--role all` runs the method's stages; a stage name, or several comma-separated, runs
those only, so stages can be placed in separate processes: `orl up` runs the upstream and the
downstream stages in two supervised processes on 2+ cores (orl/up.py, `pipeline_roles`). Each stage
commits its outputs, state and offsets in one transaction, so which process runs it changes nothing
about crash safety. Reads and writes the topics declared in pipeline/processors/topology.py.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from orl.connectors.event_log.base import EventLog
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.metrics import Metrics
from orl.pipeline.effects.contract import EffectStage
from orl.pipeline.effects.judge_stage import JudgeStage
from orl.pipeline.effects.judging import JudgeConfig
from orl.pipeline.effects.rule_judges import load_hint_extractor, load_rule_judge
from orl.pipeline.effects.teacher_stage import TeacherStage
from orl.pipeline.processors.config import (
    GroupConfig,
    HintSelectionConfig,
    LinkerConfig,
    PipelineConfig,
    RewardRuleConfig,
    SampleConfig,
    SampleMethod,
    TallyConfig,
)
from orl.pipeline.processors.contract import Processor
from orl.pipeline.processors.registry import PURE_PROCESSORS
from orl.pipeline.processors.topology import STAGES
from orl.pipeline.runtime.gc_tuning import tuned_for_streams
from orl.pipeline.runtime.settings import PipelineSettings, resolved_judges
from orl.pipeline.runtime.shared_decodes import SharedDecodes
from orl.pipeline.runtime.stream_runner import StreamRunner
from orl.rules.top_k import check_opd_topk
from orl.schemas.errors import ConfigError, OrlError
from prometheus_client import start_http_server

logger = logging.getLogger(__name__)
Stage = Processor | EffectStage


def judge_configs(settings: PipelineSettings) -> tuple[tuple[JudgeConfig, ...], JudgeConfig | None]:
    """The reward judges and the hint judge (opd and combined).

    The reward judge `--judge` runs under every method (for opd its votes are kept for audit and
    the at-least-one promotion, as the original's eval mode); under `--reward-rule step_outcome` the
    outcome judge runs beside it.
    """
    url = settings.judge_url or settings.server_url

    def config(judge_id: str, choice: str) -> JudgeConfig:
        rule = choice != "llm"
        return JudgeConfig(
            judge_id=f"{judge_id}:{choice}" if rule else judge_id,
            kind="rule" if rule else "llm",
            endpoint_url="" if rule else url,
            model="" if rule else settings.judge_model,
            m=1 if rule else settings.judge_votes,
            temperature=settings.judge_temperature,
            max_tokens=settings.judge_max_tokens,
            timeout_s=settings.judge_timeout_s,
        )

    judge, hint_judge = resolved_judges(settings.judge, settings.hint_judge, settings.judge_url)
    rewards = [config("prm", judge)]
    if settings.reward_rule == "step_outcome":
        if settings.outcome_judge == "llm":
            raise ConfigError("--outcome-judge names a rule judge (built in: outcome), not llm")
        rewards.append(config("outcome", settings.outcome_judge))
    hint = config("hint", hint_judge) if settings.method in ("opd", "combined") else None
    return tuple(rewards), hint


def pipeline_config(settings: PipelineSettings) -> PipelineConfig:
    rewards, hint = judge_configs(settings)
    llm_votes = [judge.m for judge in rewards if judge.kind == "llm"]
    return PipelineConfig(
        linker=LinkerConfig(idle_timeout_s=settings.idle_timeout_s),
        tally=TallyConfig(votes_per_judgement=llm_votes[0] if llm_votes else 1),
        hints=HintSelectionConfig(votes_per_judgement=hint.m if hint else 1),
        samples=SampleConfig(
            method=settings.method,
            at_least_one=settings.at_least_one,
            promotion_reward=settings.promotion_reward,
        ),
        rewards=RewardRuleConfig(
            rule=settings.reward_rule,
            process_judge_id=rewards[0].judge_id,
            outcome_judge_id=rewards[-1].judge_id if len(rewards) > 1 else "",
            step_weight=settings.step_weight,
            group_advantage=settings.group_advantage,
        ),
        groups=GroupConfig(timeout_s=settings.group_timeout_s),
    )


def method_stage_names(method: SampleMethod, group_advantage: bool = False) -> list[str]:
    """The stages a method uses, in topological order (binary has no hints and no teacher; only
    group advantages need group_advantage)."""
    names = [stage.name for stage in STAGES]
    if method == "binary":
        names = [n for n in names if n not in ("hint_selector", "teacher")]
    if not group_advantage:
        names = [n for n in names if n != "group_advantage"]
    return names


def build_stages(settings: PipelineSettings, metrics: Metrics | None = None) -> list[Stage]:
    pipeline_config(settings)  # checks the reward rule's settings before anything starts
    names = method_stage_names(settings.method, settings.group_advantage)
    rewards, hint = judge_configs(settings)
    reward_judge, hint_judge = resolved_judges(settings.judge, settings.hint_judge, settings.judge_url)
    choices = {rewards[0].judge_id: reward_judge}
    if len(rewards) > 1:
        choices[rewards[1].judge_id] = settings.outcome_judge
    judge = JudgeStage(
        reward_judges=rewards,
        hint_judge=hint,
        api_key=settings.judge_key(),
        rule_judges={
            judge.judge_id: load_rule_judge(choices[judge.judge_id])
            for judge in rewards
            if judge.kind == "rule"
        },
        hint_extractor=load_hint_extractor(hint_judge) if hint and hint.kind == "rule" else None,
        concurrency=settings.effect_concurrency,
        metrics=metrics or Metrics(),
    )
    check_opd_topk(settings.opd_topk)
    teacher = TeacherStage(
        settings.server_url, settings.api_key, teacher_kind=settings.teacher_kind, top_k=settings.opd_topk
    )
    by_name: dict[str, Stage] = {**PURE_PROCESSORS, "judge": judge, "teacher": teacher}
    kinds = {stage.name: stage.kind for stage in STAGES}
    if settings.role in ("pure", "effect"):
        names = [n for n in names if kinds[n] == settings.role]
    elif settings.role != "all":
        chosen = settings.role.split(",")  # one stage, or several in this one process
        unknown = [name for name in chosen if name not in by_name]
        if unknown or not chosen:
            raise ConfigError(
                f"--role must be all, pure, effect or stage names (comma-separated) from "
                f"{', '.join(by_name)}; got {settings.role!r}"
            )
        unused = [name for name in chosen if name not in names]
        if unused:
            raise ConfigError(f"--method {settings.method} does not use the stage(s) {', '.join(unused)}")
        names = [name for name in names if name in chosen]  # topological order
    return [by_name[name] for name in names]


def build_runners(
    log: EventLog, settings: PipelineSettings, stages: list[Stage], metrics: Metrics | None = None
) -> list[StreamRunner]:
    """One StreamRunner per stage on `log`; they share decodes (a record several stages read is decoded once)."""
    config = pipeline_config(settings)
    metrics = metrics or Metrics()
    decodes = SharedDecodes()
    return [
        StreamRunner(
            log,
            stage,
            config,
            settings.namespace,
            metrics=metrics,
            tick_interval_s=settings.tick_interval_s,
            partitions=settings.topic_partitions,
            effect_concurrency=settings.effect_concurrency,
            decodes=decodes,
        )
        for stage in stages
    ]


async def run_pipeline(settings: PipelineSettings, stop: asyncio.Event) -> None:
    """Run the stages of `settings.role` in this process until `stop`; one failing stage stops the others."""
    metrics = Metrics()
    stages = build_stages(settings, metrics)
    if settings.pipeline_metrics_port:
        start_http_server(settings.pipeline_metrics_port, addr="127.0.0.1", registry=metrics.registry)
        logger.info("metrics at http://127.0.0.1:%d/metrics", settings.pipeline_metrics_port)
    with tuned_for_streams():
        async with open_event_log(
            settings.effective_log_url(), settings.topic_policy(), client_id="orl-pipeline"
        ) as log:
            runners = build_runners(log, settings, stages, metrics)
            logger.info(
                "pipeline (%s) running stages: %s", settings.method, ", ".join(s.name for s in stages)
            )
            try:
                async with asyncio.TaskGroup() as tasks:
                    for runner in runners:
                        tasks.create_task(run_until_stopped(runner, stop), name=runner.processor.name)
            except BaseExceptionGroup as group:  # one failure: raise it as is (the CLI names OrlErrors)
                if len(group.exceptions) == 1:
                    raise group.exceptions[0] from None
                raise


class StageStopped(OrlError):
    """A stage's runner ended although nobody asked it to stop."""


async def run_until_stopped(runner: StreamRunner, stop: asyncio.Event) -> None:
    """`runner.run(stop)`, which may end only once `stop` is set. A stage that ended by itself while
    the others go on (returned, or ended by a CancelledError nobody asked this task for) would leave
    its input unread with no sign but a growing lag: this process exits instead, and `orl up` starts
    it again."""
    try:
        await runner.run(stop)
    except asyncio.CancelledError as cancel:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            raise
        raise StageStopped(f"stage {runner.processor.name} ended by a stray CancelledError") from cancel
    if not stop.is_set():
        raise StageStopped(f"stage {runner.processor.name} stopped by itself")


def log_task_stacks() -> None:
    """Log where every asyncio task of this process waits (a stage that stopped moving shows its await)."""
    for task in asyncio.all_tasks():
        frames: list[str] = []
        awaited: Any = task.get_coro()
        while awaited is not None and hasattr(awaited, "cr_frame"):
            frame = awaited.cr_frame
            if frame is not None:
                frames.append(
                    f"{frame.f_code.co_filename.rsplit('/', 2)[-1]}:{frame.f_lineno} {frame.f_code.co_name}"
                )
            awaited = awaited.cr_await
        logger.warning("task %s waits at: %s -> %r", task.get_name(), " -> ".join(frames), awaited)


def run(settings: PipelineSettings) -> int:
    """Entry point of `orl pipeline`.

    `--runtime embedded` runs the chosen stages with StreamRunner over whatever log --log-url names
    (SQLite or Kafka). `--runtime faust` runs the chosen pure stages as one faust worker on Kafka
    (start several for scale-out); the effect stages (judge, teacher) then run in their own
    `--runtime embedded --role judge|teacher` processes against the same kafka:// log.
    """
    if settings.runtime == "faust":
        return _run_faust(settings)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, log_task_stacks)  # `kill -USR1 PID`: what each task awaits
        await run_pipeline(settings, stop)

    asyncio.run(main())
    return 0


def _run_faust(settings: PipelineSettings) -> int:
    from orl.pipeline.runtime.faust_runtime import run_worker

    log_url = settings.effective_log_url()
    if not log_url.startswith("kafka://"):
        raise ConfigError("--runtime faust needs a Kafka log: --log-url kafka://host:port")
    stages = build_stages(settings)
    effects = [s.name for s in stages if isinstance(s, EffectStage)]
    if effects:
        raise ConfigError(
            f"faust runs the pure stages only; run {', '.join(effects)} with --runtime embedded "
            "--role <stage> (or pick a pure --role)"
        )
    processors = [s for s in stages if not isinstance(s, EffectStage)]
    (settings.data_dir / "faust").mkdir(parents=True, exist_ok=True)
    run_worker(
        processors,
        pipeline_config(settings),
        settings.namespace,
        log_url.removeprefix("kafka://"),
        app_id=f"orl-{settings.namespace}-pipeline",
        data_dir=settings.data_dir / "faust",
        partitions=settings.topic_partitions,
        policy=settings.topic_policy(),
    )
    return 0
