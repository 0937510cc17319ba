"""A supervised component dies with its supervisor: `orl up` / `orl demo` leave no orphans.

`orl.up.Supervisor` names its pid in ORL_SUPERVISOR_PID for every child; `orl.cli.main` calls
`exit_with_supervisor` before running any command. Reads one environment variable; writes nothing.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

logger = logging.getLogger(__name__)

SUPERVISOR_PID_ENV = "ORL_SUPERVISOR_PID"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def exit_with_supervisor() -> None:
    """In a supervised component: be sent SIGTERM when the supervisor dies, even by kill -9.

    Linux delivers the signal on the death of the parent (prctl PR_SET_PDEATHSIG); if the parent is
    already gone when this runs, exit now. Elsewhere (no prctl) this does nothing, and `orl up` stops
    its children only when it exits cleanly. The kernel watches the thread that started the child, so
    the supervisor starts children from its main thread.
    """
    expected = os.environ.pop(SUPERVISOR_PID_ENV, None)  # not inherited by this process's own children
    if not expected or not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(expected):
        logger.warning("the supervisor (pid %s) is gone: exiting", expected)
        raise SystemExit(0)
