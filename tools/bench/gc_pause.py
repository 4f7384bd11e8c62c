"""How long Python's garbage collector holds jetd's loop (issue 29), measured from the
daemon's side: N states seeded into a real jetd, then a churn of connections, GETs and
notifies for some seconds; the longest collection of each generation and how many ran.

The pauses are timed by a ``sitecustomize`` that this tool puts first on jetd's
``PYTHONPATH`` (``gc.callbacks``: the start and stop of every collection, CPU-bound, so
comparable between two builds on the same machine in the same run); it works for any
jetd, with or without jetd.gcpolicy. With ``--sitecustomize DIR`` it only writes that
file into DIR and exits: set ``JET_GC_PAUSES=FILE`` and put DIR first on jetd's
``PYTHONPATH`` (``tools.chaos --repo DIR`` with DIR a copy of the build) to get one JSON
line per jetd process in FILE when it exits.

    python -m tools.bench.gc_pause --states 1000000 --repo SITE [--also NAME=SITE] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jetwire import GetState
from jetwire import NotifyState
from jetwire import Value
from jetwire import encode
from tools.chaos.harness import HOST
from tools.chaos.harness import Daemon
from tools.chaos.harness import RawPeer
from tools.chaos.harness import _listening_line
from tools.chaos.harness import add_states
from tools.procs import stop_process

REPO = Path(__file__).resolve().parents[2]

SITECUSTOMIZE = '''"""Written by tools.bench.gc_pause: times every garbage collection of this process (CPU
time of the collecting thread, so that a busy machine's preemption does not count) and
appends the longest per generation to $JET_GC_PAUSES as one JSON line when it exits."""
import atexit
import gc
import json
import os
import time

_path = os.environ.get("JET_GC_PAUSES")
if _path:
    _started = [0.0]
    _longest = {}
    _count = {}
    _total = {}

    def _observe(phase, info):
        if phase == "start":
            _started[0] = time.thread_time()
            return
        pause = time.thread_time() - _started[0]
        gen = str(info["generation"])
        _count[gen] = _count.get(gen, 0) + 1
        _total[gen] = _total.get(gen, 0.0) + pause
        if pause > _longest.get(gen, 0.0):
            _longest[gen] = pause

    def _report():
        with open(_path, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "longest_ms": {g: p * 1e3 for g, p in _longest.items()},
                                  "count": _count, "total_ms": {g: p * 1e3 for g, p in _total.items()}}) + "\\n")

    gc.callbacks.append(_observe)
    atexit.register(_report)
'''


def write_sitecustomize(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "sitecustomize.py"
    path.write_text(SITECUSTOMIZE)
    return path


def churn(daemon: Daemon, keys: int, seconds: float, prefix: str) -> int:
    """Connections opened and closed, GETs of random keys, notifies of an owned state, for
    ``seconds``; returns the requests answered."""
    owner = RawPeer(daemon.address)
    from jetwire import AddState

    owner.send(AddState(1, "churn/x", Value.of(0)))
    owner.answer(1)
    answered = 0
    end = time.monotonic() + seconds
    rid = 1
    while time.monotonic() < end:
        peer = RawPeer(daemon.address)
        batch = [GetState(i + 1, f"{prefix}{random.randrange(keys):07d}") for i in range(200)]
        peer.sock.sendall(b"".join(encode(m) for m in batch))
        peer.answer(200, timeout=60)
        answered += 200
        peer.sock.close()
        rid += 1
        owner.sock.sendall(b"".join(encode(NotifyState(None, "churn/x", Value.of({"n": rid, "i": i}))) for i in range(200)))
    owner.sock.close()
    return answered


def run_once(repo: Path, states: int, seconds: float, workdir: Path, extra: list[str]) -> dict[str, Any]:
    site_dir = workdir / "site"
    write_sitecustomize(site_dir)
    pauses = workdir / f"pauses-{time.monotonic_ns()}.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{site_dir}{os.pathsep}{repo}", "PYTHONUNBUFFERED": "1",
           "JET_GC_PAUSES": str(pauses)}
    stderr_path = workdir / "stderr.txt"
    cmd = [sys.executable, "-m", "jetd", "--host", HOST, "--port", "0", "--max-states-per-connection",
           str(max(states, 1)), *extra]
    with open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=repo)
    try:
        host, port = _listening_line(proc, stderr_path)
        daemon = Daemon(host, port, proc.pid, proc, stderr_path)
        started = time.monotonic()
        owners = add_states(daemon, "g/", states, 16, per_owner=max(states, 1))
        seeded = time.monotonic() - started
        answered = churn(daemon, states, seconds, "g/")
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
        for owner in owners:
            owner.sock.close()
    finally:
        stop_process(proc, 60)
    lines = [json.loads(line) for line in pauses.read_text().splitlines()] if pauses.exists() else []
    stats = [line for line in stderr_path.read_text(errors="replace").splitlines() if "stats:" in line]
    return {"seed_s": seeded, "answered": answered, "pauses": lines[-1] if lines else {},
            "stats": stats[0].split("stats: ", 1)[1] if stats else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="where jetd runs from (a checkout or an unpacked wheel)")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR", help="another jetd, same runs")
    parser.add_argument("--states", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="churn after seeding")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--jetd-args", default="", help="extra jetd flags, space-separated")
    parser.add_argument("--sitecustomize", type=Path, help="only write the timing sitecustomize.py into this directory")
    args = parser.parse_args(argv)
    if args.sitecustomize is not None:
        print(write_sitecustomize(args.sitecustomize))
        return 0
    builds = [("this", args.repo)] + [(name, Path(d)) for name, _, d in (a.partition("=") for a in args.also)]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in builds}
    with tempfile.TemporaryDirectory(prefix="gc-pause-") as tmp:
        for run in range(args.runs):
            for name, repo in builds:
                result = run_once(repo, args.states, args.seconds, Path(tmp), args.jetd_args.split())
                results[name].append(result)
                longest = result["pauses"].get("longest_ms", {})
                count = result["pauses"].get("count", {})
                print(f"run {run + 1} {name}: seeded {args.states} in {result['seed_s']:.1f} s; longest pause ms "
                      + ", ".join(f"gen{g} {longest[g]:.1f} ({count[g]} runs)" for g in sorted(longest))
                      + (f"; {result['stats'].split('refused=')[-1]}" if result["stats"] else ""), flush=True)
    for name, _ in builds:
        longest2 = [r["pauses"].get("longest_ms", {}).get("2", 0.0) for r in results[name]]
        longest1 = [r["pauses"].get("longest_ms", {}).get("1", 0.0) for r in results[name]]
        print(f"{name}: median of {args.runs} runs, longest gen-2 pause {statistics.median(longest2):.1f} ms, "
              f"longest gen-1 pause {statistics.median(longest1):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
