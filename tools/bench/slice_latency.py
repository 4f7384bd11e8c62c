"""Other peers' GET latency while sorted queries work the daemon (issue 29): a health
peer in its own process GETs one state in a loop (1 ms apart) and reports p50, p99 and
max, while

- ``seed``: one peer opens a sorted top-1,000 FETCH_QUERY over N JSON states (a new
  group: every state is evaluated, in slices);
- ``windows``: one peer holds F sorted-window fetches (the same filter on a field, sorted
  by ``score``, a 1,000-row window: one query group) while an owner changes scores as
  fast as it is answered;
- ``fanout``: F plain fetches of one state (1,000 per connection) while its owner sends
  a NOTIFY_STATE event every ``--fan-interval`` seconds: each is a fan-out to F fetches
  (jetd slices one past 64 fetches).

``--core-fanout F`` measures the same fan-out in the sans-IO core alone, in a process
per jetd: the CPU time (``process_time``, steady on a shared machine) of the longest
call into the core (``receive_data``, then each ``Daemon.work`` turn) while one
NOTIFY_STATE event reaches F fetches, which is how long other peers wait at most, and
of the whole fan-out.

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


_CORE_FANOUT = """
import sys, time
from jetd.config import Config
from jetd.core import Daemon
from jetwire import AddState, FetchStates, NotifyState, Value, encode

fetches, string, repeats = int(sys.argv[1]), sys.argv[2] == "string", int(sys.argv[3])
now, cpu = time.perf_counter, time.process_time
daemon = Daemon(Config(max_fetches_per_connection=1010), clock=now)
owner = daemon.connect("owner", now())
daemon.receive_data(owner, encode(AddState(1, "k", Value.of("v" if string else 0))), now())
conns = [daemon.connect(f"fan{i}", now()) for i in range(0, fetches, 1000)]
for i, conn in enumerate(conns):
    n = min(1000, fetches - 1000 * i)
    daemon.receive_data(conn, b"".join(encode(FetchStates(j + 1, "k")) for j in range(n)), now())

def drain():
    for conn in daemon.take_dirty():
        conn.out.clear()

drain()
while daemon.has_work:
    daemon.work(now())
    drain()
assert sum(len(c.fetches) for c in conns) == fetches
longest, whole, calls = [], [], []
for rep in range(repeats):
    began = cpu()
    daemon.receive_data(owner, encode(NotifyState(None, "k", Value.of(f"x{rep}" if string else rep))), now())
    worst, n = cpu() - began, 1
    spent = worst
    drain()
    while daemon.has_work:
        t = cpu()
        daemon.work(now())
        took = cpu() - t
        worst, spent, n = max(worst, took), spent + took, n + 1
        drain()
    longest.append(worst)
    whole.append(spent)
    calls.append(n)
for name, values in (("longest", longest), ("whole", whole), ("calls", calls)):
    print(name, " ".join(repr(v) for v in values))
"""


def core_fanout(jetd_dir: Path, fetches: int, value: str, repeats: int) -> dict[str, list[float]]:
    """Run _CORE_FANOUT with the jetd in ``jetd_dir``: per repeat, the CPU seconds of the
    longest call into the core and of the whole fan-out, and the calls it took."""
    env = dict(os.environ, PYTHONPATH=str(jetd_dir))
    done = subprocess.run([sys.executable, "-c", _CORE_FANOUT, str(fetches), value, str(repeats)], cwd=jetd_dir,
                          env=env, capture_output=True, text=True, check=True, timeout=1800)
    rows = (line.split() for line in done.stdout.splitlines())
    return {row[0]: [float(v) for v in row[1:]] for row in rows}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


FAN_PER_CONNECTION = 1000


async def _fan_fetchers(port: int, fetches: int) -> tuple[list[PeerAsync], list[int]]:
    """``fetches`` plain fetches of p/0000000 over peers of FAN_PER_CONNECTION each;
    returns the peers and a one-item list counting the events they got."""
    got = [0]

    def count(_event: object) -> None:
        got[0] += 1

    peers = []
    for start in range(0, fetches, FAN_PER_CONNECTION):
        peer = await PeerAsync.connect("127.0.0.1", port, name=f"fan{start}")
        await asyncio.gather(*(peer.fetch("p/0000000", on_event=count, timeout=300)
                               for _ in range(min(FAN_PER_CONNECTION, fetches - start))))
        peers.append(peer)
    return peers, got


async def _one(jetd_dir: Path, scenario: str, states: int, fetches: int, seconds: float,
               fan_interval: float = 0.2) -> tuple[float, float, float, int]:
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
        fan_peers: list[PeerAsync] = []
        if scenario == "fanout":
            fan_peers, fan_got = await _fan_fetchers(port, fetches)
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
        elif scenario == "fanout":
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                owned[0].notify_nowait({"score": changes % 1000, "kind": "a"})
                changes += 1
                await asyncio.sleep(fan_interval)
            await owner.get("p/0000000", timeout=300)  # the owner's last event is in
            for _ in range(100):  # every fetcher got every change (none parked for long)
                if fan_got[0] >= changes * fetches:
                    break
                await asyncio.sleep(0.1)
        else:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                state = owned[(changes * 7919) % len(owned)]
                await state.notify({"score": (changes * 31) % 1000, "kind": "a"}, timeout=300)
                changes += 1
        times = [float(t) for t in probe.communicate("stop\n", timeout=120)[0].split()]
        probe = None
        for peer in (owner, fan, *fan_peers):
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
    parser.add_argument("--scenarios", default="seed,windows", help="any of seed, windows, fanout")
    parser.add_argument("--fan-interval", type=float, default=0.2, help="seconds between the fanout owner's changes")
    parser.add_argument("--core-fanout", type=int, metavar="F",
                        help="instead: one NOTIFY_STATE event to F fetches in the sans-IO core (CPU per call)")
    args = parser.parse_args(argv)
    dirs = [("this jetd", REPO)] + ([(f"B ({args.ab})", args.ab.resolve())] if args.ab else [])
    if args.core_fanout:
        repeats = max(args.repeats, 20)
        print(f"one NOTIFY_STATE event to {args.core_fanout:,} fetches, sans-IO core, CPU ms, "
              f"medians (max) of {repeats}\n")
        print("| value | jetd | longest call | whole fan-out | calls |\n|---|---|---:|---:|---:|")
        for value in ("int", "string"):
            for name, path in dirs:
                got = core_fanout(path, args.core_fanout, value, repeats)
                longest, whole = (statistics.median(got[k]) * 1000 for k in ("longest", "whole"))
                print(f"| {value} | {name} | {longest:.2f} ({max(got['longest']) * 1000:.2f}) | "
                      f"{whole:.2f} | {statistics.median(got['calls']):.0f} |", flush=True)
        return 0
    print(f"{args.states:,} JSON states, {args.fetches} window fetches; health GET p50 / p99 / max, ms\n")
    print("| scenario | jetd | p50 | p99 | max | owner changes |\n|---|---|---:|---:|---:|---:|")
    for scenario in args.scenarios.split(","):
        results: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name, _ in dirs}
        for _ in range(args.repeats):
            for name, path in dirs:
                results[name].append(asyncio.run(_one(path, scenario, args.states, args.fetches, args.seconds,
                                                     args.fan_interval)))
        for name, _ in dirs:
            runs = results[name]
            p50, p99, worst = (statistics.median(r[i] for r in runs) * 1000 for i in range(3))
            changes = int(statistics.median(r[3] for r in runs))
            print(f"| {scenario} | {name} | {p50:.1f} | {p99:.1f} | {worst:.1f} | {changes} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
