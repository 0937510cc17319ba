"""Installing a test plugin package (tests/fixtures/sample_*_pkg) with pip for one test, and running
code in a fresh interpreter that sees it. Used by the connector and environment plugin tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args, "--disable-pip-version-check", "-q"],
        capture_output=True,
        text=True,
        timeout=300,
    )


@contextmanager
def installed(package: Path, distribution: str, tmp_path: Path) -> Iterator[None]:
    """`package` installed (from a copy: build outputs land there, not in the repository), then
    uninstalled."""
    source = tmp_path / package.name
    shutil.copytree(package, source)
    done = pip("install", "--no-deps", "--no-build-isolation", "--no-index", str(source))
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        gone = pip("uninstall", "-y", distribution)
        assert gone.returncode == 0, gone.stderr


def last_line_printed(code: str) -> str:
    """The last line `code` prints in a fresh interpreter (which sees what is installed now)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]
