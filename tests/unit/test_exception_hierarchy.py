"""One root exception: every exception class our packages define derives from OrlError.

Every module of every package is imported (a module that cannot be imported fails the test rather
than hiding its classes), and each exception class defined in it is checked. The tree itself is
documented in schemas/errors.py.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from orl.schemas.errors import OrlError

PACKAGES = (
    "orl.schemas",
    "orl.compute",
    "orl.connectors",
    "orl.serving",
    "orl.pipeline",
    "orl.trainer",
    "orl",
)


def module_names(package: str) -> Iterator[str]:
    root = importlib.import_module(package)
    yield package
    for info in pkgutil.walk_packages(root.__path__, package + "."):
        yield info.name


def exception_classes(module: ModuleType) -> list[type[BaseException]]:
    """The exception classes `module` itself defines (not those it imports)."""
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
    ]


def outside_the_tree(packages: tuple[str, ...]) -> tuple[list[str], int]:
    """('module.Class (bases)' for every exception class not under OrlError, how many were checked)."""
    bad: list[str] = []
    checked = 0
    for package in packages:
        for name in module_names(package):
            for cls in exception_classes(importlib.import_module(name)):
                checked += 1
                if not issubclass(cls, OrlError):
                    bases = ", ".join(base.__name__ for base in cls.__bases__)
                    bad.append(f"{name}.{cls.__qualname__} ({bases})")
    return bad, checked


def test_every_exception_class_derives_from_orl_error() -> None:
    bad, checked = outside_the_tree(PACKAGES)
    assert not bad, "exception classes outside the OrlError tree (see schemas/errors.py):\n" + "\n".join(bad)
    assert checked >= 25  # the walk really found the project's classes


def test_one_class_per_exception_name() -> None:
    """No two unrelated classes share a name (there were two CheckpointErrors once)."""
    by_name: dict[str, set[str]] = {}
    for package in PACKAGES:
        for name in module_names(package):
            for cls in exception_classes(importlib.import_module(name)):
                by_name.setdefault(cls.__qualname__, set()).add(name)
    assert {n: m for n, m in by_name.items() if len(m) > 1} == {}


def test_the_checker_sees_a_bare_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "orl_bare_example"
    (package / "inner").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "inner" / "__init__.py").write_text("")
    (package / "inner" / "mod.py").write_text(
        "from orl.schemas.errors import ConfigError\n\n"
        "class Fine(ConfigError):\n    pass\n\n"
        "class Bare(ValueError):\n    pass\n\n"
        "Imported = KeyError\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        bad, checked = outside_the_tree(("orl_bare_example",))
    finally:
        for name in [n for n in sys.modules if n.startswith("orl_bare_example")]:
            del sys.modules[name]
    assert bad == ["orl_bare_example.inner.mod.Bare (ValueError)"]
    assert checked == 2
