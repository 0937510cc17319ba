"""The folder boundaries of DESIGN.md, enforced: which of our packages each package may import.

orl installs one import package, `orl`: the top-level folders are its subpackages (`pipeline/` is
`orl.pipeline`, pyproject.toml's package-dir), and the modules of `orl/` itself are the application
layer above them (the CLI, `orl up`, the demo). A module's package is the folder it lives in."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBPACKAGES = ("schemas", "rules", "compute", "connectors", "serving", "pipeline", "trainer", "gate")
OURS = {*SUBPACKAGES, "orl"}
# rules/ holds the pure rules several components apply alike; compute/ the torch processes' shared
# runtime (numerics, cores): no connector, so the pure-Python pipeline has no use for it.
BASE = {"schemas", "rules"}
ALLOWED = {
    "schemas": {"schemas"},
    "rules": BASE,
    "compute": {*BASE, "compute"},
    "connectors": {*BASE, "connectors"},
    "serving": {*BASE, "compute", "connectors", "serving"},
    "pipeline": {*BASE, "connectors", "pipeline"},
    "trainer": {*BASE, "compute", "connectors", "trainer"},
    # the gate runs a model copy (serving's backend) and the run's judge (the pipeline's effects)
    "gate": {*BASE, "compute", "connectors", "serving", "pipeline", "gate"},
    "orl": OURS,
}


def package_of(module: str) -> str | None:
    """Which of our packages an absolute module name belongs to ("orl.pipeline.x" -> "pipeline",
    "orl.cli" -> "orl"); a bare old top-level name ("pipeline.x") is reported as itself, so that an
    import the move to `orl` missed shows as a violation; None: not ours."""
    parts = module.split(".")
    if parts[0] == "orl":
        return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "orl"
    return f"{parts[0]} (not under orl)" if parts[0] in SUBPACKAGES else None


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "orl":  # `from orl import pipeline` imports the subpackage
                modules.extend(f"orl.{alias.name}" for alias in node.names)
            else:
                modules.append(node.module)
    return {package for module in modules if (package := package_of(module)) is not None}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_it_may(package: str) -> None:
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in sorted(imported_packages(path) - ALLOWED[package]):
            violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "boundary violations:\n" + "\n".join(violations)


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import orl.trainer.loop\nfrom orl.serving import server\nfrom . import sibling\n"
        "from orl import cli\nimport pipeline.runtime\n"
    )
    assert imported_packages(bad) == {"trainer", "serving", "orl", "pipeline (not under orl)"}


def test_the_tests_benchmarks_and_scripts_import_our_code_only_through_orl() -> None:
    old = [
        f"{path.relative_to(ROOT)} imports {name}"
        for folder in ("tests", "benchmarks", "scripts", "examples")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in sorted(imported_packages(path))
        if name.endswith("(not under orl)")
    ]
    assert not old, "old top-level imports:\n" + "\n".join(old)


# pipeline/'s four layers: each may import the layers before it, never one after it.
PIPELINE_LAYERS = ("processors", "effects", "runtime", "history")
# What a pure processor may import besides schemas and orl.pipeline.processors: standard-library modules
# that do no I/O, read no clock, draw no randomness and start nothing (logging is diagnostics only).
PURE_STDLIB = {
    "__future__", "abc", "base64", "bisect", "collections", "copy", "dataclasses", "enum", "functools",
    "hashlib", "heapq", "itertools", "json", "logging", "math", "operator", "re", "string", "struct",
    "textwrap", "types", "typing",
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
    inside = parts[:2] == ["orl", "pipeline"] and len(parts) > 2 and parts[2] in PIPELINE_LAYERS
    return parts[2] if inside else None


@pytest.mark.parametrize("layer", PIPELINE_LAYERS)
def test_pipeline_layers_import_only_earlier_layers(layer: str) -> None:
    allowed = set(PIPELINE_LAYERS[: PIPELINE_LAYERS.index(layer) + 1])
    violations = []
    for path in sorted((ROOT / "pipeline" / layer).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            used = pipeline_layer(module)
            if module.startswith("orl.pipeline") and (
                used is None and module != "orl.pipeline" or used not in allowed
            ):
                violations.append(f"{path.relative_to(ROOT)} imports {module}")
    assert not violations, "layer violations:\n" + "\n".join(violations)


def test_pipeline_holds_nothing_outside_its_layers() -> None:
    assert sorted(p.name for p in (ROOT / "pipeline").glob("*.py")) == ["__init__.py"]


# Pure modules outside processors/ and rules/ (the trainer's control plane, the gate's rule), each
# with the pure modules of its own package it may import.
PURE_MODULES = {
    "trainer/control.py": {"orl.trainer.rollback"},
    "trainer/rollback.py": set(),
    "gate/promotion_rule.py": set(),
}


def impurities(path: Path, also_pure: frozenset[str] | set[str] = frozenset()) -> list[str]:
    found = []
    for module in sorted(imported_modules(path)):
        top = module.split(".")[0]
        ours_and_pure = module in ("orl.schemas", "orl.rules", *also_pure) or module.startswith(
            ("orl.schemas.", "orl.rules.", "orl.pipeline.processors")
        )
        if ours_and_pure or top in PURE_STDLIB:
            continue
        found.append(f"imports {module}")
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IMPURE_BUILTINS:
            found.append(f"calls {node.func.id}() on line {node.lineno}")
    return found


@pytest.mark.parametrize("folder", ["pipeline/processors", "rules"])
def test_processors_and_rules_are_pure(folder: str) -> None:
    """Processors and shared rules do no I/O, read no clock and start no runtime: they import
    schemas, rules, orl.pipeline.processors and side-effect-free standard modules only, and call no
    I/O builtin."""
    violations = [
        f"{path.relative_to(ROOT)} {what}"
        for path in sorted((ROOT / folder).rglob("*.py"))
        for what in impurities(path)
    ]
    assert not violations, "impure modules:\n" + "\n".join(violations)


@pytest.mark.parametrize("module", sorted(PURE_MODULES))
def test_control_planes_and_the_gate_rule_are_pure(module: str) -> None:
    """When the trainer restores, waits or stops, and whether the gate promotes, is decided without
    I/O: the loop and the runner carry it out."""
    assert not impurities(ROOT / module, PURE_MODULES[module])


def test_the_purity_check_sees_clock_io_and_runtime(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import time\nfrom datetime import datetime\nfrom orl.pipeline.runtime.host import ProcessorHost\n"
        "import json\nfrom orl.schemas.codec import encode\nopen('x')\n"
    )
    assert impurities(bad) == [
        "imports datetime", "imports orl.pipeline.runtime.host", "imports time", "calls open() on line 6",
    ]  # fmt: skip
