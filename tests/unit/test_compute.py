"""The machine's compute: numerics chosen from the hardware, cores from affinity and quota, the core board."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from orl.compute.machine import (
    CoreBoard,
    _cgroup_quota_cores,
    available_cores,
    choose_numerics,
    cpu_flags,
    cpu_model_name,
    describe_machine,
    fair_share,
)
from orl.schemas.errors import ConfigError

AVX2_EPYC = frozenset(["fpu", "sse", "sse2", "avx", "f16c", "fma", "avx2", "bmi2", "sha_ni"])
SAPPHIRE_RAPIDS = AVX2_EPYC | {"avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"}


def test_cpu_flags_are_read_from_x86_and_arm_cpuinfo(tmp_path: Path) -> None:
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\nprocessor\t: 1\n")
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16 i8mm\nCPU implementer\t: 0x41\n")
    assert cpu_flags(x86) == {"fpu", "avx2", "fma"}
    assert cpu_model_name(x86) == "AMD EPYC"
    assert cpu_model_name(arm) == "unknown CPU" and cpu_model_name(tmp_path / "missing") == "unknown CPU"
    assert cpu_flags(arm) == {"fp", "asimd", "bf16", "i8mm"}
    assert cpu_flags(tmp_path / "missing") is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (AVX2_EPYC, "fp32"),  # emulated bf16: 28x slower than fp32 (issue 17)
        (AVX2_EPYC | {"avx512f", "avx512bw"}, "fp32"),  # AVX-512 without the bf16 instructions
        (AVX2_EPYC | {"avx512_bf16"}, "bf16"),
        (SAPPHIRE_RAPIDS, "bf16"),
        (frozenset({"fp", "asimd", "bf16"}), "bf16"),  # Arm with the bf16 extension
        (frozenset({"fp", "asimd"}), "fp32"),
    ],
)
def test_auto_picks_bf16_only_where_the_cpu_runs_it_natively(flags: frozenset[str], expected: str) -> None:
    numerics = choose_numerics("auto", "cpu", flags)
    assert numerics.precision == expected
    assert numerics.autocast == (expected == "bf16")
    assert numerics.autocast_dtype == (torch.bfloat16 if expected == "bf16" else None)
    assert numerics.reason


def test_an_explicit_precision_overrides_the_hardware() -> None:
    assert choose_numerics("bf16", "cpu", AVX2_EPYC).precision == "bf16"
    assert choose_numerics("fp32", "cpu", SAPPHIRE_RAPIDS).precision == "fp32"
    with pytest.raises(ConfigError, match="--precision must be one of auto, bf16, fp32, not 'fp16'"):
        choose_numerics("fp16")


def test_this_machine_gets_a_decision_with_a_reason() -> None:
    assert f"{available_cores()} cores" in describe_machine()
    numerics = choose_numerics("auto")
    assert numerics.precision in ("bf16", "fp32")
    flags = cpu_flags()
    if flags is not None and not flags & {"avx512_bf16", "amx_bf16", "bf16"}:
        assert numerics.precision == "fp32"


def test_cgroup_quota_caps_the_cores(tmp_path: Path) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert _cgroup_quota_cores(cpu_max) == 0
    cpu_max.write_text("150000 100000\n")
    assert _cgroup_quota_cores(cpu_max) == 1
    cpu_max.write_text("400000 100000\n")
    assert _cgroup_quota_cores(cpu_max) == 4
    assert _cgroup_quota_cores(tmp_path / "absent") == 0
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


def test_fair_share_never_drops_below_one_thread() -> None:
    assert fair_share(2, 1) == 2
    assert fair_share(2, 2) == 1
    assert fair_share(2, 3) == 1
    assert fair_share(16, 2) == 8
    assert fair_share(16, 0) == 16


def _busy_process(folder: Path) -> subprocess.Popen[bytes]:
    """Another process that marks itself busy on the board and waits."""
    code = (
        "import sys, time; from pathlib import Path; from orl.compute.machine import CoreBoard;"
        "b = CoreBoard(Path(sys.argv[1]), 2); b.busy(); print('busy', flush=True); time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", code, str(folder)], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"busy\n"
    return process


def _wait_for_threads(board: CoreBoard, expected: int) -> int:
    deadline = time.monotonic() + 5
    while (threads := board.threads()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return threads


def test_a_process_shares_the_cores_while_another_one_computes(tmp_path: Path) -> None:
    board = CoreBoard(tmp_path / "cores", 4)
    board.busy()
    assert board.threads() == 4
    other = _busy_process(tmp_path / "cores")
    try:
        assert _wait_for_threads(board, 2) == 2
        previous = torch.get_num_threads()
        try:
            assert board.fit_threads() == 2 and torch.get_num_threads() == 2
        finally:
            torch.set_num_threads(previous)
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    # the killed process left its mark; the board ignores and removes it
    assert _wait_for_threads(board, 4) == 4
    assert [p.name for p in (tmp_path / "cores").iterdir()] == [f"{os.getpid()}.busy"]
    board.idle()
    assert list((tmp_path / "cores").iterdir()) == []


def test_a_board_without_a_folder_always_uses_every_core() -> None:
    board = CoreBoard(None, 3)
    board.busy()
    assert board.threads() == 3
    board.idle()
    with pytest.raises(ConfigError, match="at least one core"):
        CoreBoard(None, 0)
