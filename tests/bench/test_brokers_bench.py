"""Smoke test of the brokers benchmark (tools/bench/brokers.py) and its Python floor
(tools/bench/floor.py): each shape, tiny, against pure jetd and the floor.

It keeps the benchmark from rotting; it asserts that every shape completes with every
message delivered, never how fast anything is.
"""

from __future__ import annotations

import math
import socket
import threading

import pytest

from tools.bench import brokers


@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", [lambda: brokers.jetd(brokers.REPO), brokers.floor], ids=["jetd", "floor"])
def test_every_shape_delivers_every_message(start: object) -> None:
    with start() as daemon:  # type: ignore[operator]
        # _paced reads every subscriber's whole batch before the next: a short
        # delivery hangs (bounded by the timeout), a wrong one is a wrong byte count.
        for subscribers in (1, 3):
            cpu = brokers.jet_fanout(daemon, subscribers, 2 * brokers.BATCH)
            assert math.isfinite(cpu) and cpu >= 0
        cpu = brokers.jet_request_reply(daemon, 2_000)
        assert math.isfinite(cpu) and cpu >= 0


@pytest.mark.timeout(30)
def test_a_broker_that_closes_before_its_info_is_an_error_not_a_spin() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()

        def close_at_once() -> None:
            conn, _ = server.accept()
            conn.close()

        closer = threading.Thread(target=close_at_once)
        closer.start()
        sock = brokers._connect(server.getsockname())
        try:
            with pytest.raises(ConnectionError, match="before its INFO"):
                brokers._jet_info(sock)
        finally:
            sock.close()
            closer.join()
