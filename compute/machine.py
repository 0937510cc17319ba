"""The machine's compute as orl's torch processes use it: numerics (bf16 or fp32) and CPU threads.

Numerics (`choose_numerics`): bf16 autocast only where the hardware runs bf16 natively: a CUDA GPU
that supports it, or a CPU with avx512_bf16 / AMX (x86) or the bf16 extension (Arm). Elsewhere
torch emulates bf16, which on a 2-core AVX2 EPYC made a SmolLM2-135M forward and backward 28x
slower than fp32 (issue 17), so the choice there is fp32. When the CPU's flags cannot be read (no
/proc/cpuinfo), a short matmul measurement decides. Weights stay fp32 either way.

Threads (`CoreBoard`): on one machine `orl up` runs two torch processes (the server, which also
scores teacher logprobs, and the trainer) beside the pure-Python pipeline. Each torch process uses
every core it may run on while it computes alone, and an equal share while others compute too: a
process marks itself busy with a file `<pid>.busy` in a shared folder (`<data-dir>/cores`), and
before each unit of work (a decode step, a phase of a training step) it counts the busy processes
and sets its torch threads to `cores // busy`. OpenMP threads must wait passively
(OMP_WAIT_POLICY=PASSIVE, set by `orl` before torch loads) or an idle process's threads spin on the
cores the other one needs. Measured on the 2-core AVX2 EPYC (SmolLM2-135M, fp32, trainer 4x128
tokens forward+backward, server 8 concurrent 64-token answers): alone 125 train tok/s and 65
generated tok/s; together with 2 threads each and spinning waits 23 and 11; 2 threads each,
passive, 60 and 42; 1 thread each, passive, 63 and 55.

Reads and writes: the board folder's `<pid>.busy` files only.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orl.schemas.errors import ConfigError
from orl.schemas.numerics import PRECISIONS

log = logging.getLogger(__name__)

# x86: avx512_bf16 (Cooper Lake, Zen 4 and later) and amx_bf16 (Sapphire Rapids and later) run bf16
# matmuls in hardware; Arm: the bf16 extension (Neoverse V1/N2, Apple M2 and later).
NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
BOARD_READ_INTERVAL_S = 0.2  # how stale a process's view of the others may be


@dataclass(frozen=True)
class Numerics:
    """The precision a torch process computes in, and why it was chosen."""

    precision: str  # "bf16" (autocast, fp32 master weights) | "fp32"
    reason: str

    @property
    def autocast(self) -> bool:
        return self.precision == "bf16"

    @property
    def autocast_dtype(self) -> Any:
        """torch.bfloat16 under bf16, None under fp32 (the transformers backend's argument)."""
        import torch

        return torch.bfloat16 if self.autocast else None


def check_precision(precision: str, flag: str = "--precision") -> None:
    if precision not in PRECISIONS:
        raise ConfigError(f"{flag} must be one of {', '.join(PRECISIONS)}, not {precision!r}")


def _cpuinfo_fields(cpuinfo: Path) -> dict[str, str] | None:
    """The first processor's `key: value` lines of /proc/cpuinfo, or None when it cannot be read."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        return None
    fields: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """The CPU's feature flags (x86 'flags', Arm 'Features'), or None when they cannot be read."""
    fields = _cpuinfo_fields(cpuinfo) or {}
    text = fields.get("flags", fields.get("Features"))
    return None if text is None else frozenset(text.split())


def cpu_model_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name ("AMD EPYC", "Intel(R) Xeon(R) Processor"), or "unknown CPU"."""
    return (_cpuinfo_fields(cpuinfo) or {}).get("model name") or "unknown CPU"


def describe_machine() -> str:
    """CPU model, the flags that decide numerics, and the cores: what every benchmark figure names."""
    flags = cpu_flags() or frozenset()
    shown = sorted(flags & ({"avx2", "avx512f"} | NATIVE_BF16_CPU_FLAGS))
    return f"{cpu_model_name()}; flags {' '.join(shown) or 'none of avx2/avx512f/bf16'}; {available_cores()} cores"


def choose_numerics(requested: str, device: str = "cpu", flags: frozenset[str] | None = None) -> Numerics:
    """bf16 or fp32 for `device` ("cpu" or "cuda"): the requested one, or under "auto" the machine's.

    `flags` are the CPU's (read from /proc/cpuinfo when None); without any, a measurement decides.
    """
    check_precision(requested)
    if requested != "auto":
        return Numerics(requested, "set by --precision")
    if device.startswith("cuda"):
        import torch

        if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return Numerics("bf16", f"{torch.cuda.get_device_name()} runs bf16 natively")
        return Numerics("fp32", "this GPU has no native bf16")
    flags = cpu_flags() if flags is None else flags
    if flags is not None:
        native = sorted(flags & NATIVE_BF16_CPU_FLAGS)
        if native:
            return Numerics("bf16", f"the CPU runs bf16 natively ({', '.join(native)})")
        return Numerics(
            "fp32",
            "the CPU has no native bf16 (no avx512_bf16 / amx_bf16 / bf16 flag): torch would emulate it",
        )
    ratio = bf16_speedup()
    if ratio > 1.0:
        return Numerics("bf16", f"CPU flags unreadable; a bf16 matmul measured {ratio:.1f}x faster than fp32")
    return Numerics("fp32", f"CPU flags unreadable; a bf16 matmul measured {ratio:.2f}x the speed of fp32")


@functools.cache
def resolved_numerics(requested: str, device: str = "cpu") -> Numerics:
    """`choose_numerics` once per process and device, logged (the server and the trainer call it)."""
    numerics = choose_numerics(requested, device)
    log.info("numerics on %s: %s (%s)", device, numerics.precision, numerics.reason)
    return numerics


def bf16_speedup(rows: int = 256, repeats: int = 3) -> float:
    """fp32 time / bf16 time of a SmolLM2-sized matmul ([rows, 576] x [576, 1536]) on the CPU (>1: bf16 is faster).

    The shape matters: on a 16-core Xeon with AMX a 256-square product measured 0.64x (too small to
    fill the cores) where the model's forward ran 1.8x faster in bf16."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(rows, 576, generator=generator), torch.randn(576, 1536, generator=generator)

    def best_s(dtype: Any) -> float:
        x, y = a.to(dtype), b.to(dtype)
        torch.mm(x, y)  # warm-up
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            torch.mm(x, y)
            times.append(time.perf_counter() - started)
        return min(times)

    return best_s(torch.float32) / max(best_s(torch.bfloat16), 1e-9)


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a cgroup v2 CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_quota_cores(Path("/sys/fs/cgroup/cpu.max"))
    return max(1, min(cores, quota)) if quota else max(1, cores)


def _cgroup_quota_cores(cpu_max: Path) -> int:
    """Whole cores allowed by a cgroup v2 `cpu.max` ("max 100000" or "200000 100000"); 0: no limit."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return 0
    if quota == "max":
        return 0
    return max(1, int(quota) // int(period))


def fair_share(cores: int, busy_processes: int) -> int:
    """Threads for one of `busy_processes` computing at once on `cores` (at least one)."""
    return max(1, cores // max(1, busy_processes))


class CoreBoard:
    """Shares the machine's cores between the torch processes of one data folder.

    `busy()` / `idle()` mark this process; `fit_threads()` (call it from the thread that computes,
    before each unit of work) sets torch's threads to this process's fair share of `cores`. A
    `folder` of None disables sharing: the process always uses `cores` threads.
    """

    def __init__(self, folder: Path | None, cores: int) -> None:
        if cores < 1:
            raise ConfigError(f"a core board needs at least one core, got {cores}")
        self.cores = cores
        self._folder = folder
        self._mark = folder / f"{os.getpid()}.busy" if folder is not None else None
        self._busy = False
        self.thread_changes = 0  # how often fit_threads changed torch's threads (logged per step)
        self._others = 0
        self._read_at = float("-inf")
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def busy(self) -> None:
        if self._mark is not None and not self._busy:
            self._mark.touch()
        self._busy = True

    def idle(self) -> None:
        if self._mark is not None and self._busy:
            self._mark.unlink(missing_ok=True)
        self._busy = False

    def threads(self) -> int:
        """This process's fair share now (the others' marks are re-read every 0.2 s)."""
        now = time.monotonic()
        if now - self._read_at > BOARD_READ_INTERVAL_S:
            self._others = self._busy_others()
            self._read_at = now
        return fair_share(self.cores, self._others + 1)

    def fit_threads(self) -> int:
        """Set torch's intra-op threads (of the calling thread) to `threads()`; returns them."""
        import torch

        wanted = self.threads()
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)
            self.thread_changes += 1
        return wanted

    def _busy_others(self) -> int:
        if self._folder is None:
            return 0
        count = 0
        for entry in os.scandir(self._folder):
            pid = _busy_pid(entry.name)
            if pid is None or pid == os.getpid():
                continue
            if _alive(pid):
                count += 1
            else:  # a process killed while busy left its mark behind
                Path(entry.path).unlink(missing_ok=True)
        return count


def _busy_pid(name: str) -> int | None:
    stem, dot, suffix = name.partition(".")
    return int(stem) if dot and suffix == "busy" and stem.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True
