"""`orl up`'s generated keys: keys.json is its owner's only, from its first byte, and the data
folder it creates is too."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from orl.up import StackKeys, UpSettings, private_data_dir, stack_keys, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_keys_are_kept_0600_in_a_0700_folder_and_read_back(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    settings = UpSettings(data_dir=data_dir)
    first = stack_keys(settings)
    assert mode(data_dir) == 0o700 and mode(data_dir / "keys.json") == 0o600
    assert json.loads((data_dir / "keys.json").read_text()) == dataclasses.asdict(first)
    assert len({first.api_key, first.admin_key, first.internal_key}) == 3
    assert stack_keys(settings) == first
    assert [p.name for p in data_dir.iterdir()] == ["keys.json"]  # no partial file left behind


def test_a_keys_file_of_an_older_orl_keeps_its_keys_and_gains_an_internal_key(tmp_path: Path) -> None:
    private_data_dir(tmp_path)
    write_private(tmp_path / "keys.json", json.dumps({"api_key": "orl-old", "admin_key": "orl-admin-old"}))
    keys = stack_keys(UpSettings(data_dir=tmp_path))
    assert (keys.api_key, keys.admin_key) == ("orl-old", "orl-admin-old")  # clients keep working
    assert keys.internal_key.startswith("orl-internal-")
    assert json.loads((tmp_path / "keys.json").read_text())["internal_key"] == keys.internal_key
    assert mode(tmp_path / "keys.json") == 0o600


def test_keys_given_whole_write_no_file(tmp_path: Path) -> None:
    settings = UpSettings(data_dir=tmp_path / "data", api_keys=("a",), admin_key="b", internal_key="c")
    assert stack_keys(settings) == StackKeys(api_key="a", admin_key="b", internal_key="c")
    assert not (tmp_path / "data").exists()


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
