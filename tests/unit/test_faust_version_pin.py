"""The faust runtime's patches fit one faust-streaming version: another one is refused at worker start."""

from __future__ import annotations

import importlib.metadata

import pytest
from orl.pipeline.runtime.faust_patches import FAUST_STREAMING_VERSION, check_faust_version
from orl.schemas.errors import ConfigError


def test_the_installed_faust_streaming_is_the_patched_version() -> None:
    assert importlib.metadata.version("faust-streaming") == FAUST_STREAMING_VERSION
    check_faust_version()


def test_another_version_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"faust-streaming==0\.15\.3.*found 0\.16\.0"):
        check_faust_version("0.16.0")
