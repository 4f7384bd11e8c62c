"""The figure operators need (issue 29): the longest call into the core in the last
second, ``longest_call_ms`` in ``$jet/daemon`` and ``jetd_longest_call_seconds`` in
/metrics (PROTOCOL.md 16.2). Sans-IO with the fake clock of test_18, which moves at
every reading: a call's length is the readings it made."""

from __future__ import annotations

import json

from test_18_clock_slices import ClockHarness

from jetd.connection import Connection
from jetd.metrics import exposition
from jetwire import AddState
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Response
from jetwire import Value


def _longest(h: ClockHarness, reader: Connection) -> float:
    h.recv(reader)  # the fetch's events
    h.send(reader, GetState(1, "$jet/daemon"))
    [answer] = h.recv(reader)
    assert isinstance(answer, Response) and answer.value is not None
    figure = json.loads(answer.value.data)["longest_call_ms"]
    assert isinstance(figure, float)
    return figure


def test_the_longest_call_of_the_last_second_is_published() -> None:
    h = ClockHarness(0.0004)  # each reading of the clock moves it 0.4 ms
    owner, reader = h.connect(), h.connect()
    h.send(reader, FetchStates(1, "$jet/daemon"))  # watched: published every second
    h.tick(0.0)  # the first tick publishes $jet/daemon
    assert _longest(h, reader) == 0.0
    # 3,000 ADD_STATEs in one read: the frame loop reads the clock every 32 frames
    # until the slice (1 ms) is over, then the call ends: about 1.6 ms by this clock.
    h.send(owner, *(AddState(i + 1, f"k{i:05d}", Value.of(i)) for i in range(3000)))
    h.tick(1.0)
    longest = _longest(h, reader)
    assert 1.0 <= longest <= 3.0
    assert f"jetd_longest_call_seconds {longest / 1000}" in exposition(h.daemon.metrics, h.now).decode()
    # A second of short calls only (the GETs above, the tick): the figure falls back.
    h.tick(1.0)
    assert _longest(h, reader) < 1.0
