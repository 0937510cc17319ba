"""The pure processors by stage name, as the runtimes load them (checked against the topology by tests).

Reads and writes no topics itself.
"""

from __future__ import annotations

from orl.pipeline.processors.contract import Processor
from orl.pipeline.processors.group_advantage import GROUP_ADVANTAGE
from orl.pipeline.processors.hint_selector import HINT_SELECTOR
from orl.pipeline.processors.sample_builder import SAMPLE_BUILDER
from orl.pipeline.processors.turn_linker import TURN_LINKER
from orl.pipeline.processors.vote_tally import VOTE_TALLY

PURE_PROCESSORS: dict[str, Processor] = {
    processor.name: processor
    for processor in (TURN_LINKER, VOTE_TALLY, HINT_SELECTOR, SAMPLE_BUILDER, GROUP_ADVANTAGE)
}
