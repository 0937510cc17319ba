"""The promotion gate's runner (`orl gate`): a published checkpoint reaches users only once it is promoted.

Reads `checkpoints` (CheckpointPublished, PolicyGated) and `requests` of the namespace, and the
checkpoints in the object store. Writes PolicyGated (decision promoted or held, with every answer,
the judge's raw words and the figures) to `checkpoints`. Servers started with --follow-promoted
activate promoted versions only.

For the newest published version above the promoted one (versions published meanwhile are passed
over), the gate draws held-out prompts, generates `--gate-samples` answers per prompt with the
candidate, with the promoted version and with the base model (the same seeds for all), lets the
run's reward judge score every answer, and decides with
`orl.gate.promotion_rule.gate_decision_with_base`: no worse than the promoted version, nor than the
base model, beyond the margin and the noise. A version that republishes the promoted one's weights
(the trainer's restore after a hold) is promoted at once. Prompts:

- from the log (default): the newest recorded main turns of held-out sessions (the share
  `--holdout-share` of sessions the trainer skips, so no version trained on them); the judge sees
  "(the user ended the session without replying)" as the next state, which an LLM judge answers on
  the answer's own merits and a rule judge that needs the user's reply cannot score (then relevance
  alone decides, and the reason says so);
- from a `PromptSource` (`--gate-scenario student`: a demo scenario's held-out prompts, and its
  simulated user replying to each answer, so the demo's rule judge scores the gate's answers as it
  scores live ones; `orl.gate_scenarios` wires the demo's scenarios in).

The gate's state is the log: on a restart it re-reads `checkpoints` and goes on where it stopped.
It runs its own model copy on its fair share of the cores (`orl.compute.machine.CoreBoard`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import tempfile
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from orl.compute.machine import CoreBoard, available_cores, resolved_numerics
from orl.connectors.checkpoint_store import MANIFEST_NAME, download_and_verify, read_manifest, version_prefix
from orl.connectors.event_log.base import EventLog, OutgoingRecord
from orl.connectors.event_log.catalog import create_catalog_topics
from orl.connectors.event_log.factory import open_event_log
from orl.connectors.key_store import tenant_sessions_kept
from orl.connectors.model_files import resolve_model
from orl.connectors.object_store.base import ObjectStore
from orl.connectors.object_store.factory import open_object_store
from orl.connectors.settings import check_tenant_run
from orl.gate.promotion_rule import gate_decision_with_base, score_version
from orl.gate.scoring import relevance
from orl.gate.settings import GateSettings
from orl.pipeline.effects.contract import EffectCall
from orl.pipeline.effects.judge_stage import JudgeStage
from orl.pipeline.effects.rule_judges import load_rule_judge
from orl.pipeline.processors.vote_tally import majority
from orl.pipeline.runtime.main import judge_configs
from orl.rules.gate_decisions import HELD, PROMOTED, GateDecisions
from orl.schemas.codec import decode, encode
from orl.schemas.errors import CheckpointError, ConfigError
from orl.schemas.event_constructors import policy_gated
from orl.schemas.event_types import GatedAnswer, PolicyGated, RequestReceived
from orl.schemas.events import EventOrigin
from orl.schemas.ids import held_out_session
from orl.schemas.messages import Message, prompt_text
from orl.schemas.sealing import PayloadForgotten
from orl.schemas.topics import topic_name
from orl.serving.policy.base import PolicyBackend, SamplingParams
from orl.serving.policy.chat_template import ChatTemplate
from orl.serving.policy.transformers_backend import TransformersBackend

log = logging.getLogger(__name__)
PRODUCER = "orl.gate/1"
NO_REPLY = "(the user ended the session without replying)"


@dataclass(frozen=True)
class HeldOutPrompt:
    prompt_id: str
    messages: list[Message]
    session_id: str = ""  # a recorded prompt's session (its judge's calls are that session's side turns)

    @property
    def text(self) -> str:
        """The last user message: what relevance and a scenario's user read."""
        users = [m for m in self.messages if m.get("role") == "user"]
        return prompt_text(users[-1].get("content")) if users else ""


NextState = Callable[[HeldOutPrompt, str, int], dict[str, Any]]


def no_reply(prompt: HeldOutPrompt, answer: str, sample_index: int) -> dict[str, Any]:
    return {"role": "environment", "content": NO_REPLY}


@dataclass(frozen=True)
class PromptSource:
    """Held-out prompts from elsewhere than the log, and the next state that follows each answer."""

    prompts: Callable[[int], list[HeldOutPrompt]]  # the first `count`
    next_state: NextState


def answer_seed(prompt_id: str, sample_index: int, seed: int) -> int:
    """The sampling seed of one answer: the same for candidate and baseline (a paired comparison)."""
    digest = hashlib.sha256(f"{prompt_id}\x1f{sample_index}\x1f{seed}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


@dataclass
class GateLog:
    """What the gate has read: published versions, decisions and held-out prompts of its run."""

    run_id: str
    holdout_share: float
    keep: int  # held-out prompts kept: the newest
    keeps_session: Callable[[str], bool] | None = None  # a tenant's run: her sessions only (None: all)
    published: set[int] = field(default_factory=set)
    decisions: GateDecisions = field(init=False)
    held_out: deque[HeldOutPrompt] = field(init=False)

    def __post_init__(self) -> None:
        self.decisions = GateDecisions(self.run_id)
        self.held_out = deque(maxlen=self.keep)

    @property
    def promoted(self) -> int:
        return self.decisions.promoted

    def read(self, event: dict[str, Any]) -> None:
        kind = event["envelope"]["event_type"]
        if kind == "CheckpointPublished" and event["run_id"] == self.run_id:
            self.published.add(int(event["version"]))
        elif kind == "RequestReceived":
            request = cast(RequestReceived, event)
            session_id = request["envelope"].get("session_id") or ""
            if (
                request["turn_kind"] == "main"
                and held_out_session(session_id, self.holdout_share)
                and (self.keeps_session is None or self.keeps_session(session_id))
            ):
                turn_id = request["envelope"].get("turn_id") or request["request_id"]
                self.held_out.append(HeldOutPrompt(turn_id, json.loads(request["messages_json"]), session_id))
        else:
            self.decisions.read(event)

    def candidate(self) -> int | None:
        """The newest published version above the promoted one, if the gate has not decided it."""
        newest = max(self.published, default=0)
        return newest if newest > self.promoted and not self.decisions.decided(newest) else None


@dataclass
class Evaluator:
    """Generates and judges held-out answers with one version at a time on one model copy."""

    backend: PolicyBackend
    template: ChatTemplate
    judge: JudgeStage
    store: ObjectStore
    settings: GateSettings
    base_dir: Path
    work_dir: Path
    source: PromptSource | None  # None: held-out sessions of the log
    # the three answer sets (by run, version and prompts) used last: the base model's and a baseline's are
    # evaluated once for a run of candidates
    kept: dict[tuple[str, int, tuple[str, ...]], list[GatedAnswer]] = field(default_factory=dict)
    # what each version's manifest says it restores (manifests never change): read once per version
    restores: dict[tuple[str, int], int | None] = field(default_factory=dict)

    async def load(self, version: int) -> None:
        if version == self.backend.policy_version:
            return
        if version == 0:
            await self.backend.load_checkpoint(self.base_dir, 0, "full")
            return
        key = version_prefix(self.settings.run_id, version) + MANIFEST_NAME
        manifest = await asyncio.to_thread(read_manifest, self.store, key)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"v{version:08d}-", dir=self.work_dir) as folder:
            await asyncio.to_thread(download_and_verify, self.store, key, Path(folder), trainer_state=False)
            await self.backend.load_checkpoint(Path(folder), version, manifest.kind)  # type: ignore[arg-type]

    async def restored_version(self, version: int) -> int | None:
        """The version whose weights `version` republishes (the trainer's restore after a hold or a
        rollback, recorded in its manifest), else None."""
        if version == 0:
            return None
        if (self.settings.run_id, version) not in self.restores:
            key = version_prefix(self.settings.run_id, version) + MANIFEST_NAME
            restored = (await asyncio.to_thread(read_manifest, self.store, key)).metrics.get("restored")
            self.restores[(self.settings.run_id, version)] = None if restored is None else int(restored)
        return self.restores[(self.settings.run_id, version)]

    async def answers(
        self, version: int, prompts: Sequence[HeldOutPrompt], next_state: NextState
    ) -> list[GatedAnswer]:
        """Every prompt's answers by `version`, each with its next state, the judge's votes and reward.
        The three answer sets used last are kept: the base model's and a baseline's are evaluated once
        for a run of candidates. A restore's answers are those of the version whose weights it
        republishes (the same weights, the same seeds), under its own version number."""
        trained = version
        while (restored := await self.restored_version(trained)) is not None and restored < trained:
            trained = restored
        key = (self.settings.run_id, trained, tuple(prompt.prompt_id for prompt in prompts))
        if key in self.kept:
            self.kept[key] = self.kept.pop(key)  # the most recently used goes last
        else:
            self.kept[key] = await self._answers(trained, prompts, next_state)
            while len(self.kept) > 3:
                del self.kept[next(iter(self.kept))]  # the least recently used
        return [{**answer, "version": version} for answer in self.kept[key]]

    async def _answers(
        self, version: int, prompts: Sequence[HeldOutPrompt], next_state: NextState
    ) -> list[GatedAnswer]:
        await self.load(version)
        jobs = [(p, i) for p in prompts for i in range(self.settings.gate_samples)]
        generations = await asyncio.gather(
            *(
                self.backend.generate(
                    self.template.render(prompt.messages),
                    SamplingParams(
                        temperature=self.settings.gate_temperature,
                        max_tokens=self.settings.gate_max_tokens,
                        seed=answer_seed(prompt.prompt_id, index, self.settings.gate_seed),
                    ),
                )
                for prompt, index in jobs
            )
        )
        return list(
            await asyncio.gather(
                *(
                    self._judged(version, prompt, index, generation.text, next_state)
                    for (prompt, index), generation in zip(jobs, generations, strict=True)
                )
            )
        )

    async def _judged(
        self, version: int, prompt: HeldOutPrompt, index: int, text: str, next_state: NextState
    ) -> GatedAnswer:
        state = next_state(prompt, text, index)
        view = {
            **state,
            "event_id": f"gate:{self.settings.run_id}:{version}:{prompt.prompt_id}:{index}",
            "turn_id": f"gate:{prompt.prompt_id}:{index}",
            "session_id": prompt.session_id or f"gate:{prompt.prompt_id}",
            "namespace": self.settings.namespace,
            "occurred_at": int(time.time() * 1000),
        }
        config = self.judge.reward_judges[0]
        votes: list[dict[str, Any]] = []
        for vote_index in range(config.m):
            call = EffectCall(
                "reward",
                {
                    "turn": {"messages": prompt.messages, "response_text": text},
                    "next_state": view,
                    "vote_index": vote_index,
                    "judge_id": config.judge_id,
                },
            )
            votes.extend(emit.event for emit in await self.judge.perform(call))
        reward, reason = majority([vote["score"] for vote in votes])
        return {
            "prompt_id": prompt.prompt_id,
            "version": version,
            "sample_index": index,
            "text": text,
            "next_state": str(state["content"]),
            "reward": None if reason == "no_valid_votes" else int(reward),
            "relevant": relevance(prompt.text, text) >= 1.0,
            "votes": [str(vote["raw_output"]) for vote in votes],
        }


def decide(
    settings: GateSettings, candidate: int, baseline: int, answers: list[GatedAnswer], seconds: float
) -> PolicyGated:
    """The PolicyGated event for the judged answers of the candidate, the baseline and (when the
    baseline is not the base model) the base model."""
    scores = {
        version: score_version(
            [a["reward"] for a in answers if a["version"] == version],
            [a["relevant"] for a in answers if a["version"] == version],
        )
        for version in {a["version"] for a in answers}
    }
    decision, reason = gate_decision_with_base(
        scores[candidate], scores[baseline], scores.get(0), baseline, settings.gate_margin
    )
    return gated_event(
        settings,
        candidate,
        baseline,
        decision,
        reason,
        seconds,
        answers,
        candidate_approval=scores[candidate].approval,
        baseline_approval=scores[baseline].approval,
        candidate_relevance=scores[candidate].relevance,
        baseline_relevance=scores[baseline].relevance,
    )


def gated_event(
    settings: GateSettings,
    candidate: int,
    baseline: int,
    decision: str,
    reason: str,
    seconds: float,
    answers: list[GatedAnswer],
    *,
    candidate_approval: float | None = None,
    baseline_approval: float | None = None,
    candidate_relevance: float = 0.0,
    baseline_relevance: float = 0.0,
) -> PolicyGated:
    """A PolicyGated event with its approvals and relevances (unmeasured: null and 0)."""
    origin = EventOrigin(
        namespace=settings.namespace,
        producer=PRODUCER,
        occurred_at_ms=int(time.time() * 1000),
        id_parts=(settings.run_id, candidate, baseline),
    )
    return policy_gated(
        origin,
        run_id=settings.run_id,
        version=candidate,
        baseline_version=baseline,
        decision=decision,
        reason=reason,
        judge_id=judge_configs(settings)[0][0].judge_id,
        prompt_source=f"scenario:{settings.gate_scenario}" if settings.gate_scenario else "log",
        margin=settings.gate_margin,
        candidate_approval=candidate_approval,
        baseline_approval=baseline_approval,
        candidate_relevance=candidate_relevance,
        baseline_relevance=baseline_relevance,
        evaluation_s=seconds,
        answers=answers,
    )


async def gate_once(
    evaluator: Evaluator, settings: GateSettings, state: GateLog, candidate: int
) -> PolicyGated | None:
    """Evaluate `candidate` against the promoted version; the decision event (None: no prompts yet)."""
    baseline = state.promoted
    try:
        if await evaluator.restored_version(candidate) == baseline:  # the same weights: nothing to compare
            reason = f"v{candidate} republishes the promoted v{baseline}'s weights (the trainer's restore)"
            return gated_event(settings, candidate, baseline, PROMOTED, reason, 0.0, [])
        if evaluator.source is not None:
            prompts = evaluator.source.prompts(settings.gate_prompts)
            next_state = evaluator.source.next_state
        else:
            prompts = list(state.held_out)[-settings.gate_prompts :]
            next_state = no_reply
        if not prompts:
            return None
        started = time.perf_counter()
        floor = await evaluator.answers(0, prompts, next_state) if baseline != 0 else []
        answers = [
            *floor,
            *await evaluator.answers(baseline, prompts, next_state),
            *await evaluator.answers(candidate, prompts, next_state),
        ]
    except CheckpointError as error:  # a version that cannot be verified or loaded is never promoted
        reason = f"v{candidate} or v{baseline} cannot be loaded: {error}"
        return gated_event(settings, candidate, baseline, HELD, reason, 0.0, [])
    return decide(settings, candidate, baseline, answers, time.perf_counter() - started)


def check_gate_settings(settings: GateSettings, source: PromptSource | None) -> None:
    held_out_session("", settings.held_out())  # its range check
    if settings.gate_prompts < 1 or settings.gate_samples < 1:
        raise ConfigError("--gate-prompts and --gate-samples must be >= 1")
    if settings.gate_margin < 0:
        raise ConfigError(f"--gate-margin must be >= 0, not {settings.gate_margin}")
    if settings.gate_scenario and source is None:
        raise ConfigError(f"--gate-scenario {settings.gate_scenario}: no prompt source given for it")
    if source is None and settings.held_out() == 0:
        raise ConfigError("the gate draws prompts from held-out sessions: set --holdout-share above 0")
    check_tenant_run(settings.run_id, settings.tenant, settings.effective_key_store())
    if settings.tenant and source is not None:
        raise ConfigError(
            "--tenant gates on the tenant's own held-out sessions, not on --gate-scenario prompts"
        )


@asynccontextmanager
async def running_evaluator(
    settings: GateSettings, source: PromptSource | None = None
) -> AsyncIterator[Evaluator]:
    """The gate's model copy (started on the base model) and the run's reward judge; prompts from
    `source` (`--gate-scenario`), else from held-out sessions of the log."""
    check_gate_settings(settings, source)
    (judge_config, *_), _ = judge_configs(settings)
    rule = {judge_config.judge_id: load_rule_judge(settings.judge)} if judge_config.kind == "rule" else {}
    judge = JudgeStage(
        reward_judges=(judge_config,),
        hint_judge=None,
        api_key=settings.judge_key(),
        rule_judges=rule,
    )
    base_dir = resolve_model(settings.model, settings.model_cache_dir)
    backend = TransformersBackend(
        base_dir,
        autocast_dtype=resolved_numerics(settings.precision, "cpu").autocast_dtype,
        core_board=CoreBoard(settings.data_dir / "cores", settings.threads or available_cores()),
    )
    store = open_object_store(
        settings.effective_store_url(), access_key=settings.s3_access_key, secret_key=settings.s3_secret_key
    )
    await backend.start()
    try:
        template = ChatTemplate.from_dir(base_dir)
        yield Evaluator(
            backend, template, judge, store, settings, base_dir, settings.data_dir / "gate", source
        )
    finally:
        await backend.close()
        await judge.close()


async def run_gate_loop(
    settings: GateSettings, stop: asyncio.Event | None = None, source: PromptSource | None = None
) -> None:
    """`orl gate`: decide every newest published version, until `stop` is set."""
    async with (
        running_evaluator(settings, source) as evaluator,  # checks the settings first
        open_event_log(
            settings.effective_log_url(), settings.topic_policy(), client_id="orl-gate"
        ) as event_log,
    ):
        with tenant_sessions_kept(settings.effective_key_store(), settings.tenant) as keeps:
            state = GateLog(settings.run_id, settings.held_out(), settings.gate_prompts, keeps)
            await create_catalog_topics(event_log, settings.namespace, settings.topic_partitions)
            await follow(event_log, settings, state, evaluator, stop or asyncio.Event())


async def follow(
    event_log: EventLog, settings: GateSettings, state: GateLog, evaluator: Evaluator, stop: asyncio.Event
) -> None:
    topics = [topic_name(settings.namespace, name) for name in ("checkpoints", "requests")]
    out = topic_name(settings.namespace, "checkpoints")
    async with event_log.consumer(f"{settings.namespace}.gate-{uuid.uuid4().hex[:8]}", topics) as consumer:
        await consumer.seek_to_beginning()
        waiting: set[int] = set()  # candidates whose wait for held-out prompts was logged
        while not stop.is_set():
            records = await consumer.poll(max_records=1000, timeout_s=1.0)
            for record in records:
                try:
                    state.read(decode(record.value))
                except PayloadForgotten:
                    continue  # `orl forget`: the session's prompts are no longer held out
            candidate = state.candidate()
            if records or candidate is None:
                continue  # decide once caught up: a newer version may be waiting behind these records
            event = await gate_once(evaluator, settings, state, candidate)
            if event is None:
                if candidate not in waiting:
                    waiting.add(candidate)
                    log.info(
                        "v%d waits for a held-out prompt: no main turn of a held-out session (a share of %.2f "
                        "of the sessions) is recorded yet; servers keep serving v%d",
                        candidate, settings.held_out(), state.promoted,
                    )  # fmt: skip
                continue
            await event_log.append(
                out, OutgoingRecord(value=encode(dict(event)), key=settings.run_id.encode())
            )
            state.read(dict(event))
            log.info(
                "v%d %s against v%d in %.1f s: %s",
                candidate, event["decision"], event["baseline_version"], event["evaluation_s"], event["reason"],
            )  # fmt: skip
