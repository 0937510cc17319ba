"""`orl up`'s generated keys: keys.json is its owner's only, from its first byte, and the data
folder it creates is too."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from orl.up import UpSettings, private_data_dir, stack_keys, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_keys_are_kept_0600_in_a_0700_folder_and_read_back(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    settings = UpSettings(data_dir=data_dir)
    first = stack_keys(settings)
    assert mode(data_dir) == 0o700 and mode(data_dir / "keys.json") == 0o600
    assert json.loads((data_dir / "keys.json").read_text()) == {"api_key": first[0], "admin_key": first[1]}
    assert stack_keys(settings) == first
    assert [p.name for p in data_dir.iterdir()] == ["keys.json"]  # no partial file left behind


def test_a_private_file_is_created_0600_whatever_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0)  # a umask that would leave a plainly written file world-readable
    try:
        write_private(tmp_path / "secret.json", "{}")
    finally:
        os.umask(previous)
    assert mode(tmp_path / "secret.json") == 0o600 and (tmp_path / "secret.json").read_text() == "{}"


def test_an_existing_folder_others_can_read_is_left_as_it_is_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with caplog.at_level(logging.WARNING, logger="orl.up"):
        private_data_dir(shared)
    assert mode(shared) == 0o755 and "chmod 700" in caplog.text
