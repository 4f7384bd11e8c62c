"""``$jet/peers/<id>`` states are published in slices of the scheduler (issue 29,
PROTOCOL.md 16.3): a storm of new connections does not make one long tick. Sans-IO with
the fake clock of test_18, which moves at every reading: a tick publishes only the
states it can in a slice, later ticks publish the rest, each once, and states of gone
peers are withdrawn the same way."""

from __future__ import annotations

from test_18_clock_slices import ClockHarness

from jetd.metrics import PEERS_PREFIX
from jetwire import FetchRemove
from jetwire import FetchStates

N = 300


def _peer_keys(h: ClockHarness) -> set[bytes]:
    return {k for k in h.daemon.registry.states if k.startswith(PEERS_PREFIX)}


def test_new_peers_states_are_published_in_slices() -> None:
    h = ClockHarness(0.0004)  # a 1 ms slice is over at the third reading of the clock
    watcher = h.connect()
    h.send_all(watcher, FetchStates(1, "$jet/peers/"))
    h.recv(watcher)
    h.tick(1.0)
    h.recv(watcher)
    conns = [h.connect() for _ in range(N)]
    h.tick(1.0)
    per_tick = [len(h.recv(watcher))]
    # Before the fix all 300 states were published in this one tick.
    assert 0 < per_tick[0] < N // 10
    for _ in range(10_000):
        if len(_peer_keys(h)) == N + 1:
            break
        h.tick(0.1)  # the IO layer's tick (jetd.server: every 0.1 s)
        per_tick.append(len(h.recv(watcher)))
    assert len(_peer_keys(h)) == N + 1
    assert max(per_tick) < N // 10
    # Gone peers' states are withdrawn in slices too, each once.
    for conn in conns:
        h.daemon.disconnect(conn, h.now)
    h.recv(watcher)
    h.tick(1.0)
    removed = [e.key for e in h.recv(watcher) if isinstance(e, FetchRemove)]
    assert 0 < len(removed) < N // 10
    for _ in range(10_000):
        if len(_peer_keys(h)) == 1:
            break
        h.tick(0.1)
        removed += [e.key for e in h.recv(watcher) if isinstance(e, FetchRemove)]
    assert sorted(removed) == sorted(f"$jet/peers/{c.conn_id}" for c in conns)
    assert _peer_keys(h) == {PEERS_PREFIX + str(watcher.conn_id).encode()}
