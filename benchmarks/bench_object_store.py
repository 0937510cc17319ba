"""Object-store throughput: put, put_file and streamed get, local directory vs SeaweedFS over S3.

Run from the repo root: `python -m benchmarks.bench_object_store [--size-mb 64] [--small 200]`.
Starts its own weed mini (tests/fixtures/s3_server.py) and writes only to temp dirs and a fresh
bucket. Prints one line per (store, operation) with MB/s or operations/s.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from orl.connectors.object_store.base import ObjectStore
from orl.connectors.object_store.local_store import LocalObjectStore
from orl.connectors.object_store.s3_store import S3ObjectStore

from tests.fixtures.s3_server import start_s3_server


def _timed(operation: Callable[[], object]) -> float:
    started = time.perf_counter()
    operation()
    return time.perf_counter() - started


def _drain(store: ObjectStore, key: str) -> None:
    for _chunk in store.iter_chunks(key):
        pass


def bench(name: str, store: ObjectStore, big_file: Path, small_count: int) -> None:
    size_mb = big_file.stat().st_size / 1e6
    put_file_s = _timed(lambda: store.put_file("bench/big.bin", big_file))
    get_s = _timed(lambda: _drain(store, "bench/big.bin"))
    small = os.urandom(4096)
    small_put_s = _timed(lambda: [store.put(f"bench/small/{i}", small) for i in range(small_count)])
    small_get_s = _timed(lambda: [store.get(f"bench/small/{i}") for i in range(small_count)])
    print(f"{name:6} put_file {size_mb / put_file_s:8.1f} MB/s   iter_chunks {size_mb / get_s:8.1f} MB/s")
    print(
        f"{name:6} put 4KiB {small_count / small_put_s:8.0f} op/s   get 4KiB {small_count / small_get_s:8.0f} op/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=64, help="size of the large object")
    parser.add_argument("--small", type=int, default=200, help="number of 4 KiB objects")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orl-bench-") as tmp:
        big_file = Path(tmp) / "big.bin"
        big_file.write_bytes(os.urandom(args.size_mb * 1024 * 1024))
        bench("local", LocalObjectStore(Path(tmp) / "store"), big_file, args.small)
        server = start_s3_server()
        print(f"weed mini answered after {server.startup_s:.2f} s")
        try:
            bucket = f"orl-bench-{uuid.uuid4().hex[:12]}"
            store = S3ObjectStore(server.endpoint, server.access_key, server.secret_key, bucket)
            bench("s3", store, big_file, args.small)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
