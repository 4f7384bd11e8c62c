"""How long one new fetch stalls the other peers: a health peer's worst GET latency while
another peer opens a plain FETCH, a filtered FETCH_QUERY or a sorted top-10 FETCH_QUERY
over N JSON states. PROTOCOL.md 14.5: one large query must not stall other peers; jetd
seeds a new query group and sends its initial entries in slices.

The health peer is a separate process (peer.tiny), so what it measures is the daemon's
stall, not this process decoding the fetch's events.

    python -m tools.bench.query_stall --states 200000 --repeats 3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

from peer import PeerAsync
from peer.query import field

from .daemon_procs import start_jetd

REPO = Path(__file__).resolve().parents[2]


async def _one(kind: str, states: int) -> tuple[float, float]:
    with start_jetd(["--max-states-per-connection", str(states + 10)]) as daemon:
        port = daemon.port
        owner = await PeerAsync.connect("127.0.0.1", port, name="owner")
        for start in range(0, states, 5000):
            await asyncio.gather(*(owner.add_state(f"p/{i:07d}", {"score": i % 1000, "gender": "f" if i % 2 else "m"})
                                   for i in range(start, min(states, start + 5000))))
        fetcher = await PeerAsync.connect("127.0.0.1", port, name="fetcher")
        # The health peer runs in its own process: in this one, decoding the fetch's
        # events would delay its answers too, and that is not the daemon's stall.
        probe = subprocess.Popen(
            [sys.executable, "-c", _PROBE, str(port)], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert probe.stdin is not None and probe.stdout is not None
        assert probe.stdout.readline().strip() == "ready"
        await asyncio.sleep(0.3)
        began = time.perf_counter()
        if kind == "plain":
            await fetcher.fetch("p/")
        elif kind == "filtered":
            await fetcher.fetch("p/", where=[field("gender") == "f"])
        else:
            await fetcher.fetch("p/", where=[field("gender") == "f"], sort_by="score", descending=True, top=10)
        answered = time.perf_counter() - began
        await asyncio.sleep(1.5)
        worst = float(probe.communicate("stop\n", timeout=30)[0])
        for peer in (owner, fetcher):
            await peer.close()
        return answered, worst


_PROBE = """
import socket, sys, threading, time
from peer.tiny import TinyPeer
peer = TinyPeer("127.0.0.1", int(sys.argv[1]))
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
print("ready", flush=True)
worst = 0.0
while not stop.is_set():
    began = time.perf_counter()
    peer.get("p/0000001")
    worst = max(worst, time.perf_counter() - began)
    time.sleep(0.001)
print(worst, flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=1, help="runs per kind; medians are printed")
    args = parser.parse_args(argv)
    print(f"| fetch over {args.states:,} states | answered in | worst health GET |\n|---|---|---|")
    for kind in ("plain", "filtered", "sorted top 10"):
        runs = [asyncio.run(_one(kind, args.states)) for _ in range(args.repeats)]
        answered = statistics.median(run[0] for run in runs)
        worst = statistics.median(run[1] for run in runs)
        print(f"| {kind} | {answered * 1000:.0f} ms | {worst * 1000:.0f} ms |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
