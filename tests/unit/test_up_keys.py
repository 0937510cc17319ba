"""`orl up`'s generated keys: keys.json is its owner's only, from its first byte, and the data
folder it creates is too."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest
from orl.schemas.errors import ConfigError

from orl.up import StackKeys, UpSettings, private_data_dir, stack_keys, write_private


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_generated_keys_are_kept_0600_in_a_0700_folder_and_read_back(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    settings = UpSettings(data_dir=data_dir)
    first = stack_keys(settings)
    assert mode(data_dir) == 0o700 and mode(data_dir / "keys.json") == 0o600
    kept = {name: getattr(first, name) for name in ("api_key", "admin_key", "internal_key")}
    assert json.loads((data_dir / "keys.json").read_text()) == kept
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
    assert stack_keys(settings) == StackKeys(api_key="a", admin_key="b", internal_key="c", api_keys=("a",))
    assert not (tmp_path / "data").exists()


def test_every_given_client_key_reaches_the_server(tmp_path: Path) -> None:
    settings = UpSettings(data_dir=tmp_path, api_keys=("a", "b"), admin_key="c", internal_key="d")
    assert stack_keys(settings).serve_env() == {"ORL_API_KEYS": "a,b", "ORL_TENANT_KEYS": ""}


def test_named_tenants_get_keys_of_their_own_kept_in_keys_json(tmp_path: Path) -> None:
    first = stack_keys(UpSettings(data_dir=tmp_path, tenants=("alice", "bob")))
    assert sorted(first.tenant_keys) == ["alice", "bob"]
    assert len({first.api_key, *first.tenant_keys.values()}) == 3
    stored = json.loads((tmp_path / "keys.json").read_text())
    assert stored["tenant_keys"] == first.tenant_keys and mode(tmp_path / "keys.json") == 0o600
    again = stack_keys(UpSettings(data_dir=tmp_path, tenants=("alice", "bob", "carol")))
    assert again.tenant_keys["alice"] == first.tenant_keys["alice"]  # a tenant keeps its key
    assert again.api_key == first.api_key and "carol" in again.tenant_keys
    served = dict(entry.split("=", 1) for entry in again.serve_env()["ORL_TENANT_KEYS"].split(","))
    assert served == again.tenant_keys
    assert stack_keys(UpSettings(data_dir=tmp_path, tenants=("bob",))).tenant_keys == {
        "bob": first.tenant_keys["bob"]
    }  # only the tenants asked for are served; keys.json keeps the others'
    given = stack_keys(UpSettings(data_dir=tmp_path, tenant_keys=("dave=k-dave",)))
    assert given.tenant_keys == {"dave": "k-dave"}
    assert "dave" not in json.loads((tmp_path / "keys.json").read_text())["tenant_keys"]  # given: not kept


@pytest.mark.parametrize(
    ("tenants", "tenant_keys", "message"),
    [
        (("Alice",), (), "tenant name 'Alice'"),
        (("a b",), (), "tenant name 'a b'"),
        ((), ("alice",), "each entry is TENANT=KEY"),
        ((), ("alice=k1", "alice=k2"), "listed twice"),
        ((), ("alice=k1", "bob=k1"), "another tenant's key"),
    ],
)
def test_bad_tenants_are_refused_with_a_reason(
    tmp_path: Path, tenants: tuple[str, ...], tenant_keys: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        stack_keys(UpSettings(data_dir=tmp_path, tenants=tenants, tenant_keys=tenant_keys))


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
