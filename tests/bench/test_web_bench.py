"""Smoke test of the WebSocket benchmark (tools/bench/web.py): W1 and W2, tiny, over TCP and
WebSocket. It keeps the tool from rotting; it never asserts how fast anything is."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tools.bench.daemon_workloads import Sizes
from tools.bench.web import report
from tools.bench.web import run


@pytest.mark.timeout(120)
def test_w1_w2_run_tiny_over_tcp_and_websocket() -> None:
    results = run(replace(Sizes.tiny(), w2_fetchers=(1, 3)), pin=False)
    for transport in ("tcp", "ws"):
        for metric in ("daemon CPU per routed set [µs]", "pipelined (10 in flight) sets/s [/s]"):
            values = results[(transport, "W1 routed set", metric)]
            assert values and all(math.isfinite(v) and v > 0 for v in values), (transport, metric, values)
        values = results[(transport, "W2 fan-out", "3 fetchers: daemon CPU per delivered event [µs]")]
        assert values and all(math.isfinite(v) and v > 0 for v in values), (transport, values)
    assert "| W1 routed set | daemon CPU per routed set [µs] |" in report(results)
