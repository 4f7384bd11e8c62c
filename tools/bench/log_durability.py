"""Event-log durability (issue 12, item 3): SIGKILL losses with ``--log-fsync always``, and a
health peer's GET latency while another peer hammers, against any jetd source tree.

Usage::

    python -m tools.bench.log_durability [--runs 3] [--jetd-source DIR]

Reuses the scenarios of ``tests/jetd/test_15_log_durability.py`` at a longer size: three
clients pipelining routed sets, calls, gets and notifies for 3 s, then SIGKILL, answered
ids compared with the log; and 10 s of 4 KiB notifies pipelined by one peer while another
GETs every 50 ms.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def main(argv: Sequence[str] | None = None) -> int:
    """Print one line per run of each scenario."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jetd-source", type=Path, default=REPO, help="directory with jetd and jetwire (default: this checkout)")
    args = parser.parse_args(argv)
    sys.path[:0] = [str(REPO / "tests" / "jetd"), str(REPO / "tests")]
    import conftest  # the tests' launcher: python -m jetd from conftest.REPO
    import test_15_log_durability as scenario

    conftest.REPO = args.jetd_source.resolve()

    def start(*jetd_args: str) -> Any:
        return conftest.launch_jetd(list(jetd_args), Path(tempfile.mkdtemp()) / "stderr")

    for run in range(args.runs):
        logdir = Path(tempfile.mkdtemp()) / "log"
        answered, _ = scenario._run_and_kill(start, logdir, "always", 3.0)
        requests, _ = scenario._logged_ids(logdir)
        total = sum(len(ids) for ids in answered.values())
        missing = sum(len(set(ids) - requests[name]) for name, ids in answered.items())
        print(f"kill run {run}: {total} answered, {missing} not in the log ({100 * missing / max(total, 1):.2f} %)", flush=True)
    for run in range(args.runs):
        logdir = Path(tempfile.mkdtemp()) / "log"
        daemon = start("--log-dir", str(logdir), "--log-fsync", "always")
        owner = scenario.RawPeer(daemon.address, "owner")
        owner.request(lambda rid: scenario.AddState(rid, "s", scenario.v(0)))
        stop = threading.Event()
        scenario._hammer(daemon.address, stop, 4096)
        health = scenario._Health(daemon.address)
        health.start()
        time.sleep(10)
        health.stop = True
        health.join(30)
        stop.set()
        waits = sorted(health.waits)
        logged = sum(path.stat().st_size for path in logdir.glob("*.jetlog"))
        daemon.stop()
        owner.close()
        print(
            f"health run {run}: {len(waits)} GETs, median {waits[len(waits) // 2] * 1000:.1f} ms, "
            f"p95 {waits[len(waits) * 95 // 100] * 1000:.0f} ms, worst {waits[-1] * 1000:.0f} ms; "
            f"{logged / 1e6:.0f} MB logged in 10 s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
