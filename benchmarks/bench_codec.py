"""Benchmark of the event codec: encode and decode events/s for a ~1 KB ResponseGenerated, in clear
and sealed with its session's data key (orl.schemas.sealing, a real key store in a temporary folder,
as `orl` commands run by default), side by side in one run.

Run: `.venv/bin/python benchmarks/bench_codec.py [--seconds 2]`. Prints one line per operation and form.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orl.connectors.key_store import KeyStore  # noqa: E402
from orl.schemas.codec import Codec  # noqa: E402
from orl.schemas.registry import default_registry  # noqa: E402

from tests.unit.event_examples import response_generated  # noqa: E402


def rate(operation: Callable[[], object], seconds: float, windows: int = 5) -> float:
    """Calls per second of `operation`: the best of `windows` runs of `seconds / windows` each.

    The best window, not the mean, because other processes on a shared machine only slow runs down.
    """
    best = 0.0
    for _ in range(windows):
        count, batch = 0, 500
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / windows:
            for _ in range(batch):
                operation()
            count += batch
        best = max(best, count / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per operation")
    args = parser.parse_args()
    event = response_generated()
    with tempfile.TemporaryDirectory() as folder:
        keys = KeyStore(Path(folder) / "keys.db")
        for form, codec in (
            ("clear", Codec(default_registry())),
            ("sealed", Codec(default_registry(), keys)),
        ):
            data = codec.encode(event)
            assert codec.decode(data) == event
            print(f"{form}: ResponseGenerated, {len(data)} bytes encoded")
            print(f"  encode: {rate(lambda: codec.encode(event), args.seconds):,.0f} events/s")  # noqa: B023
            print(f"  decode: {rate(lambda: codec.decode(data), args.seconds):,.0f} events/s")  # noqa: B023
        keys.close()


if __name__ == "__main__":
    main()
