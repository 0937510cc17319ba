"""The folder boundaries of DESIGN.md, enforced: which of our packages each package may import."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"schemas", "connectors", "serving", "pipeline", "trainer", "orl"}
ALLOWED = {
    "schemas": {"schemas"},
    "connectors": {"schemas", "connectors"},
    "serving": {"schemas", "connectors", "serving"},
    "pipeline": {"schemas", "connectors", "pipeline"},
    "trainer": {"schemas", "connectors", "trainer"},
    "orl": OURS,
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package: str) -> None:
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in sorted(imported_packages(path) - ALLOWED[package]):
            violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "boundary violations:\n" + "\n".join(violations)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import trainer.loop\nfrom serving import server\nfrom . import sibling\n")
    assert imported_packages(bad) == {"trainer", "serving"}


# pipeline/'s four layers: each may import the layers before it, never one after it.
PIPELINE_LAYERS = ("processors", "effects", "runtime", "history")
# What a pure processor may import besides schemas and pipeline.processors: standard-library modules
# that do no I/O, read no clock, draw no randomness and start nothing (logging is diagnostics only).
PURE_STDLIB = {
    "__future__", "abc", "base64", "bisect", "collections", "copy", "dataclasses", "enum", "functools",
    "hashlib", "heapq", "itertools", "json", "logging", "math", "operator", "re", "string", "struct",
    "textwrap", "typing",
}  # fmt: skip
IMPURE_BUILTINS = {"open", "input", "print", "exec", "eval", "__import__"}


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name `path` imports (`from a.b import c` -> "a.b")."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            names.add(str(node.module))
    return names


def pipeline_layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pipeline" and parts[1] in PIPELINE_LAYERS else None


@pytest.mark.parametrize("layer", PIPELINE_LAYERS)
def test_pipeline_layers_import_only_earlier_layers(layer: str) -> None:
    allowed = set(PIPELINE_LAYERS[: PIPELINE_LAYERS.index(layer) + 1])
    violations = []
    for path in sorted((ROOT / "pipeline" / layer).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            used = pipeline_layer(module)
            if module.startswith("pipeline") and (
                used is None and module != "pipeline" or used not in allowed
            ):
                violations.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not violations, "layer violations:\n" + "\n".join(violations)


def test_pipeline_holds_nothing_outside_its_layers() -> None:
    assert sorted(p.name for p in (ROOT / "pipeline").glob("*.py")) == ["__init__.py"]


def impurities(path: Path) -> list[str]:
    found = []
    for module in sorted(imported_modules(path)):
        top = module.split(".")[0]
        if top == "schemas" or module.startswith("pipeline.processors") or top in PURE_STDLIB:
            continue
        found.append(f"imports {module}")
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IMPURE_BUILTINS:
            found.append(f"calls {node.func.id}() on line {node.lineno}")
    return found


def test_processors_are_pure() -> None:
    """Processors do no I/O, read no clock and start no runtime: they import schemas, pipeline.processors
    and side-effect-free standard modules only, and call no I/O builtin."""
    violations = [
        f"{path.relative_to(ROOT)} {what}"
        for path in sorted((ROOT / "pipeline" / "processors").rglob("*.py"))
        for what in impurities(path)
    ]
    assert not violations, "impure processors:\n" + "\n".join(violations)


def test_the_purity_check_sees_clock_io_and_runtime(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nfrom datetime import datetime\nfrom pipeline.runtime.host import ProcessorHost\n"
        "import json\nfrom schemas.codec import encode\nopen('x')\n"
    )
    assert impurities(bad) == [
        "imports datetime", "imports pipeline.runtime.host", "imports time", "calls open() on line 6",
    ]  # fmt: skip
