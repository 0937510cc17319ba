"""A trainer process for the crash tests: `orl train`'s flags and entry point, in a child process.

Usage: python -m tests.e2e.trainer_crash_main --data-dir D --model M [any `orl train` flag ...]
The test-only flags `--fault-after` / `--fault-version` make it SIGKILL itself at a named point.
Flags bind exactly as in `orl train` (orl.settings_binding), so this is the real entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from orl.settings_binding import add_settings_arguments, build_settings
from trainer.main import train
from trainer.settings import TrainSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainer_crash_main")
    add_settings_arguments(parser, TrainSettings)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return train(build_settings(TrainSettings, args, os.environ))


if __name__ == "__main__":
    sys.exit(main())
