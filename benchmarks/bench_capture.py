"""Capture overhead of `orl serve`: chat latency with event capture on vs. off over the same backend.

Usage: python -m benchmarks.bench_capture [--requests 2000] [--concurrency 1,16] [--repeat 3]
           [--transport http|asgi] [--backend echo|transformers] [--max-tokens 8] [--spool-sync full|normal]

For each concurrency level and each repeat, the server is started twice from scratch, capture off
then on (ServeSettings.capture), with the same backend, and `--requests` non-streaming chat
completions are sent by that many concurrent clients after a warm-up. Reported per configuration:
p50 / p99 latency, requests/s and the overhead on - off, as the median over repeats and as the best
of repeats (other processes on a shared machine only slow runs down); with --transport http also
the server process's CPU time per request (all its threads, from /proc), and with --transport asgi
the CPU time of the one process (clients included, the same off and on): load on the machine hardly
changes it, so its on - off difference is the CPU cost of capture.

- `--transport http` (default): the server is a child process serving the real app with uvicorn on
  loopback (what clients see); the clients are raw keep-alive HTTP/1.1 connections in this process
  (httpx costs about 1 ms of CPU per request and was the bottleneck at 16 clients), so the server
  has most of a core to itself and the rest goes to the clients and the OS.
- `--transport asgi`: the app is driven in this process through httpx.ASGITransport (no sockets):
  the pure request + capture path, clients included, on one core.
- `--backend echo` (default): benchmarks/echo_backend.py, fixed tokens instantly, so the model does
  not hide the capture cost. `--backend transformers`: SmolLM2-135M on CPU (use --max-tokens small).

With capture on, each run waits until the spool has drained into the SQLite event log and checks
that the log holds exactly one RequestReceived and one ResponseGenerated per request.
Writes only under a temporary directory (or --work-dir).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

API_KEY = "bench-key"
ADMIN_KEY = "bench-admin-key"
NAMESPACE = "bench"
SYSTEM = "You are a helpful assistant. Answer briefly and precisely, and say when you are unsure."
QUESTION = (
    "I am planning a three day hiking trip in the Alps in early October. What should I pack, how "
    "should I plan water and food, and what should I check about the weather before leaving?"
)


def serve_settings(
    data_dir: Path, port: int, capture: bool, backend: str, cache_dir: Path, spool_sync: str = "full"
) -> object:
    from orl.serving.settings import ServeSettings

    return ServeSettings(
        data_dir=data_dir,
        port=port,
        api_keys=(API_KEY,),
        admin_key=ADMIN_KEY,
        namespace=NAMESPACE,
        capture=capture,
        spool_sync=spool_sync,
        follow_checkpoints=False,
        threads=2 if backend == "transformers" else 0,
        model_cache_dir=cache_dir,
    )


def echo_backend_and_template(cache_dir: Path) -> tuple[object, object]:
    from orl.connectors.model_files import prepare_base_model
    from orl.serving.policy.chat_template import ChatTemplate

    from benchmarks.echo_backend import EchoBackend

    return EchoBackend(), ChatTemplate.from_dir(prepare_base_model(cache_dir))


@asynccontextmanager
async def in_process_server(
    data_dir: Path, port: int, capture: bool, backend: str, cache_dir: Path, spool_sync: str = "full"
) -> AsyncIterator[object]:
    from orl.serving.main import running_server

    settings = serve_settings(data_dir, port, capture, backend, cache_dir, spool_sync)
    if backend == "echo":
        policy, template = echo_backend_and_template(cache_dir)
        server_cm = running_server(settings, backend=policy, template=template)  # type: ignore[arg-type]
    else:
        server_cm = running_server(settings)  # type: ignore[arg-type]
    async with server_cm as server:
        yield server


def serve_child(args: argparse.Namespace) -> None:
    """The --serve mode: one server process for the http transport."""
    import uvicorn
    from orl.serving.app import build_app

    async def main() -> None:
        async with in_process_server(
            args.work_dir, args.serve, args.capture == "on", args.backend, args.cache_dir, args.spool_sync
        ) as server:
            config = uvicorn.Config(
                build_app(server.state),  # type: ignore[attr-defined]
                host="127.0.0.1",
                port=args.serve,
                log_level="warning",
                access_log=False,
            )
            await uvicorn.Server(config).serve()

    if not args.profile_server:
        asyncio.run(main())
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(main())
    finally:  # uvicorn re-raises the SIGINT it caught: this still runs
        profiler.disable()
        profiler.dump_stats(args.profile_server)


@dataclass(frozen=True)
class RunResult:
    latencies_ms: list[float]
    wall_s: float
    events_in_log: int | None
    server_cpu_s: float | None = None  # CPU of the server process over the measured requests and the drain

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def rps(self) -> float:
        return len(self.latencies_ms) / self.wall_s


async def drive(
    client: httpx.AsyncClient, concurrency: int, requests: int, max_tokens: int
) -> tuple[list[float], float]:
    """`concurrency` clients, each its own session, sending requests back to back until `requests`."""
    latencies: list[float] = []
    remaining = [requests]

    async def one_client(index: int) -> None:
        body = {
            "model": "orl-policy",
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
            "max_tokens": max_tokens,
            "temperature": 0.7,
        }
        headers = {"authorization": f"Bearer {API_KEY}", "x-session-id": f"bench-{index}"}
        while remaining[0] > 0:
            remaining[0] -= 1
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body, headers=headers)
            latencies.append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise RuntimeError(f"chat failed: {response.status_code} {response.text}")

    started = time.perf_counter()
    await asyncio.gather(*(one_client(i) for i in range(concurrency)))
    return latencies, time.perf_counter() - started


def request_bytes(index: int, max_tokens: int) -> bytes:
    """One keep-alive HTTP/1.1 chat request, prebuilt (the same body drive() sends through httpx)."""
    body = json.dumps({
        "model": "orl-policy",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
        "max_tokens": max_tokens,
        "temperature": 0.7,
    }).encode()  # fmt: skip
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {API_KEY}\r\n"
        f"x-session-id: bench-{index}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def drive_raw(port: int, concurrency: int, requests: int, max_tokens: int) -> tuple[list[float], float]:
    """drive() over raw keep-alive sockets: a load generator cheap enough not to be the bottleneck."""
    latencies: list[float] = []
    remaining = [requests]

    async def one_client(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        request = request_bytes(index, max_tokens)
        try:
            while remaining[0] > 0:
                remaining[0] -= 1
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                latencies.append((time.perf_counter() - started) * 1000)
                if not head.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"chat failed: {head!r} {body!r}")
        finally:
            writer.close()

    started = time.perf_counter()
    await asyncio.gather(*(one_client(i) for i in range(concurrency)))
    return latencies, time.perf_counter() - started


async def count_events(log_path: Path) -> int:
    from orl.connectors.event_log.sqlite_log import SqliteEventLog
    from orl.schemas.topics import topic_name

    log = SqliteEventLog(log_path)
    await log.start()
    try:
        total = 0
        for topic in ("requests", "responses"):
            total += sum((await log.end_offsets(topic_name(NAMESPACE, topic))).values())
        return total
    finally:
        await log.close()


async def run_http(args: argparse.Namespace, data_dir: Path, capture: bool, concurrency: int) -> RunResult:
    from tests.integration.serve_process import free_port

    port = free_port()
    command = [sys.executable, "-m", "benchmarks.bench_capture", "--serve", str(port), "--work-dir", str(data_dir),
               "--capture", "on" if capture else "off", "--backend", args.backend, "--cache-dir", str(args.cache_dir),
               "--spool-sync", args.spool_sync]  # fmt: skip
    if args.profile_server:
        command += ["--profile-server", f"{args.profile_server}.{'on' if capture else 'off'}"]
    log_file = (data_dir / "serve.log").open("wb")
    child = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=600
        ) as client:
            await wait_ready(client, child, data_dir / "serve.log")
            await drive_raw(port, concurrency, args.warmup, args.max_tokens)
            await wait_spool_drained(client)
            cpu_before_s = process_cpu_s(child.pid)
            latencies, wall = await drive_raw(port, concurrency, args.requests, args.max_tokens)
            await wait_spool_drained(client)  # with capture off the depth is 0: the same /metrics call
            server_cpu_s = process_cpu_s(child.pid) - cpu_before_s
    finally:
        child.send_signal(signal.SIGINT)  # uvicorn's graceful shutdown
        child.wait(timeout=120)
        log_file.close()
    events = await count_events(data_dir / "log.db") if capture else None
    return RunResult(latencies, wall, events, server_cpu_s)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all threads (Linux /proc; 10 ms ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_spool_drained(client: httpx.AsyncClient, timeout_s: float = 60.0) -> None:
    """Poll /metrics until the server's spool is empty: every captured event is in the log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        depth = [line.split()[-1] for line in text.splitlines() if line.startswith("orl_spool_depth")
                 or line.startswith("spool_depth")]  # fmt: skip
        if depth and float(depth[0]) == 0:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the spool did not drain within {timeout_s} s")


async def wait_ready(client: httpx.AsyncClient, child: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"server exited: {log_path.read_text()[-2000:]}")
        try:
            if (await client.get("/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("server not ready in 300 s")


async def run_asgi(args: argparse.Namespace, data_dir: Path, capture: bool, concurrency: int) -> RunResult:
    from orl.serving.app import build_app

    async with in_process_server(
        data_dir, 0, capture, args.backend, args.cache_dir, args.spool_sync
    ) as server:
        app = build_app(server.state)  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as client:
            await drive(client, concurrency, args.warmup, args.max_tokens)
            await server.drainer.flush(120.0)  # type: ignore[attr-defined]
            cpu_before_s = time.process_time()  # the whole process: the clients' share is the same off and on
            latencies, wall = await drive(client, concurrency, args.requests, args.max_tokens)
        await server.drainer.flush(120.0)  # type: ignore[attr-defined]
        process_cpu = time.process_time() - cpu_before_s
    events = await count_events(data_dir / "log.db") if capture else None
    return RunResult(latencies, wall, events, process_cpu)


async def run_one(args: argparse.Namespace, capture: bool, concurrency: int) -> RunResult:
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        runner = run_http if args.transport == "http" else run_asgi
        result = await runner(args, Path(tmp), capture, concurrency)
    expected = 2 * (args.requests + args.warmup)
    if capture and result.events_in_log != expected:
        raise RuntimeError(f"capture lost events: {result.events_in_log} in the log, expected {expected}")
    return result


def summary(runs: list[RunResult], name: str, best: bool) -> dict[str, float]:
    """One cell's numbers over its repeats: the median, or the best (lowest latency and CPU, highest rate)."""
    low, high = (min, max) if best else (statistics.median, statistics.median)
    row = {
        f"p50_{name}": low([r.pct(0.50) for r in runs]),
        f"p99_{name}": low([r.pct(0.99) for r in runs]),
        f"rps_{name}": high([r.rps for r in runs]),
    }
    cpu = [r.server_cpu_s * 1e6 / len(r.latencies_ms) for r in runs if r.server_cpu_s is not None]
    if cpu:
        row[f"cpu_us_{name}"] = low(cpu)
    return row


async def main(args: argparse.Namespace) -> None:
    tables: dict[str, list[dict[str, float]]] = {"median": [], "best": []}
    for concurrency in args.concurrency:
        results: dict[bool, list[RunResult]] = {False: [], True: []}
        for _ in range(args.repeat):
            for capture in (False, True):
                results[capture].append(await run_one(args, capture, concurrency))
        for kind, rows in tables.items():
            row: dict[str, float] = {"concurrency": concurrency}
            for capture, name in ((False, "off"), (True, "on")):
                row.update(summary(results[capture], name, best=kind == "best"))
            rows.append(row)
            print(json.dumps({"summary": kind, **{k: round(v, 3) for k, v in row.items()}}), flush=True)
    for kind, rows in tables.items():
        print_table(args, rows, kind)


def print_table(args: argparse.Namespace, rows: list[dict[str, float]], kind: str) -> None:
    print(
        f"\n{kind} of {args.repeat} repeats; backend {args.backend}, transport {args.transport}, "
        f"{args.requests} requests per run (+{args.warmup} warm-up), max_tokens {args.max_tokens}, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"
    )
    cpu = "cpu_us_on" in rows[0]
    print("| clients | p50 off ms | p50 on ms | p50 overhead ms | p99 off ms | p99 on ms | p99 overhead ms "
          "| req/s off | req/s on |" + (" CPU off us/req | CPU on us/req |" if cpu else ""))  # fmt: skip
    print(
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if cpu else "")
    )
    for r in rows:
        print(
            f"| {r['concurrency']:.0f} | {r['p50_off']:.2f} | {r['p50_on']:.2f} | {r['p50_on'] - r['p50_off']:+.2f} "
            f"| {r['p99_off']:.2f} | {r['p99_on']:.2f} | {r['p99_on'] - r['p99_off']:+.2f} "
            f"| {r['rps_off']:.0f} | {r['rps_on']:.0f} |"
            + (f" {r['cpu_us_off']:.0f} | {r['cpu_us_on']:.0f} |" if cpu else "")
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="measured requests per run")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured requests before each run")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 16],
                        help="comma-separated concurrent client counts")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell (capture off/on alternate)")
    parser.add_argument("--transport", choices=("http", "asgi"), default="http", help="see the module doc")
    parser.add_argument("--backend", choices=("echo", "transformers"), default="echo", help="policy backend")
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request")
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/orl-test").expanduser(),
                        help="where the converted SmolLM2 model lives (tokenizer / transformers backend)")  # fmt: skip
    parser.add_argument("--work-dir", type=Path, default=None, help="where the servers' data goes (temp dir)")
    parser.add_argument("--spool-sync", choices=("full", "normal"), default="full",
                        help="the servers' spool durability (ServeSettings.spool_sync)")  # fmt: skip
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)  # child server mode
    parser.add_argument("--capture", choices=("on", "off"), default="on", help=argparse.SUPPRESS)
    parser.add_argument("--profile-server", default="", help="cProfile the server child into this file "
                        "(http transport; stats of the last server started)")  # fmt: skip
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve is not None:
        serve_child(arguments)
    else:
        asyncio.run(main(arguments))
