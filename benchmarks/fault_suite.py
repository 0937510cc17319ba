"""Crash-anywhere fault suite (issue 22): `--kills N` kill -9 rounds of every `orl up` component under
live chat and feedback traffic, then the results table (markdown) for benchmarks/RESULTS-faults.md.

The same run and checks as tests/faults/test_crash_anywhere.py (tests/faults/harness.py, checks.py),
on the real SmolLM2 model. Writes the stack's data folder under --work-dir (kept for inspection).

    .venv/bin/python -m benchmarks.fault_suite --kills 20 --seed 0
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from orl.connectors.model_files import prepare_base_model

from tests.faults.checks import check_run, results_table
from tests.faults.harness import kill_rounds, load_run, run_fault_suite, save_run
from tests.fixtures.model import test_cache_dir


def machine_line() -> str:
    """CPU model, its flags that matter for torch on a CPU, cores and the load average at the start."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "?"
    )
    flags = next(
        (line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []
    )
    wanted = [f for f in flags if f.startswith(("avx", "amx", "fma"))]
    return (
        f"{model} ({os.cpu_count()} cores; flags {' '.join(wanted)}), Python {platform.python_version()}, "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="kill -9 of each component, per component")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill moments and the questions")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the stack's data folder goes")
    parser.add_argument("--check-only", type=Path, default=None, help="check a kept run.json again")
    args = parser.parse_args()
    if args.check_only:
        print(results_table(check_run(load_run(args.check_only))))
        return
    prepare_base_model(test_cache_dir())
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="orl-faults-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    machine = machine_line()
    wall = time.monotonic()
    run = run_fault_suite(work_dir, kill_rounds(args.kills, args.seed), seed=args.seed, gate=True)
    save_run(run, work_dir / "run.json")
    verdict = check_run(run)
    print(f"date: {started:%Y-%m-%d %H:%M} UTC, {time.monotonic() - wall:.0f} s")
    print(f"command: .venv/bin/python -m benchmarks.fault_suite --kills {args.kills} --seed {args.seed}")
    print(f"machine: {machine}")
    print(f"data: {run.data_dir} (run {work_dir / 'run.json'}, {run.wall_s:.0f} s)\n")
    print(results_table(verdict))


if __name__ == "__main__":
    main()
