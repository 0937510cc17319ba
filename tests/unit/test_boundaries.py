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
