"""The daemon's sans-IO core without sockets: CPU time per routed set and per fan-out event.

    python -m tools.bench.daemon_core [--runs 9] [--ab DIR | --auth]

:class:`jetd.core.Daemon` with in-memory connections, fed the byte streams of the W1, W2
and W5 workloads of ``tools.bench.daemon`` (PROTOCOL.md 10.3 routing, 10.5 fan-out,
10.8 a paused fetcher), timed in process CPU time, one core, the garbage collector off
while timing. No kernel, no event loop, no load generator: what is left is the core's own
Python, so a change to it shows here at a few percent where the TCP benchmark's noise on
a shared machine is 10-30%. The TCP benchmark stays the measure of the targets.

``--ab DIR`` also runs the same rows with the jetd package found in DIR (for example a
``git archive`` of an older commit), alternating the two run by run, and adds the ratio.
``--auth`` runs every row without and with permissions (PROTOCOL.md 15: the connections
have write/read/own on the workloads' prefixes, never ``""``, so every check is made),
alternating, and adds the ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from jetd.access import Access
from jetd.config import Config
from jetd.core import Connection
from jetd.core import Daemon
from jetd.users import Grants
from jetd.users import UsersFile
from jetwire import AddState
from jetwire import FetchChange
from jetwire import FetchStates
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode

IN_FLIGHT = 100  # W1: sets per pipelined batch
STATES = 100  # W2/W5: states notified in rotation


def bench_access() -> Access:
    """Permissions on the workloads' prefixes for every connection (the anonymous entry:
    these connections do not authenticate), as ``tools.bench.daemon``'s jetd --auth."""
    users = UsersFile()
    prefixes = ["w1/", "w2/"]
    users.anonymous = Grants(own=list(prefixes), read=list(prefixes), write=list(prefixes))
    return Access(users)


def _clear(daemon: Daemon, *conns: Connection) -> None:
    daemon.take_dirty()
    for conn in conns:
        conn.out.clear()


def routed_set(access: Access | None = None) -> Callable[[], float]:
    """W1: a requester's 100 sets, then the owner's NOTIFY event + OK (with the value)
    for each; returns seconds per routed set."""
    daemon = Daemon(Config(), access=access)
    owner, requester = daemon.connect("owner", 0.0), daemon.connect("requester", 0.0)
    daemon.receive_data(owner, encode(AddState(1, "w1/state", Value.of(0))), 0.0)
    sets = b"".join(encode(SetState(i + 1, "w1/state", Value.of(1000 + i))) for i in range(IN_FLIGHT))
    next_oid = [1]

    def run() -> float:
        base = next_oid[0]  # jetd numbers routes per owner from 1 (jetd.core.RouteTable)
        answers = b"".join(
            encode(NotifyState(None, "w1/state", Value.of(1000 + i))) + encode(Response(base + i, Status.OK,
                                                                                     Value.of(1000 + i)))
            for i in range(IN_FLIGHT))
        _clear(daemon, owner, requester)
        start = time.process_time()
        daemon.receive_data(requester, sets, 0.0)
        daemon.receive_data(owner, answers, 0.0)
        elapsed = time.process_time() - start
        answered = b"".join(requester.out)
        if answered.count(b"\x02") < IN_FLIGHT or owner.routes:
            raise RuntimeError("the routed sets were not all answered")
        next_oid[0] += IN_FLIGHT
        return elapsed / IN_FLIGHT

    return run


def fan_out(fetchers: int, *, paused: bool = False, rounds: int = 10,
            access: Access | None = None) -> Callable[[], float]:
    """W2/W5: the owner notifies 100 states ``rounds`` times each; ``fetchers`` fetch
    everything (plus one whose transport is paused if ``paused``); returns seconds per
    change."""
    daemon = Daemon(Config(), access=access)
    owner = daemon.connect("owner", 0.0)
    keys = [f"w2/{i:03d}" for i in range(STATES)]
    daemon.receive_data(owner, b"".join(encode(AddState(i + 1, k, Value.of(0))) for i, k in enumerate(keys)), 0.0)
    conns = []
    for i in range(fetchers + paused):
        conn = daemon.connect(f"fetcher-{i}", 0.0)
        daemon.receive_data(conn, encode(FetchStates(1, "")), 0.0)
        conns.append(conn)
    if paused:
        daemon.pause(conns[-1], Config().soft_limit)
    block = b"".join(encode(NotifyState(None, k, Value.of(r % 2))) for r in range(rounds) for k in keys)
    changes = rounds * STATES
    event_size = len(encode(FetchChange(1, keys[0], Value.of(0))))  # every key and value is as long

    def run() -> float:
        _clear(daemon, owner, *conns)
        start = time.process_time()
        daemon.receive_data(owner, block, 0.0)
        elapsed = time.process_time() - start
        if sum(map(len, conns[0].out)) != changes * event_size:
            raise RuntimeError("a fetcher missed changes")
        return elapsed / changes

    return run


# One run of every row in a child process, for --ab: its own jetd comes first on sys.path.
_CHILD = (
    "import json, sys; sys.path.insert(0, '.'); import jetd; from tools.bench.daemon_core import measure; "
    "print(json.dumps({**measure(1), '_jetd': __import__('os').path.realpath(jetd.__file__)}))"
)

ROWS: dict[str, Callable[[], Callable[[], float]]] = {
    "W1 routed set: core CPU per set": routed_set,
    "W2 1 fetcher: core CPU per change": lambda: fan_out(1),
    "W2 10 fetchers: core CPU per change": lambda: fan_out(10),
    "W2 50 fetchers: core CPU per change": lambda: fan_out(50),
    "W5 10 fetchers + 1 paused: core CPU per change": lambda: fan_out(10, paused=True),
}


AUTH_ROWS: dict[str, Callable[[], Callable[[], float]]] = {
    "W1 routed set: core CPU per set": lambda: routed_set(bench_access()),
    "W2 1 fetcher: core CPU per change": lambda: fan_out(1, access=bench_access()),
    "W2 10 fetchers: core CPU per change": lambda: fan_out(10, access=bench_access()),
    "W2 50 fetchers: core CPU per change": lambda: fan_out(50, access=bench_access()),
    "W5 10 fetchers + 1 paused: core CPU per change": lambda: fan_out(10, paused=True, access=bench_access()),
}


def measure_auth(runs: int, repeat: int = 20) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every row without and with permissions, alternating run by run: (off, on) in µs."""
    off = {name: make() for name, make in ROWS.items()}
    on = {name: make() for name, make in AUTH_ROWS.items()}
    results: tuple[dict[str, list[float]], dict[str, list[float]]] = ({n: [] for n in ROWS}, {n: [] for n in ROWS})
    for bench in (*off.values(), *on.values()):
        bench()
    for _ in range(runs):
        for name in ROWS:
            for side, benches in enumerate((off, on)):
                gc.collect()
                gc.disable()
                try:
                    results[side][name].append(statistics.median(benches[name]() for _ in range(repeat)) * 1e6)
                finally:
                    gc.enable()
    return results


def measure(runs: int, repeat: int = 20) -> dict[str, list[float]]:
    """Per row, ``runs`` values: each the median of ``repeat`` timed calls, in µs."""
    benches = {name: make() for name, make in ROWS.items()}
    results: dict[str, list[float]] = {name: [] for name in ROWS}
    for bench in benches.values():
        bench()  # warm-up: first-use costs (caches, allocations)
    for _ in range(runs):
        for name, bench in benches.items():  # round-robin: drift hits every row alike
            gc.collect()
            gc.disable()
            try:
                results[name].append(statistics.median(bench() for _ in range(repeat)) * 1e6)
            finally:
                gc.enable()
    return results


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="runs per row (median reported)")
    parser.add_argument("--ab", metavar="DIR", help="also run the jetd package in DIR, alternating, for a ratio")
    parser.add_argument("--auth", action="store_true", help="every row without and with permissions, for a ratio")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if args.auth:
        off, on = measure_auth(args.runs)
        print(f"Medians of {args.runs} alternating runs, µs of CPU per operation, jetd from "
              f"{sys.modules['jetd'].__file__}\n")
        print("| row | no --auth | --auth | --auth / no --auth |\n|---|---:|---:|---:|")
        for name in ROWS:
            m_off, m_on = statistics.median(off[name]), statistics.median(on[name])
            print(f"| {name} | {m_off:.3f} | {m_on:.3f} | {m_on / m_off:.2f} |")
        return 0
    if not args.ab:
        results = measure(args.runs)
        print(f"Medians of {args.runs} runs, µs of CPU per operation, jetd from {sys.modules['jetd'].__file__}\n")
        print("| row | this jetd |\n|---|---:|")
        for name, values in results.items():
            print(f"| {name} | {statistics.median(values):.3f} |")
        return 0
    # A/B: each side in its own process, alternating. ``python -m`` puts the working
    # directory first on sys.path, so each side runs in the directory of its jetd.
    here = str(Path(sys.modules["jetd"].__file__ or ".").resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]))
    a: dict[str, list[float]] = {name: [] for name in ROWS}
    b: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(args.runs):
        for side, cwd in ((a, here), (b, args.ab)):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD], cwd=cwd, env=env, check=True, capture_output=True, text=True
            ).stdout
            result = json.loads(out)
            if result.pop("_jetd") != str(Path(cwd, "jetd", "__init__.py").resolve()):
                raise RuntimeError(f"the run in {cwd} did not import its own jetd")
            for name, values in result.items():
                side[name].extend(values)
    print(f"Medians of {args.runs} alternating runs, µs of CPU per operation; B is {args.ab}\n")
    print("| row | this jetd (A) | B | A / B |\n|---|---:|---:|---:|")
    for name in ROWS:
        ma, mb = statistics.median(a[name]), statistics.median(b[name])
        print(f"| {name} | {ma:.3f} | {mb:.3f} | {ma / mb:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
