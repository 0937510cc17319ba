"""`orl samples`: list the samples the pipeline produced (and the rejections, with their reasons), and
how the judge's votes went: an LLM judge whose votes mostly fail to parse gives no real reward.

Reads the namespace's samples and judge_votes topics."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from orl.connectors.event_log.factory import open_event_log
from orl.connectors.settings import ConnectionSettings, JsonOutputSettings, setting
from orl.pipeline.history.namespace_io import read_events
from orl.schemas.topics import topic_name


@dataclass(frozen=True)
class SamplesSettings(ConnectionSettings, JsonOutputSettings):
    limit: int = setting(20, "ORL_LIMIT", "Show at most this many of the newest samples.")


def sample_row(event: dict) -> dict[str, object]:
    envelope = event["envelope"]
    ready = envelope["event_type"] == "SampleReady"
    return {
        "sample_id": envelope["event_id"],
        "session_id": envelope["session_id"],
        "turn_id": envelope["turn_id"],
        "status": "ready" if ready else "rejected",
        "method": event["method"],
        "reward": event.get("reward") if ready else None,
        "opd": bool(event.get("teacher_logprobs")) if ready else None,
        "tokens": len(event["response_token_ids"]) if ready else None,
        "policy_version": event.get("policy_version"),
        "promoted": event.get("promoted"),
        "reason": None if ready else event["reason"],
    }


@dataclass(frozen=True)
class VoteSummary:
    """The reward judge's votes in a namespace: how many, by kind, and how many LLM votes failed to parse."""

    rule: int = 0
    llm: int = 0
    llm_unparsed: int = 0

    def line(self) -> str:
        if not self.rule + self.llm:
            return "judge votes: none yet"
        text = f"judge votes: {self.rule + self.llm} ({self.rule} by rules, {self.llm} by an LLM judge"
        if self.llm:
            share = self.llm_unparsed / self.llm
            text += f", {self.llm_unparsed} of them failed to parse ({share:.0%})"
            if share >= 0.5:
                text += (
                    "; most LLM votes give no reward: use a capable judge (--judge-url) or --judge reaction"
                )
        return text + ")"


def vote_summary(votes: list[dict]) -> VoteSummary:
    rule = [v for v in votes if v["judge_kind"] == "rule"]
    llm = [v for v in votes if v["judge_kind"] != "rule"]
    return VoteSummary(len(rule), len(llm), sum(v["parse_error"] is not None for v in llm))


async def read_samples(log_url: str, namespace: str) -> list[dict]:
    async with open_event_log(log_url) as log:  # a forgotten sample (`orl forget`) is left out
        return [sample_row(event) async for event in read_events(log, topic_name(namespace, "samples"))]


async def read_vote_summary(log_url: str, namespace: str) -> VoteSummary:
    async with open_event_log(log_url) as log:
        return vote_summary([event async for event in read_events(log, topic_name(namespace, "judge_votes"))])


def list_samples(settings: SamplesSettings) -> int:
    rows = asyncio.run(read_samples(settings.effective_log_url(), settings.namespace))
    votes = asyncio.run(read_vote_summary(settings.effective_log_url(), settings.namespace))
    ready = sum(r["status"] == "ready" for r in rows)
    shown = rows[-settings.limit :]
    if settings.json:
        for row in shown:
            print(json.dumps(row))
        return 0
    print(
        f"{len(rows)} samples in namespace {settings.namespace!r}: {ready} ready, {len(rows) - ready} rejected"
    )
    for r in shown:
        detail = (
            (
                f"reward={r['reward']} opd={r['opd']} tokens={r['tokens']} v{r['policy_version']}"
                + (" promoted" if r["promoted"] else "")
            )
            if r["status"] == "ready"
            else f"reason={r['reason']}"
        )
        print(f"{r['sample_id']}  {r['status']:<8} {r['method']:<8} {r['turn_id']}  {detail}")
    print(votes.line())
    return 0
