"""Smoke test of the latency benchmark (tools/bench/latency.py): each shape, briefly and
at a low rate, against pure jetd (and nats-server when installed). It asserts that every
message arrives and is counted once, never how fast."""

from __future__ import annotations

import shutil

import pytest

from tools.bench import brokers
from tools.bench import latency


@pytest.mark.timeout(120)
def test_every_jet_shape_gets_every_message_back() -> None:
    with brokers.jetd(brokers.REPO) as daemon:
        samples = [latency.jet_events(daemon, 2_000, 0.5), latency.jet_routed(daemon, 2_000, 0.5, "set"),
                   latency.jet_routed(daemon, 2_000, 0.5, "call")]
    for sample in samples:
        assert sample.sent == 1_000
        assert len(sample.latencies) == sample.sent  # each message once: a duplicate is not counted twice
        assert all(wait >= 0 for wait in sample.latencies)
        assert sample.cpu_per_message >= 0 and sample.generator_busy >= 0


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server is not installed (make system-deps)")
def test_every_nats_shape_gets_every_message_back() -> None:
    with brokers.nats() as daemon:
        samples = [latency.nats_events(daemon, 2_000, 0.5), latency.nats_routed(daemon, 2_000, 0.5)]
    for sample in samples:
        assert len(sample.latencies) == sample.sent == 1_000


def test_busy_spinners_are_stopped() -> None:
    with latency.spinners(2) as procs:
        assert all(proc.poll() is None for proc in procs)
    assert all(proc.poll() is not None for proc in procs)
