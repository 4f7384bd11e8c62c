"""Smoke test of the daemon benchmark (tools/bench/daemon.py): every workload, tiny, against jetd.

It keeps the benchmark from rotting; it asserts that each workload runs and produces
sane measurements, never how fast anything is.
"""

from __future__ import annotations

import math

import pytest

from tools.bench.daemon import main
from tools.bench.daemon import render_table
from tools.bench.daemon import run_benchmark
from tools.bench.daemon_workloads import WORKLOADS
from tools.bench.daemon_workloads import Sizes

EXPECTED_METRICS = {
    "W1 routed set": {"sequential round trip p50", "sequential round trip p99", "daemon CPU per routed set",
                      "daemon CPU per routed set, generator busy-polling",
                      "pipelined (10 in flight) sets/s, generator busy-polling"},
    "W2 fan-out": {"1 fetchers: delivered events/s", "3 fetchers: daemon CPU per delivered event"},
    "W3 fetch setup": {"fetch of 200 states: time to last add"},
    "W4 memory": {"RSS per cached state (500 INT64 states)", "RSS per idle connection (20 peers)"},
    "W5 slow consumer": {"rate with / without the slow peer (median of pairs)",
                         "CPU per event without / with the slow peer"},
}


@pytest.mark.timeout(120)
def test_every_workload_runs_tiny_against_jetd() -> None:
    lines: list[str] = []
    results = run_benchmark(["jetd"], list(WORKLOADS), Sizes.tiny(), progress=lines.append)
    assert results.problems["jetd"] == [], "\n".join(lines)
    samples = results.samples["jetd"]
    for workload, metrics in EXPECTED_METRICS.items():
        for metric in metrics:
            sample = samples.get((workload, metric))
            assert sample is not None, f"missing {workload}: {metric}; have {sorted(samples)}"
            assert sample.values and all(math.isfinite(v) for v in sample.values), sample
    for (workload, metric), sample in samples.items():
        if metric.endswith("/s") or "round trip" in metric or "time to last add" in metric:
            assert sample.median > 0, (workload, metric, sample.values)
    table = render_table(results)
    assert table.startswith("| Workload | Metric | jetd |")
    assert "fetch of 200 states" in table


def test_cli_rejects_unknown_workloads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--workloads", "W9"])
    assert "unknown workloads" in capsys.readouterr().err


def test_core_benchmark_rows_run_and_check_their_work() -> None:
    from tools.bench.daemon_core import ROWS
    from tools.bench.daemon_core import fan_out
    from tools.bench.daemon_core import measure
    from tools.bench.daemon_core import routed_set

    results = measure(runs=1, repeat=2)
    assert set(results) == set(ROWS)
    assert all(len(v) == 1 and 0 < v[0] < 1e4 for v in results.values()), results
    # Each row verifies what the core produced, so a broken core cannot look fast.
    assert routed_set()() > 0
    assert fan_out(2, paused=True, rounds=1)() > 0
