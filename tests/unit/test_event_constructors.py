"""schemas/event_constructors.py: typed writes, equal to make_event's, checked by mypy, used everywhere.

The mypy test is the one that matters: a constructor call with a misspelt or missing field must be
a type error naming the field, and a correct call none. The AST scan keeps `make_event` (untyped
keyword arguments) out of the code that writes events.
"""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from mypy import api as mypy_api
from orl.schemas import event_constructors
from orl.schemas.codec import decode, encode
from orl.schemas.events import EVENT_TYPES, EventOrigin, make_event
from orl.schemas.registry import default_registry

from tests.unit.event_examples import SESSION_ID, TURN_ID, example_event

ROOT = Path(__file__).resolve().parents[2]


def constructor_of(event_type: str) -> Any:
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", event_type).lower()
    return getattr(event_constructors, name)


def origin_of(event: dict[str, Any]) -> EventOrigin:
    """The origin `tests/unit/event_examples.py` built `event` from."""
    envelope = event["envelope"]
    return EventOrigin(
        namespace=envelope["namespace"],
        producer=envelope["producer"],
        occurred_at_ms=envelope["occurred_at"],
        id_parts=(SESSION_ID, TURN_ID),
        session_id=envelope["session_id"],
        turn_id=envelope["turn_id"],
    )


def test_one_constructor_per_event_type_in_catalog_order() -> None:
    functions = [
        name
        for name, value in vars(event_constructors).items()
        if inspect.isfunction(value) and value.__module__ == event_constructors.__name__
    ]
    assert functions == [constructor_of(event_type).__name__ for event_type in EVENT_TYPES]
    assert constructor_of("SampleReady") is event_constructors.sample_ready
    assert constructor_of("DeadLettered") is event_constructors.dead_lettered


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_parameters_are_the_payload_fields_all_required_keywords(event_type: str) -> None:
    parameters = list(inspect.signature(constructor_of(event_type)).parameters.values())
    fields = [f["name"] for f in default_registry().current(event_type).schema["fields"]]
    assert parameters[0].name == "origin"
    assert [p.name for p in parameters[1:]] == [f for f in fields if f != "envelope"]
    for parameter in parameters[1:]:
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, parameter
        assert parameter.default is inspect.Parameter.empty, parameter


@pytest.mark.parametrize("event_type", EVENT_TYPES)
def test_constructor_builds_what_make_event_builds(event_type: str) -> None:
    expected = example_event(event_type)  # built with make_event
    payload = {key: value for key, value in expected.items() if key != "envelope"}
    built = constructor_of(event_type)(origin_of(expected), **payload)
    assert built == expected
    assert encode(built) == encode(expected)
    assert decode(encode(built)) == decode(encode(expected))


def test_a_call_by_name_equals_make_event() -> None:
    origin = EventOrigin(
        namespace="live",
        producer="pipeline/0.1.0",
        occurred_at_ms=1_000,
        id_parts=("sess-1", "explicit"),
        session_id="sess-1",
    )
    built = event_constructors.session_closed(origin, reason="explicit", last_turn_id="turn-2")
    assert built == make_event(
        "SessionClosed",
        namespace="live",
        producer="pipeline/0.1.0",
        occurred_at_ms=1_000,
        id_parts=["sess-1", "explicit"],
        session_id="sess-1",
        reason="explicit",
        last_turn_id="turn-2",
    )
    dead = event_constructors.dead_lettered(
        EventOrigin(
            namespace="live", producer="pipeline/0.1.0", occurred_at_ms=5, id_parts=("requests", 0, 7)
        ),
        source_topic="live.requests",
        source_partition=0,
        source_offset=7,
        original_bytes=b"\x00\x01",
        error="bad bytes",
    )
    assert (
        dead["envelope"]["event_id"]
        == make_event(
            "DeadLettered", namespace="live", producer="x", occurred_at_ms=0, id_parts=["requests", 0, 7]
        )["envelope"]["event_id"]
    )
    assert decode(encode(dead)) == dead


def test_a_missing_field_is_a_type_error_at_run_time() -> None:
    origin = EventOrigin(namespace="live", producer="p/1", occurred_at_ms=1, id_parts=("s",))
    with pytest.raises(TypeError, match="last_turn_id"):
        event_constructors.session_closed(origin, reason="explicit")  # type: ignore[call-arg]


# --- mypy sees every field of a write -------------------------------------------------------------

_PROBE_HEAD = """\
from orl.schemas.event_constructors import session_closed
from orl.schemas.event_types import SessionClosed
from orl.schemas.events import EventOrigin

origin = EventOrigin(namespace="live", producer="p/1", occurred_at_ms=1, id_parts=("s",), session_id="s")
"""
PROBES = {
    "correct": 'event: SessionClosed = session_closed(origin, reason="explicit", last_turn_id=None)\n',
    "misspelt": 'session_closed(origin, reasn="explicit", last_turn_id=None)\n',
    "missing": 'session_closed(origin, reason="explicit")\n',
    "mistyped": "session_closed(origin, reason=3, last_turn_id=None)\n",
}


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """mypy's report per probe file, from one run over a tree with only `orl.schemas` in it."""
    tmp = tmp_path_factory.mktemp("mypy_probe")
    package = tmp / "src" / "orl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "schemas").symlink_to(ROOT / "schemas", target_is_directory=True)
    config = tmp / "mypy.ini"
    config.write_text(
        f"[mypy]\nmypy_path = {tmp / 'src'}\npython_version = 3.11\nignore_missing_imports = True\n"
    )
    for name, body in PROBES.items():
        (tmp / f"{name}.py").write_text(_PROBE_HEAD + body)
    stdout, stderr, _ = mypy_api.run(
        [
            *(str(tmp / f"{name}.py") for name in PROBES),
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp / "cache"),
            "--follow-imports=silent",
            "--no-site-packages",  # the `orl` under test is the tree above, not the installed one
            "--show-error-codes",
        ]
    )
    assert not stderr, stderr
    return {name: "\n".join(line for line in stdout.splitlines() if f"{name}.py:" in line) for name in PROBES}


def test_mypy_accepts_a_correct_write(mypy_errors: dict[str, str]) -> None:
    assert mypy_errors["correct"] == ""


def test_mypy_names_a_misspelt_field(mypy_errors: dict[str, str]) -> None:
    assert 'Unexpected keyword argument "reasn" for "session_closed"' in mypy_errors["misspelt"]


def test_mypy_names_a_missing_field(mypy_errors: dict[str, str]) -> None:
    assert 'Missing named argument "last_turn_id" for "session_closed"' in mypy_errors["missing"]


def test_mypy_names_a_mistyped_field(mypy_errors: dict[str, str]) -> None:
    assert 'Argument "reason" to "session_closed" has incompatible type "int"' in mypy_errors["mistyped"]


# --- nothing outside schemas/ writes events untyped -----------------------------------------------

# module (relative to the repository) -> why it may still call make_event
ALLOWED_CALLERS = {
    "schemas/events.py": "defines make_event and the constructors' event_from_origin",
    "schemas/event_constructors.py": "the typed constructors themselves",
}


def package_folders() -> list[Path]:
    """The folders of the `orl` import package, as pyproject.toml's package-dir maps them."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [ROOT / folder for folder in pyproject["tool"]["setuptools"]["package-dir"].values()]


def make_event_uses(path: Path) -> list[int]:
    """Lines that call or import `make_event` (an import could rename it)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name == "make_event":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(alias.name == "make_event" for alias in node.names):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_schemas_calls_make_event() -> None:
    folders = package_folders()
    assert ROOT / "pipeline" in folders and ROOT / "schemas" in folders
    uses = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in folders
        for path in sorted(folder.rglob("*.py"))
        if str(path.relative_to(ROOT)) not in ALLOWED_CALLERS
        for line in make_event_uses(path)
    ]
    assert not uses, (
        "write events with the typed constructors of orl.schemas.event_constructors, not make_event: "
        + ", ".join(uses)
    )


def test_the_scan_sees_a_call(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from orl.schemas import events\n\nevents.make_event('SessionClosed')\n")
    assert make_event_uses(probe) == [3]
