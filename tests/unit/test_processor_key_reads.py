"""Every string key the stream processors read is checked by mypy (issue 43: typed events end to end).

The processors read events as the TypedDicts generated from the .avsc files, and their state as
frozen dataclasses. A string key is checked when a misspelt one is a type error. This test proves
it key by key: it copies pipeline/ to a temporary tree, replaces every string-key subscript and
`.get("...")` in pipeline/processors/ with a misspelt key, runs mypy once per round (one key per
line per round, so an outer misspelling cannot hide an inner one) and looks for each misspelt key
in mypy's report. The only keys allowed to go unreported are those of the state codec's upgrades
(functions that read a state layout stored before the typed states, passed to `frozen_state` as
`upgrades=`) and the one envelope reader every event goes through (`envelope_of`).
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from mypy import api as mypy_api

ROOT = Path(__file__).resolve().parents[2]
PROCESSORS = ROOT / "pipeline" / "processors"
# function -> why its string keys are not TypedDict reads
UNTYPED_BY_DESIGN = {"envelope_of": "reads the envelope of any event, typed or not"}


@dataclass(frozen=True)
class KeyRead:
    module: str
    line: int
    column: int
    end_column: int
    key: str
    function: str

    def misspelt(self) -> str:
        return f"zz_misspelt_{self.module.removesuffix('.py')}_{self.line}_{self.column}"


def key_reads(path: Path) -> list[KeyRead]:
    """Every string-key subscript and `.get("...")` in a module, with the function it is in."""
    tree = ast.parse(path.read_text())
    reads: list[KeyRead] = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            key: ast.expr | None = None
            if isinstance(node, ast.Subscript):
                key = node.slice
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
            ):
                key = node.args[0] if node.args else None
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                assert key.end_col_offset is not None and key.lineno == key.end_lineno
                reads.append(
                    KeyRead(
                        path.name, key.lineno, key.col_offset, key.end_col_offset, key.value, function.name
                    )
                )
    # a read inside a nested function is found from both functions: keep the innermost
    innermost: dict[tuple[int, int], KeyRead] = {}
    for read in reads:
        innermost[(read.line, read.column)] = read
    return sorted(innermost.values(), key=lambda read: (read.line, read.column))


def upgrade_functions(path: Path) -> set[str]:
    """Names of the functions a module passes to `frozen_state(..., upgrades={Type: function})`."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "frozen_state":
            for keyword in node.keywords:
                if keyword.arg == "upgrades" and isinstance(keyword.value, ast.Dict):
                    names.update(value.id for value in keyword.value.values if isinstance(value, ast.Name))
    return names


def every_key_read() -> list[KeyRead]:
    return [read for path in sorted(PROCESSORS.glob("*.py")) for read in key_reads(path)]


def rounds(reads: list[KeyRead]) -> list[list[KeyRead]]:
    """The reads split so that no round misspells two keys on one line."""
    by_line: dict[tuple[str, int], list[KeyRead]] = {}
    for read in reads:
        by_line.setdefault((read.module, read.line), []).append(read)
    depth = max(len(on_line) for on_line in by_line.values())
    return [[on_line[k] for on_line in by_line.values() if k < len(on_line)] for k in range(depth)]


def misspell(tree: Path, reads: list[KeyRead]) -> None:
    """Rewrite the copied modules with each of `reads` misspelt (right to left, so columns hold)."""
    for module in {read.module for read in reads}:
        path = tree / "orl" / "pipeline" / "processors" / module
        lines = (PROCESSORS / module).read_text().splitlines(keepends=True)
        for read in sorted((r for r in reads if r.module == module), key=lambda r: -r.column):
            raw = lines[read.line - 1].encode()
            raw = raw[: read.column] + repr(read.misspelt()).encode() + raw[read.end_column :]
            lines[read.line - 1] = raw.decode()
        path.write_text("".join(lines))


@pytest.fixture(scope="module")
def unreported(tmp_path_factory: pytest.TempPathFactory) -> list[KeyRead]:
    """The key reads whose misspelling mypy does not report."""
    tmp = tmp_path_factory.mktemp("key_reads")
    config = tmp / "mypy.ini"
    config.write_text(
        f"[mypy]\nmypy_path = {tmp / 'src'}\npython_version = 3.11\nignore_missing_imports = True\n"
        "check_untyped_defs = True\n"
    )
    missed: list[KeyRead] = []
    for round_reads in rounds(every_key_read()):
        tree = tmp / "src"
        shutil.rmtree(tree, ignore_errors=True)
        (tree / "orl").mkdir(parents=True)
        (tree / "orl" / "__init__.py").write_text("")
        for package in ("schemas", "rules", "compute"):
            (tree / "orl" / package).symlink_to(ROOT / package, target_is_directory=True)
        shutil.copytree(
            ROOT / "pipeline", tree / "orl" / "pipeline", ignore=shutil.ignore_patterns("__pycache__")
        )
        misspell(tree, round_reads)
        stdout, stderr, _ = mypy_api.run(
            [
                str(tree / "orl" / "pipeline" / "processors"),
                "--config-file",
                str(config),
                "--cache-dir",
                str(tmp / "cache"),
                "--follow-imports=silent",
                "--no-site-packages",  # the `orl` under test is the copy, not the installed one
            ]
        )
        assert not stderr, stderr
        missed += [read for read in round_reads if read.misspelt() not in stdout]
    return missed


def test_the_processors_still_read_string_keys() -> None:
    """The scan sees the reads it is meant to check (a scan that found none would prove nothing)."""
    reads = every_key_read()
    assert len(reads) >= 40
    assert any(read.module == "sample_inputs.py" and read.key == "request_id" for read in reads)


def test_a_misspelt_key_is_a_type_error_everywhere_but_the_codec(unreported: list[KeyRead]) -> None:
    allowed = {name for path in PROCESSORS.glob("*.py") for name in upgrade_functions(path)} | set(
        UNTYPED_BY_DESIGN
    )
    assert "response_layout" in allowed  # the sample builder's upgrade of pre-2026-12-02 states
    unchecked = [read for read in unreported if read.function not in allowed]
    assert unchecked == [], "string keys that mypy does not check:\n" + "\n".join(
        f"  {read.module}:{read.line} {read.function}: {read.key!r}" for read in unchecked
    )


def test_the_audit_tells_checked_from_unchecked(unreported: list[KeyRead]) -> None:
    """The upgrades read plain dicts, so mypy misses their misspellings and the audit says so; the
    event reads are TypedDict reads, so it reports theirs (an audit that saw no difference would
    prove nothing)."""
    assert {read.key for read in unreported if read.function == "response_layout"} >= {"arrays", "problem"}
    reported = [read for read in every_key_read() if read not in unreported]
    assert len(reported) >= 40
    assert any(read.function == "record_request" and read.key == "request_id" for read in reported)
