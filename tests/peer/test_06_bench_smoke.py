"""The peer benchmark script still runs (a smoke run; no timing is asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_peer_benchmark_quick_run():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-m", "tools.bench.peer", "--quick", "--runs", "1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 6, result.stdout  # header + five workloads
    assert "sets/s per CPU second" in result.stdout
