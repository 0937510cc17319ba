"""A trainer process for the crash tests: `orl train`'s flags and entry point, in a child process.

Usage: python -m tests.e2e.trainer_crash_main --data-dir D --model M [any `orl train` flag ...]
    [--fault-after after_step|mid_upload|after_manifest [--fault-version V]]
Flags bind exactly as in `orl train` (orl.settings_binding), so this is the real entry point. The
test-only flags `--fault-after` / `--fault-version` (0: the first version this process writes) are
this script's, not the trainer's: the object store the trainer opens is wrapped, in this process
only, in tests/support/crashing_store.py's CrashingStore, which SIGKILLs the process at that point.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

import orl.trainer.main
from orl.connectors.object_store.base import ObjectStore
from orl.trainer.settings import TrainSettings

from orl.cli import key_store_of
from orl.settings_binding import add_settings_arguments, build_settings
from tests.support.crashing_store import CRASH_POINTS, CrashingStore


def crash_on_checkpoint_writes(run_id: str, point: str, version: int) -> None:
    """Make `orl.trainer.main` publish through a CrashingStore around the store it opens."""
    open_real_store = orl.trainer.main.open_object_store

    def open_crashing_store(url: str, **credentials: Any) -> ObjectStore:
        return CrashingStore(open_real_store(url, **credentials), run_id, point, version)

    orl.trainer.main.open_object_store = open_crashing_store  # type: ignore[assignment]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainer_crash_main")
    add_settings_arguments(parser, TrainSettings)
    parser.add_argument("--fault-after", choices=CRASH_POINTS, default=None, help="TEST ONLY: crash point")
    parser.add_argument("--fault-version", type=int, default=0, help="TEST ONLY: its version (0: first)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = build_settings(TrainSettings, args, os.environ)  # reads the settings' fields only
    if args.fault_after:
        crash_on_checkpoint_writes(settings.run_id, args.fault_after, args.fault_version)
    with key_store_of(settings):  # as `orl train` opens it
        return orl.trainer.main.train(settings)


if __name__ == "__main__":
    sys.exit(main())
