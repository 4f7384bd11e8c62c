"""Peer benchmarks: round trips, pipelined sets, fetch delivery (BENCHMARKS.md "Peers").

    python -m tools.bench.peer [--quick] [--runs 3]

Starts its own jetd (``--loop uvloop``) on 127.0.0.1 and a separate owner process (a
PeerAsync on uvloop owning ``bench/x``, whose set handler accepts the value), then
measures from this process:

- sequential set round trip (client -> jetd -> owner -> jetd -> client), p50/p99, with
  the sync ``Peer`` and with ``PeerAsync``;
- pipelined sets from one PeerAsync (a window of requests in flight): wall rate and the
  CPU time this process spent per set (``time.process_time``), which is what bounds one
  peer process; the same for pipelined gets (answered by jetd alone, no owner hop);
- fetch event delivery to a callback: the owner process sends notifies as fast as it can
  (fire-and-forget), this process counts FETCH_CHANGE events in a callback.

Prints a markdown table; medians over ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import selectors
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

from peer import Peer
from peer import PeerAsync

REPO = Path(__file__).resolve().parents[2]


def start_jetd() -> tuple[subprocess.Popen[bytes], int]:
    cmd = [sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", "--loop", "uvloop"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    assert proc.stdout is not None
    line = _read_line(proc, 15)
    return proc, int(line.rsplit(":", 1)[1])


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        if not selector.select(max(0.0, deadline - time.monotonic())):
            proc.kill()
            raise SystemExit("no line from child process")
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            raise SystemExit("child process exited early")
        data += chunk
    selector.close()
    return data.decode().strip()


def start_owner(port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tools.bench.peer", "--owner", str(port)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=REPO)
    assert _read_line(proc, 15) == "ready"
    return proc


async def owner_main(port: int) -> None:
    """The owner process: owns bench/x and bench/y; on a line 'notify N' on stdin it
    notifies bench/y N times (fire-and-forget) and prints 'sent'."""
    peer = await PeerAsync.connect("127.0.0.1", port, name="bench-owner")
    await peer.add_state("bench/x", 0, on_set=lambda value: value)
    y = await peer.add_state("bench/y", 0)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        count = int(line.split()[1])
        for i in range(count):
            y.notify_nowait(i)
            if i % 1000 == 999:
                await peer.drain()
                await asyncio.sleep(0)
        await peer.get("bench/y")
        print("sent", flush=True)
    await peer.close()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_sync_round_trip(port: int, count: int) -> list[float]:
    with Peer("127.0.0.1", port) as peer:
        for i in range(100):
            peer.set("bench/x", i)
        samples = []
        for i in range(count):
            start = time.perf_counter()
            peer.set("bench/x", i)
            samples.append(time.perf_counter() - start)
    return samples


async def bench_async_round_trip(port: int, count: int) -> list[float]:
    async with await PeerAsync.connect("127.0.0.1", port) as peer:
        for i in range(100):
            await peer.set("bench/x", i)
        samples = []
        for i in range(count):
            start = time.perf_counter()
            await peer.set("bench/x", i)
            samples.append(time.perf_counter() - start)
    return samples


async def bench_pipelined(port: int, count: int, window: int, key: str, use_get: bool) -> tuple[float, float]:
    """Returns (requests per second wall, CPU microseconds of this process per request)."""
    async with await PeerAsync.connect("127.0.0.1", port) as peer:
        def request(i: int) -> asyncio.Future[Any]:
            return peer.get(key) if use_get else peer.set(key, i)

        await asyncio.gather(*(request(i) for i in range(window)))
        cpu0, wall0 = time.process_time(), time.perf_counter()
        done = 0
        sent = 0
        finished = asyncio.get_running_loop().create_future()

        def on_done(future: asyncio.Future[Any]) -> None:
            nonlocal done, sent
            future.result()
            done += 1
            if sent < count:
                sent += 1
                request(sent).add_done_callback(on_done)
            elif done == count and not finished.done():
                finished.set_result(None)

        for _ in range(min(window, count)):
            sent += 1
            request(sent).add_done_callback(on_done)
        await finished
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
    return count / wall, cpu / count * 1e6


async def bench_fetch_delivery(port: int, owner: subprocess.Popen[bytes], count: int) -> tuple[float, float]:
    """Returns (events per second to the callback, CPU microseconds here per event)."""
    async with await PeerAsync.connect("127.0.0.1", port) as peer:
        received = 0
        all_in = asyncio.get_running_loop().create_future()

        def on_event(event: Any) -> None:
            nonlocal received
            if event.kind == "change":
                received += 1
                if received == count and not all_in.done():
                    all_in.set_result(None)

        await peer.fetch("bench/y", on_event)
        assert owner.stdin is not None
        cpu0, wall0 = time.process_time(), time.perf_counter()
        owner.stdin.write(f"notify {count}\n".encode())
        owner.stdin.flush()
        await asyncio.wait_for(all_in, 120)
        wall = time.perf_counter() - wall0
        cpu = time.process_time() - cpu0
        await asyncio.get_running_loop().run_in_executor(None, _read_line, owner, 30)
    return count / wall, cpu / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument("--owner", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.owner is not None:
        uvloop.run(owner_main(args.owner))
        return
    scale = 10 if args.quick else 1
    daemon, port = start_jetd()
    owner = start_owner(port)
    rows: dict[str, list[tuple[float, ...]]] = {}
    try:
        for _ in range(args.runs):
            s = bench_sync_round_trip(port, 3000 // scale)
            rows.setdefault("sync", []).append((percentile(s, 0.5), percentile(s, 0.99)))
            s = uvloop.run(bench_async_round_trip(port, 3000 // scale))
            rows.setdefault("async", []).append((percentile(s, 0.5), percentile(s, 0.99)))
            rows.setdefault("pipe_set", []).append(
                uvloop.run(bench_pipelined(port, 200_000 // scale, 1000, "bench/x", False))
            )
            rows.setdefault("pipe_get", []).append(
                uvloop.run(bench_pipelined(port, 200_000 // scale, 1000, "bench/x", True))
            )
            rows.setdefault("fetch", []).append(uvloop.run(bench_fetch_delivery(port, owner, 200_000 // scale)))
    finally:
        if owner.stdin is not None:
            owner.stdin.close()
        owner.wait(10)
        daemon.terminate()
        daemon.wait(10)

    def med(name: str, i: int) -> float:
        return statistics.median(r[i] for r in rows[name])

    print(f"runs: {args.runs} (medians); jetd --loop uvloop; peers on uvloop; owner in its own process\n")
    print("| workload | result | peer-process CPU |")
    print("|---|---|---|")
    print(f"| sequential set round trip, sync `Peer` | p50 {med('sync', 0) * 1e6:.0f} us, p99 {med('sync', 1) * 1e6:.0f} us | |")
    print(
        f"| sequential set round trip, `PeerAsync` | p50 {med('async', 0) * 1e6:.0f} us, "
        f"p99 {med('async', 1) * 1e6:.0f} us | |"
    )
    print(
        f"| pipelined routed sets, one `PeerAsync` (1000 in flight) | {med('pipe_set', 0):,.0f} sets/s wall | "
        f"{med('pipe_set', 1):.2f} us/set = {1e6 / med('pipe_set', 1):,.0f} sets/s per CPU second |"
    )
    print(
        f"| pipelined gets, one `PeerAsync` (1000 in flight) | {med('pipe_get', 0):,.0f} gets/s wall | "
        f"{med('pipe_get', 1):.2f} us/get = {1e6 / med('pipe_get', 1):,.0f} gets/s per CPU second |"
    )
    print(
        f"| fetch delivery to a callback (owner notifies) | {med('fetch', 0):,.0f} events/s | "
        f"{med('fetch', 1):.2f} us/event |"
    )


if __name__ == "__main__":
    main()
