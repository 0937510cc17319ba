"""The connector API: code that turns what happened after a response into a next state.

A connector looks at one turn (`TurnContext`: session, turn, what the model answered, plus the
connector's own input such as a command to run) and returns an `Observation` (role, content and an
optional structured `Outcome`: exit code, test verdict, thumbs, reward), or None when it has
nothing to say. `outcome_events.outcome_event` turns an observation into a NextStateObserved event;
the server's ingest routes and the agent-side helpers spool or post it.

Connectors are found by name: the built-ins (`shell`, `pytest`) plus every entry point in the
group "orl.connectors" whose value is a zero-argument factory (usually the class itself):

    [project.entry-points."orl.connectors"]
    my_env = "my_pkg.connector:MyConnector"

A connector is third-party code: `run_connector` calls it with a time limit and turns an exception
or a hang into an error observation (outcome kind "connector_error"), so a broken plugin never
takes its caller down. Reads and writes no topics.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Protocol, TypeVar, runtime_checkable

from orl.schemas.errors import ConfigError
from orl.schemas.event_types import Outcome as OutcomeRecord

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "orl.connectors"
F = TypeVar("F", bound=Callable[..., Any])
ROLES = ("user", "tool", "environment")
ERROR_KIND = "connector_error"
Message = dict[str, Any]


@dataclass(frozen=True)
class TurnContext:
    """The turn a connector observes. `payload` is the connector's own input (a command, a webhook body)."""

    session_id: str
    turn_id: str
    response_text: str = ""
    tool_calls: tuple[Message, ...] = ()
    messages: tuple[Message, ...] = ()
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """A structured result (the Avro `Outcome` record; `detail` is stored as JSON)."""

    kind: str
    reward: float | None = None
    exit_code: int | None = None
    passed: int | None = None
    failed: int | None = None
    errors: int | None = None
    thumbs: int | None = None
    detail: Mapping[str, Any] | None = None

    def record(self) -> OutcomeRecord:
        """The Avro `Outcome` record."""
        return {
            "kind": self.kind,
            "reward": None if self.reward is None else float(self.reward),
            "exit_code": self.exit_code,
            "passed": self.passed,
            "failed": self.failed,
            "errors": self.errors,
            "thumbs": self.thumbs,
            "detail_json": None
            if self.detail is None
            else json.dumps(self.detail, ensure_ascii=False, sort_keys=True),
        }


@dataclass(frozen=True)
class Observation:
    """What a connector saw after a turn: the next state's role and content, and optionally an outcome."""

    content: str
    role: str = "environment"
    outcome: Outcome | None = None
    messages: tuple[Message, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.content, str):
            raise TypeError(f"content must be a string; got {type(self.content).__name__}")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {self.role!r}")

    @property
    def failed(self) -> bool:
        """True when this observation reports that the connector itself failed."""
        return self.outcome is not None and self.outcome.kind == ERROR_KIND


@runtime_checkable
class Connector(Protocol):
    """Turns what happened after a response into an observation (or None: nothing observed)."""

    name: str

    def observe(self, context: TurnContext) -> Observation | None: ...


ConnectorFactory = Callable[[], Connector]


def built_in_connectors() -> dict[str, ConnectorFactory]:
    from orl.connectors.environment.pytest_runner import PytestConnector
    from orl.connectors.environment.shell import ShellConnector

    return {"shell": ShellConnector, "pytest": PytestConnector}


def discover_connectors() -> dict[str, ConnectorFactory]:
    """Every connector by name: the built-ins, then the "orl.connectors" entry points."""
    return discover_plugins(ENTRY_POINT_GROUP, built_in_connectors(), "connector")


def discover_plugins(group: str, built_ins: dict[str, F], what: str) -> dict[str, F]:
    """The built-ins by name, then every entry point of `group` (a zero-argument factory).

    An entry point that fails to import is logged and skipped (one broken plugin must not hide the
    others); a plugin may not replace a built-in. Connectors ("orl.connectors") and environments
    ("orl.environments", connectors/environment/episode.py) are found this way.
    """
    found = dict(built_ins)
    for entry_point in entry_points(group=group):
        if entry_point.name in found:
            built_in = found[entry_point.name]
            if entry_point.value != f"{built_in.__module__}:{built_in.__qualname__}":
                logger.warning("%s entry point %r ignored: the name is taken", what, entry_point.name)
            continue
        try:
            factory = entry_point.load()
        except Exception as error:  # third-party import: any failure means "not available"
            logger.warning("%s entry point %r failed to load: %s", what, entry_point.name, error)
            continue
        if not callable(factory):
            logger.warning("%s entry point %r is not callable", what, entry_point.name)
            continue
        found[entry_point.name] = factory
    return found


def load_connector(name: str) -> Connector:
    """A connector instance by name; ConfigError naming the known ones when there is none."""
    factories = discover_connectors()
    if name not in factories:
        raise ConfigError(f"no connector {name!r}; known: {', '.join(sorted(factories))}")
    return factories[name]()


def error_observation(connector_name: str, reason: str, *, timed_out: bool = False) -> Observation:
    return Observation(
        content=f"(connector {connector_name!r} failed: {reason})",
        role="environment",
        outcome=Outcome(
            kind=ERROR_KIND, detail={"connector": connector_name, "error": reason, "timed_out": timed_out}
        ),
    )


def run_connector(connector: Connector, context: TurnContext, *, timeout_s: float) -> Observation | None:
    """Call `connector.observe` in a worker thread with a time limit; failures become error observations.

    A connector that hangs is abandoned (its daemon thread cannot be killed and is left to finish
    on its own); the caller gets an error observation after `timeout_s` either way.
    """
    name = str(getattr(connector, "name", type(connector).__name__))
    result: list[Observation | None] = []
    failure: list[BaseException] = []

    def call() -> None:
        try:
            result.append(connector.observe(context))
        except Exception as error:  # plugin code: every failure is reported, never raised into the caller
            failure.append(error)

    worker = threading.Thread(target=call, name=f"connector-{name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        logger.warning("connector %s timed out after %.1f s on turn %s", name, timeout_s, context.turn_id)
        return error_observation(name, f"no answer within {timeout_s:g} s", timed_out=True)
    if failure:
        error = failure[0]
        logger.warning("connector %s raised on turn %s: %r", name, context.turn_id, error)
        return error_observation(name, f"{type(error).__name__}: {error}")
    observation = result[0] if result else None
    if observation is not None and not isinstance(observation, Observation):
        return error_observation(name, f"observe returned {type(observation).__name__}, not Observation")
    return observation
