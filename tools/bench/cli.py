"""``jet`` start-up: wall time of ``jet get KEY`` against a local jetd, next to the floor
(``python -c pass``) and ``jet info`` (the full asyncio peer), medians of interleaved runs.

    python -m tools.bench.cli --runs 21
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args(argv)
    daemon = subprocess.Popen([sys.executable, "-m", "jetd", "--port", "0"], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        assert daemon.stdout is not None
        port = re.search(r":(\d+)", daemon.stdout.readline())
        assert port is not None
        env = {**os.environ, "JET_PORT": port.group(1), "PYTHONPATH": str(REPO)}
        owner = subprocess.Popen([sys.executable, "-m", "peer", "serve-state", "bench/k", "1"], cwd=REPO, env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert owner.stderr is not None
        owner.stderr.readline()  # "jet: serving ..."
        commands = {
            "python -c pass (floor)": [sys.executable, "-c", "pass"],
            "jet get bench/k": [sys.executable, "-m", "peer", "get", "bench/k"],
            "jet info (asyncio peer)": [sys.executable, "-m", "peer", "info"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, cmd in commands.items():  # interleaved: a noisy moment hits every row
                times[name].append(_wall(cmd, env))
        owner.terminate()
        owner.wait(10)
    finally:
        daemon.terminate()
        daemon.wait(10)
    floor = statistics.median(times["python -c pass (floor)"])
    print("| command | median wall time | above the floor |\n|---|---|---|")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"| `{name}` | {median * 1000:.0f} ms | {(median - floor) * 1000:+.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
