"""The topology as data: every produced topic is consumed, processors match their declared stages."""

from __future__ import annotations

from orl.pipeline.processors.contract import Processor
from orl.pipeline.processors.registry import PURE_PROCESSORS
from orl.pipeline.processors.topology import (
    STAGES,
    consumers_by_topic,
    pipeline_topics,
    unconsumed_topics,
    unproduced_topics,
)
from orl.schemas.topics import TOPICS


def test_every_produced_topic_has_a_consumer() -> None:
    assert unconsumed_topics() == []
    assert consumers_by_topic()["samples"] == ["trainer"]


def test_every_read_topic_has_a_producer() -> None:
    assert unproduced_topics() == []


def test_topics_are_catalog_topics() -> None:
    assert set(pipeline_topics()) <= set(TOPICS)


def test_pure_processors_are_exactly_the_pure_stages() -> None:
    pure = {stage.name: stage for stage in STAGES if stage.kind == "pure"}
    assert set(PURE_PROCESSORS) == set(pure)
    for name, processor in PURE_PROCESSORS.items():
        assert isinstance(processor.inputs, tuple)
        assert (processor.inputs, processor.outputs) == (pure[name].inputs, pure[name].outputs)


def test_effect_stages_are_judge_and_teacher() -> None:
    assert {stage.name for stage in STAGES if stage.kind == "effect"} == {"judge", "teacher"}


def takes_processor(processor: Processor) -> str:
    return processor.name


def test_processors_satisfy_the_protocol() -> None:
    assert [takes_processor(p) for p in PURE_PROCESSORS.values()] == list(PURE_PROCESSORS)
