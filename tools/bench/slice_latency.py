"""Other peers' GET latency while sorted queries work the daemon (issue 29): a health
peer in its own process GETs one state in a loop (1 ms apart) and reports p50, p99 and
max, while

- ``seed``: one peer opens a sorted top-1,000 FETCH_QUERY over N JSON states (a new
  group: every state is evaluated, in slices);
- ``windows``: one peer holds F sorted-window fetches (the same filter on a field, sorted
  by ``score``, a 1,000-row window: one query group) while an owner changes scores as
  fast as it is answered.

With ``--ab DIR`` the same scenarios run against the jetd in DIR too, alternating, so
before and after come from the same minutes (pure Python: each jetd runs from its own
directory).

    python -m tools.bench.slice_latency --states 100000 --fetches 100 --ab /tmp/base
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from peer import PeerAsync
from peer.query import field

REPO = Path(__file__).resolve().parents[2]

_PROBE = """
import sys, threading, time
from peer.tiny import TinyPeer
peer = TinyPeer("127.0.0.1", int(sys.argv[1]))
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
print("ready", flush=True)
times = []
while not stop.is_set():
    began = time.perf_counter()
    peer.get("p/0000001")
    times.append(time.perf_counter() - began)
    time.sleep(0.001)
print(" ".join(repr(t) for t in times), flush=True)
"""


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _one(jetd_dir: Path, scenario: str, states: int, fetches: int, seconds: float) -> tuple[float, float, float, int]:
    env = dict(os.environ, PYTHONPATH=str(jetd_dir))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0",
         "--max-states-per-connection", str(states + 10), "--max-fetches-per-connection", str(fetches + 10)],
        cwd=jetd_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    probe: Optional[subprocess.Popen[str]] = None
    try:
        assert daemon.stdout is not None
        found = re.search(r":(\d+)", daemon.stdout.readline())
        assert found is not None
        port = int(found.group(1))
        # The rest of jetd's stdout is not read: it logs nothing more at the default level.
        owner = await PeerAsync.connect("127.0.0.1", port, name="owner")
        owned = []
        for start in range(0, states, 5000):
            owned += await asyncio.gather(*(
                owner.add_state(f"p/{i:07d}", {"score": i % 1000, "kind": "a" if i % 10 else "b"})
                for i in range(start, min(states, start + 5000))
            ))
        fan = await PeerAsync.connect("127.0.0.1", port, name="fan")
        if scenario == "windows":
            await asyncio.gather(*(fan.fetch("p/", where=[field("kind") == "a"], sort_by="score", descending=True,
                                             top=1000, timeout=300) for _ in range(fetches)))
        probe = subprocess.Popen([sys.executable, "-c", _PROBE, str(port)], cwd=REPO, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert probe.stdin is not None and probe.stdout is not None
        assert probe.stdout.readline().strip() == "ready"
        await asyncio.sleep(0.3)
        changes = 0
        if scenario == "seed":
            await fan.fetch("p/", where=[field("kind") == "a"], sort_by="score", descending=True, top=1000,
                            timeout=300)
            await asyncio.sleep(seconds)
        else:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                state = owned[(changes * 7919) % len(owned)]
                await state.notify({"score": (changes * 31) % 1000, "kind": "a"}, timeout=300)
                changes += 1
        times = [float(t) for t in probe.communicate("stop\n", timeout=120)[0].split()]
        probe = None
        for peer in (owner, fan):
            await peer.close()
        return _quantile(times, 0.5), _quantile(times, 0.99), max(times), changes
    finally:
        if probe is not None:
            probe.kill()
            probe.wait(10)
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", type=int, default=100_000)
    parser.add_argument("--fetches", type=int, default=100, help="sorted-window fetches in the windows scenario")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the owner changes scores")
    parser.add_argument("--repeats", type=int, default=1, help="runs per row; medians are printed")
    parser.add_argument("--ab", type=Path, help="also run the jetd in this directory, alternating")
    parser.add_argument("--scenarios", default="seed,windows")
    args = parser.parse_args(argv)
    dirs = [("this jetd", REPO)] + ([(f"B ({args.ab})", args.ab.resolve())] if args.ab else [])
    print(f"{args.states:,} JSON states, {args.fetches} window fetches; health GET p50 / p99 / max, ms\n")
    print("| scenario | jetd | p50 | p99 | max | owner changes |\n|---|---|---:|---:|---:|---:|")
    for scenario in args.scenarios.split(","):
        results: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name, _ in dirs}
        for _ in range(args.repeats):
            for name, path in dirs:
                results[name].append(asyncio.run(_one(path, scenario, args.states, args.fetches, args.seconds)))
        for name, _ in dirs:
            runs = results[name]
            p50, p99, worst = (statistics.median(r[i] for r in runs) * 1000 for i in range(3))
            changes = int(statistics.median(r[3] for r in runs))
            print(f"| {scenario} | {name} | {p50:.1f} | {p99:.1f} | {worst:.1f} | {changes} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
