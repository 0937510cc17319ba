"""`orl report`: is the model improving? Figures per policy version, from any namespace's log.

Reads the requests, responses, next_states, rewards, train_steps and policy_activations topics of a
namespace (live, replayed or imported). Writes report.md, report.json and report.png to --out-dir.
For every policy version that served a turn (0 is the base model):

- main turns it answered; of those the judge took a side on (reward +1 or -1; at-least-one
  promotions left out) its **approval**: the share judged +1, with a 95% cluster-bootstrap interval
  over sessions; and how many were **neutral** (reward 0: a tie, no verdict, a session that ended
  without a reply);
- **satisfied**: the share of positive explicit feedback (a thumbs or a reward outcome) among its
  turns that got any;
- **relevance**: the on-topic rate of the judged answers (the answer mentions a content word of the
  user's last message: `orl.gate.scoring.relevance`, the demo's reward-hacking detector) and their
  mean **words** (judged answers only: a client's closing turn that no one judges says little);
- **KL** to the base: the trainer's KL at the step that made the version;
- **activations** and **refusals** of the version by servers and the trainer (PolicyActivated,
  PolicyRejected), the promotion **gate**'s decision (PolicyGated: promoted or held, with its
  figures), and whether the trainer **rolled it back** (PolicyRolledBack: judged worse than its
  parent, whose weights were republished as a new version).

With `--scenario student|teacher` the side turns (the demo's held-out evaluation asks its prompts as
side turns) are scored per version with that scenario's scorer, with the demo's intervals: the
demo's own table rebuilt from its log alone. With `--metrics-port` the same figures are Prometheus
gauges for a dashboard (`orl_report_approval{version, bound}`, `orl_report_relevance{version}`, ...),
refreshed from the log every `--refresh-s`. With `--tenant NAME` only that named tenant's main turns
count (the key store says which sessions its client keys opened): the tenant's own curve.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from prometheus_client import start_http_server

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.key_store import KeyStore
from orl.connectors.metrics import Metrics
from orl.connectors.settings import ConnectionSettings, TenantSettings, setting
from orl.demo.scenarios import get_scenario
from orl.gate.scoring import ScoreBreakdown, Scorer, bootstrap_ci, relevance, word_count
from orl.pipeline.history.namespace_io import namespace_events
from orl.schemas.errors import ConfigError, OrlError
from orl.schemas.messages import prompt_text

REPORT_TOPICS = (
    "requests", "responses", "next_states", "rewards", "train_steps", "checkpoints", "policy_activations",
)  # fmt: skip
Event = dict[str, Any]


@dataclass(frozen=True)
class ReportSettings(ConnectionSettings, TenantSettings):
    out_dir: Path = setting(Path(".orl/report"), "ORL_REPORT_DIR", "Where report.md, .json and .png go.")
    scenario: str = setting(
        "",
        "ORL_REPORT_SCENARIO",
        "Also score the side turns per version with this demo scenario's scorer (student | teacher).",
    )
    metrics_port: int = setting(
        0,
        "ORL_REPORT_METRICS_PORT",
        "Keep running and serve the figures as Prometheus gauges orl_report_<figure>{version} on "
        "127.0.0.1:PORT/metrics, re-reading the log every --refresh-s (0: write the report once and exit).",
    )
    refresh_s: float = setting(30.0, "ORL_REPORT_REFRESH_S", "With --metrics-port: seconds between re-reads.")


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float


@dataclass
class VersionFigures:
    """What one policy version did; None where the log holds nothing to measure."""

    version: int
    main_turns: int = 0
    judged_turns: int = 0  # reward +1 or -1
    neutral_turns: int = 0  # reward 0
    approval: Interval | None = None
    feedback_turns: int = 0
    satisfied: float | None = None
    relevance: float | None = None
    words: float | None = None
    kl: float | None = None
    activations: int = 0
    refusals: list[str] = field(default_factory=list)
    rolled_back: str | None = None  # "to vP as vN (approval a vs b)"
    gate: str | None = None  # the promotion gate's last decision: "promoted against v0: <reason>"
    held_out_samples: int = 0
    held_out_score: Interval | None = None
    held_out_relevance: float | None = None
    held_out_style: float | None = None  # every check of the scenario but relevance passed


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last user message (what an answer should be about); "" if there is none."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return prompt_text(message.get("content"))
    return ""


def _interval(clusters: Mapping[str, list[float]]) -> Interval | None:
    if not clusters:
        return None
    mean, low, high = bootstrap_ci(list(clusters.values()))
    return Interval(mean, low, high)


def _positive_feedback(outcome: Mapping[str, Any] | None) -> bool | None:
    """True / False for a thumbs or a reward outcome, None for anything else (no explicit feedback)."""
    if not outcome:
        return None
    if outcome.get("thumbs") is not None:
        return bool(outcome["thumbs"] > 0)
    if outcome.get("kind") == "reward" and outcome.get("reward") is not None:
        return bool(outcome["reward"] > 0)
    return None


def _note_policy_events(events: Mapping[str, list[Event]], of: Callable[[int], VersionFigures]) -> None:
    """Each version's KL, gate decision, rollback, activations and refusals, from their events."""
    for step in events.get("train_steps", []):
        of(int(step["policy_version"])).kl = float(step["kl"])
    for rolled in events.get("checkpoints", []):
        if rolled["envelope"]["event_type"] == "PolicyGated":
            of(
                int(rolled["version"])
            ).gate = f"{rolled['decision']} against v{rolled['baseline_version']}: {rolled['reason']}"
        if rolled["envelope"]["event_type"] == "PolicyRolledBack":
            of(int(rolled["new_version"]))
            of(int(rolled["from_version"])).rolled_back = (
                f"to v{rolled['to_version']} as v{rolled['new_version']} (approval "
                f"{rolled['from_approval']:.2f} vs {rolled['to_approval']:.2f} over {rolled['window']} turns)"
            )
    for activation in events.get("policy_activations", []):
        figures = of(int(activation["version"]))
        if activation["envelope"]["event_type"] == "PolicyActivated":
            figures.activations += 1
        else:
            figures.refusals.append(f"{activation['server_id']}: {activation['reason']}")


def version_figures(
    events: Mapping[str, list[Event]], scorer: Scorer | None = None, sessions: frozenset[str] | None = None
) -> list[VersionFigures]:
    """The figures of every version that served a turn or was activated, refused or trained, ascending.

    `sessions`: count only the main turns of these sessions (one tenant's). The side turns a scorer
    scores are the held-out evaluation's, which belong to the version, not to a tenant: they are
    scored whatever `sessions` is."""
    requests = {e["request_id"]: e for e in events.get("requests", [])}
    by_version: dict[int, VersionFigures] = {}

    def of(version: int) -> VersionFigures:
        return by_version.setdefault(version, VersionFigures(version))

    # main turn id -> (version, session id, on-topic, words)
    turn_version: dict[str, tuple[int, str, float, int]] = {}
    held_out: dict[int, dict[str, list[ScoreBreakdown]]] = defaultdict(lambda: defaultdict(list))
    for response in events.get("responses", []):
        request = requests.get(response["request_id"])
        if request is None:
            continue
        version = int(response["policy_version"])
        prompt = last_user_text(json.loads(request["messages_json"]))
        answer = response["response_text"]
        if request["turn_kind"] == "main":
            session = request["envelope"]["session_id"]
            if sessions is not None and session not in sessions:
                continue
            of(version).main_turns += 1
            turn = (version, session, relevance(prompt, answer), word_count(answer))
            turn_version[request["envelope"]["turn_id"]] = turn
        elif scorer is not None and prompt:
            held_out[version][prompt].append(scorer(prompt, answer))

    approvals: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    on_topic: dict[int, list[float]] = defaultdict(list)
    words: dict[int, list[int]] = defaultdict(list)
    for decided in events.get("rewards", []):
        served = turn_version.get(decided["envelope"]["turn_id"])
        if served is None or decided["promoted"]:
            continue
        version, session, answer_on_topic, answer_words = served
        if decided["reward"] == 0:
            of(version).neutral_turns += 1
            continue
        approvals[version][session].append(1.0 if decided["reward"] > 0 else 0.0)
        on_topic[version].append(answer_on_topic)
        words[version].append(answer_words)
    feedback: dict[int, list[bool]] = defaultdict(list)
    for observed in events.get("next_states", []):
        served = turn_version.get(observed["envelope"]["turn_id"])
        positive = _positive_feedback(observed.get("outcome"))
        if served is not None and positive is not None:
            feedback[served[0]].append(positive)
    _note_policy_events(events, of)

    for version, figures in by_version.items():
        figures.judged_turns = sum(len(r) for r in approvals[version].values())
        figures.approval = _interval(approvals[version])
        figures.feedback_turns = len(feedback[version])
        figures.satisfied = sum(feedback[version]) / len(feedback[version]) if feedback[version] else None
        figures.relevance = sum(on_topic[version]) / len(on_topic[version]) if on_topic[version] else None
        figures.words = sum(words[version]) / len(words[version]) if words[version] else None
        scored = [b for by_prompt in held_out[version].values() for b in by_prompt]
        figures.held_out_samples = len(scored)
        figures.held_out_score = _interval(
            {prompt: [b.score for b in by_prompt] for prompt, by_prompt in held_out[version].items()}
        )
        figures.held_out_relevance = sum(b.relevance for b in scored) / len(scored) if scored else None
        figures.held_out_style = sum(b.style for b in scored) / len(scored) if scored else None
    return [by_version[v] for v in sorted(by_version)]


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _interval_cell(interval: Interval | None) -> str:
    return "-" if interval is None else f"{interval.mean:.2f} [{interval.low:.2f}, {interval.high:.2f}]"


def render_markdown(namespace: str, rows: list[VersionFigures], scenario: str, tenant: str = "") -> str:
    held = bool(scenario)
    header = [
        "version",
        "main turns",
        "judged",
        "approval [95% CI]",
        "neutral",
        "satisfied (feedback)",
        "relevance",
        "words",
        "KL",
    ]
    header += ["gate", "activations", "refusals"] + (
        ["held-out score [95% CI]", "held-out style", "held-out relevance"] if held else []
    )
    lines = [
        f"# orl report: namespace {namespace}" + (f", tenant {tenant}" if tenant else ""),
        "",
        *([f"Main turns of tenant {tenant}'s sessions only.", ""] if tenant else []),
        "Per policy version (0 = the base model). Judged: main turns the judge rewarded +1 or -1; "
        "approval: the share of them at +1, 95% cluster-bootstrap interval over sessions; neutral: turns "
        "rewarded 0. Satisfied: positive explicit feedback among turns that got any. Relevance and words: "
        "of the judged answers. KL: the trainer's KL to the base at the step that made the version."
        + (
            f" Held-out: the side turns scored with the {scenario!r} scenario's scorer; style: the share "
            "that passed every check but relevance."
            if held
            else ""
        ),
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for r in rows:
        cells = [
            str(r.version),
            str(r.main_turns),
            str(r.judged_turns),
            _interval_cell(r.approval),
            str(r.neutral_turns),
            "-" if r.satisfied is None else f"{r.satisfied:.2f} ({r.feedback_turns})",
            _cell(r.relevance),
            _cell(r.words, 0),
            _cell(r.kl, 3),
            "-" if r.gate is None else r.gate.split(" ", 1)[0],
            str(r.activations),
            str(len(r.refusals)),
        ]
        if held:
            cells += [_interval_cell(r.held_out_score), _cell(r.held_out_style), _cell(r.held_out_relevance)]
        lines.append("| " + " | ".join(cells) + " |")
    refusals = [(r.version, reason) for r in rows for reason in r.refusals]
    if refusals:
        lines += ["", "Refusals:", ""] + [f"- v{version}: {reason}" for version, reason in refusals]
    gated = [(r.version, r.gate) for r in rows if r.gate]
    if gated:
        lines += ["", "Promotion gate:", ""] + [f"- v{version} {what}" for version, what in gated]
    rollbacks = [(r.version, r.rolled_back) for r in rows if r.rolled_back]
    if rollbacks:
        lines += ["", "Rollbacks:", ""] + [f"- v{version} rolled back {what}" for version, what in rollbacks]
    return "\n".join(lines) + "\n"


def plot_report(namespace: str, rows: list[VersionFigures], path: Path) -> None:
    """Judged (and held-out) reward with intervals, relevance and KL against the version."""
    figure = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(figure)
    reward_axes, quality_axes = figure.subplots(1, 2)
    for name, pick in (("approval", "approval"), ("held-out score", "held_out_score")):
        points = [(r.version, getattr(r, pick)) for r in rows if getattr(r, pick) is not None]
        if points:
            versions = [v for v, _ in points]
            reward_axes.plot(versions, [i.mean for _, i in points], marker="o", label=name)
            reward_axes.fill_between(
                versions, [i.low for _, i in points], [i.high for _, i in points], alpha=0.2
            )
    for name, pick in (("relevance", "relevance"), ("KL to the base", "kl")):
        points = [(r.version, getattr(r, pick)) for r in rows if getattr(r, pick) is not None]
        if points:
            quality_axes.plot([v for v, _ in points], [x for _, x in points], marker="o", label=name)
    figure.suptitle(f"orl report: {namespace}")
    reward_axes.set(xlabel="policy version", ylabel="share (95% CI)", ylim=(-0.02, 1.02))
    quality_axes.set(xlabel="policy version")
    for axes in (reward_axes, quality_axes):
        axes.grid(alpha=0.3)
        if axes.get_legend_handles_labels()[0]:
            axes.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, format="png", metadata={"Software": None})


async def read_report_events(log_url: str, namespace: str) -> dict[str, list[Event]]:
    """Every event of the report's topics; a topic the namespace does not have yet reads as empty."""
    async with open_event_log(log_url) as log:
        return await namespace_events(log, namespace, REPORT_TOPICS)


# VersionFigures field -> the Prometheus gauge `orl_report_<name>{version}` it is exported as
METRIC_FIELDS = (
    "main_turns", "judged_turns", "neutral_turns", "feedback_turns", "satisfied", "relevance", "words", "kl",
    "activations", "held_out_samples", "held_out_relevance", "held_out_style",
)  # fmt: skip


def export_metrics(rows: Sequence[VersionFigures], metrics: Metrics) -> None:
    """The report's figures as gauges labelled by version (a figure the log cannot give is left out)."""
    for row in rows:
        version = str(row.version)
        for name in METRIC_FIELDS:
            value = getattr(row, name)
            if value is not None:
                metrics.set(f"report_{name}", float(value), version=version)
        for name, interval in (("approval", row.approval), ("held_out_score", row.held_out_score)):
            if interval is not None:
                for bound, value in (("mean", interval.mean), ("low", interval.low), ("high", interval.high)):
                    metrics.set(f"report_{name}", value, version=version, bound=bound)
        metrics.set("report_refusals", float(len(row.refusals)), version=version)
        metrics.set("report_rolled_back", float(row.rolled_back is not None), version=version)
        if row.gate is not None:
            metrics.set("report_promoted", float(row.gate.startswith("promoted")), version=version)


def tenant_sessions(settings: ReportSettings) -> frozenset[str]:
    """The sessions of the named tenant --tenant, as the deployment's key store records them."""
    path = settings.effective_key_store()
    if path is None:
        raise ConfigError(
            "--tenant needs the key store (it records which sessions each tenant opened): --key-store is off"
        )
    keys = KeyStore(path)
    try:
        return frozenset(keys.sessions_of_named_tenant(settings.tenant))
    finally:
        keys.close()


def report_once(settings: ReportSettings) -> list[VersionFigures]:
    """Read the namespace, write report.md, .json and .png, and return the rows."""
    scorer = get_scenario(settings.scenario).scorer if settings.scenario else None
    sessions = tenant_sessions(settings) if settings.tenant else None
    events = asyncio.run(read_report_events(settings.effective_log_url(), settings.namespace))
    rows = version_figures(events, scorer, sessions)
    if not rows:
        raise OrlError(f"namespace {settings.namespace!r} has no served turn, checkpoint or activation yet")
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    table = render_markdown(settings.namespace, rows, settings.scenario, settings.tenant)
    (settings.out_dir / "report.md").write_text(table)
    (settings.out_dir / "report.json").write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    plot_report(settings.namespace, rows, settings.out_dir / "report.png")
    return rows


def run_report(settings: ReportSettings) -> int:
    """Entry point of `orl report`: once, or with --metrics-port, again every --refresh-s, forever."""
    rows = report_once(settings)
    print((settings.out_dir / "report.md").read_text(), end="")
    print(f"wrote {settings.out_dir / 'report.md'}, report.json and report.png")
    if not settings.metrics_port:
        return 0
    metrics = Metrics()
    export_metrics(rows, metrics)
    start_http_server(settings.metrics_port, addr="127.0.0.1", registry=metrics.registry)
    print(
        f"metrics at http://127.0.0.1:{settings.metrics_port}/metrics, refreshed every {settings.refresh_s:g} s"
    )
    while True:
        time.sleep(settings.refresh_s)
        export_metrics(report_once(settings), metrics)
