"""The processing-error policy: a record whose processing raises is dead-lettered with its
traceback, and the runner goes on past it (before, the process died, and its restart replayed the
same record and died again). Real SQLite log, the real turn linker, one poison event among them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from orl.connectors.event_log.reading import read_to_end
from orl.connectors.event_log.sqlite_log import SqliteEventLog
from orl.pipeline.processors.config import PipelineConfig
from orl.pipeline.processors.contract import ProcessResult
from orl.pipeline.processors.event_building import Event, State
from orl.pipeline.processors.turn_linker import TurnLinker
from orl.pipeline.runtime.stream_runner import StreamRunner
from orl.schemas.codec import decode
from orl.schemas.topics import dlq_topic, topic_name

from tests.component.test_stream_runner_restart import append
from tests.unit.pipeline_streams import NAMESPACE, Conversation

pytestmark = pytest.mark.timeout(60)
POISON = "this message breaks the stage"


class BrittleLinker(TurnLinker):
    """The turn linker, with a bug that one message triggers."""

    def process(self, state: State | None, event: Event, config: PipelineConfig) -> ProcessResult:
        if POISON in str(event.get("messages_json", "")):
            raise KeyError("a field this stage expected")
        return super().process(state, event, config)


async def test_a_record_that_raises_is_dead_lettered_with_its_traceback_and_the_rest_go_on(
    tmp_path: Path,
) -> None:
    healthy, poisoned = Conversation("healthy"), Conversation("poisoned")
    for chat, text in ((healthy, "What is 2 + 2?"), (poisoned, POISON), (healthy, "Thanks, right.")):
        chat.say(text)
        chat.turn("An answer.")
    async with SqliteEventLog(tmp_path / "log.db") as log:
        runner = StreamRunner(log, BrittleLinker(), PipelineConfig(), NAMESPACE)
        await runner.prepare()
        await append(log, healthy.events + poisoned.events)
        await runner.run_until_idle()  # raised out of here before the policy
        letters = [
            decode(r.value) for r in await read_to_end(log, dlq_topic(topic_name(NAMESPACE, "requests")))
        ]
        next_states = [decode(r.value) for r in await read_to_end(log, topic_name(NAMESPACE, "next_states"))]
    assert len(letters) == 1
    (letter,) = letters
    assert letter["envelope"]["event_type"] == "DeadLettered"
    assert "turn_linker raised KeyError" in letter["error"] and "Traceback" in letter["error"]
    assert POISON in letter["original_bytes"].decode(errors="replace")
    # the healthy session went on: its first turn's next state is the user's second message
    assert [e["envelope"]["session_id"] for e in next_states] == ["healthy"]
