"""An operator's request to train the pending samples now, even fewer than the batch size.

`kill -USR1 <orl train pid>` sets it; the training loop then reads the samples topic to its end
and takes everything pending as one (partial) batch. `orl demo` uses it at the end of each round
of sessions, so a round's samples become exactly one step whatever their number. Reads and writes
no topics or object keys.
"""

from __future__ import annotations

import asyncio
import signal


class FlushRequest:
    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        self.requested = True

    def clear(self) -> None:
        self.requested = False

    def listen_for_sigusr1(self) -> None:
        """Set the request on SIGUSR1 (call from inside the running event loop)."""
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, self.request)
