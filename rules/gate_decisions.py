"""The promotion gate's decisions on one run, as every reader of `checkpoints` takes them in.

`orl gate` appends PolicyGated events (decision PROMOTED or HELD) to `checkpoints`. The gate itself
(gate/runner.py), the trainer (trainer/gate_holds.py), servers behind the gate
(serving/checkpoint_follower.py) and the demo read them into a `GateDecisions`. Pure: reads no topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROMOTED, HELD = "promoted", "held"


@dataclass
class GateDecisions:
    """One run's decisions: the newest promoted version (0: the base model) and the held ones."""

    run_id: str
    promoted: int = 0
    reasons: dict[int, tuple[str, str]] = field(default_factory=dict)  # version -> (decision, reason)

    @property
    def held(self) -> dict[int, str]:
        """The versions whose latest decision is HELD, with the gate's reason."""
        return {version: reason for version, (decision, reason) in self.reasons.items() if decision == HELD}

    def read(self, event: Mapping[str, Any]) -> bool:
        """Take in one event of `checkpoints`; whether it was the gate's decision on this run. A version
        decided again (promoted after a hold) takes its latest decision."""
        if event["envelope"]["event_type"] != "PolicyGated" or event.get("run_id") != self.run_id:
            return False
        version, decision, reason = int(event["version"]), str(event["decision"]), str(event["reason"])
        self.reasons[version] = (decision, reason)
        if decision == PROMOTED:
            self.promoted = max(self.promoted, version)
        return True

    def decided(self, version: int) -> bool:
        return version in self.reasons
