"""Training samples as a JSON-lines file: what the megatron worker reads instead of the samples topic.

One JSON object per line with the SampleReady fields the loss needs: `sample_id`, `method`
(binary | opd | combined), `prompt_ids`, `response_ids`, `rollout_logprobs`, `temperature`, and
optionally `reward`, `teacher_logprobs` (null when absent) and `policy_version`. `write_samples` is
the inverse (for tools and tests). Reads / writes a local file; no topics or object keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from orl.connectors.event_log.base import TopicPartition
from orl.schemas.errors import ConfigError
from orl.trainer.batching import METHODS, TrainingSample

_SOURCE = TopicPartition("samples-file", 0)


def _optional_floats(value: Any) -> tuple[float, ...] | None:
    return None if value is None else tuple(float(x) for x in value)


def sample_from_json(body: dict[str, Any], line: int) -> TrainingSample:
    """One TrainingSample from a decoded line; ConfigError names the line of a bad sample."""
    try:
        sample = TrainingSample(
            sample_id=str(body["sample_id"]),
            method=str(body["method"]),
            prompt_ids=tuple(int(x) for x in body["prompt_ids"]),
            response_ids=tuple(int(x) for x in body["response_ids"]),
            rollout_logprobs=tuple(float(x) for x in body["rollout_logprobs"]),
            temperature=float(body["temperature"]),
            reward=None if body.get("reward") is None else float(body["reward"]),
            teacher_logprobs=_optional_floats(body.get("teacher_logprobs")),
            policy_version=int(body.get("policy_version", 0)),
            position=_SOURCE,
            offset=line,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"samples file line {line + 1}: not a training sample ({exc!r})") from exc
    if sample.method not in METHODS:
        raise ConfigError(f"samples file line {line + 1}: method {sample.method!r} is not one of {METHODS}")
    if not sample.prompt_ids or not sample.response_ids:
        raise ConfigError(f"samples file line {line + 1}: empty prompt or response")
    return sample


def read_samples(path: Path) -> list[TrainingSample]:
    """Every sample of the file, in order (blank lines skipped)."""
    samples = []
    for line, text in enumerate(Path(path).read_text().splitlines()):
        if text.strip():
            samples.append(sample_from_json(json.loads(text), line))
    return samples


def sample_to_json(sample: TrainingSample) -> dict[str, Any]:
    return {
        "sample_id": sample.sample_id,
        "method": sample.method,
        "prompt_ids": list(sample.prompt_ids),
        "response_ids": list(sample.response_ids),
        "rollout_logprobs": list(sample.rollout_logprobs),
        "temperature": sample.temperature,
        "reward": sample.reward,
        "teacher_logprobs": None if sample.teacher_logprobs is None else list(sample.teacher_logprobs),
        "policy_version": sample.policy_version,
    }


def write_samples(path: Path, samples: Iterable[TrainingSample]) -> None:
    Path(path).write_text("".join(json.dumps(sample_to_json(s)) + "\n" for s in samples))
