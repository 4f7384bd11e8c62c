"""A real jetd holding 200,000 states (and a sorted query over them) leaves almost
nothing for a collection to walk (issue 29, jetd.gcpolicy): the states' containers are
frozen, so a collection of generation 2 walks only what is young. Asserted in what the
daemon counts (its SIGUSR1 line: the objects not frozen and the references they hold,
collections run), not in milliseconds."""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from functools import partial

from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddState
from jetwire import FetchQuery
from jetwire import GetState
from jetwire import Message
from jetwire import Response
from jetwire import encode
from peer.query import build_query
from peer.query import field
from tests.conftest import DaemonProcess

STATES = 200_000
BATCH = 10_000
WAIT = 120.0


def _answer_to(rid: int, message: Message) -> bool:
    return isinstance(message, Response) and message.id == rid


def _stats(daemon: DaemonProcess, after: int) -> dict[str, str]:
    """The fields of the first SIGUSR1 stats line after the ``after``-th one (sent now)."""
    daemon.proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        lines = [line for line in daemon.stderr().splitlines() if "stats: " in line]
        if len(lines) > after:
            return dict(re.findall(r"(\w+)=(\S+)", lines[after]))
        time.sleep(0.05)
    raise AssertionError("no stats line")


def test_seeded_states_are_frozen(start_jetd: Callable[..., DaemonProcess]) -> None:
    daemon = start_jetd("--max-states-per-connection", str(STATES))
    address = daemon.address
    owner = RawPeer(address)
    for start in range(0, STATES, BATCH):
        last = start + BATCH
        owner.write(b"".join(encode(AddState(i + 1, f"h/{i:07d}", v({"score": i % 1000, "kind": "a" if i % 10 else "b"})))
                             for i in range(start, last)))
        owner.recv_until(partial(_answer_to, last), WAIT)
    watcher = RawPeer(address)
    watcher.send(FetchQuery(1, build_query("h/", where=[field("kind") == "a"], sort_by="score", top=100)))
    watcher.recv_until(lambda m: isinstance(m, Response) and m.id == 1, WAIT)
    watcher.send(GetState(2, "h/0000001"))
    watcher.recv_until(lambda m: isinstance(m, Response) and m.id == 2, WAIT)
    # A few of the policy's ticks (every 0.1 s) after the seed: each freezes what was new.
    first = _stats(daemon, 0)
    deadline = time.monotonic() + WAIT
    n = 1
    while True:
        stats = _stats(daemon, n)
        n += 1
        if int(stats["gc_young"]) >= int(first["gc_young"]) + 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert int(stats["gc_young"]) >= int(first["gc_young"]) + 3, stats
    # The states' containers are a million references and more; what is left unfrozen
    # (what the next collection walks) is a few thousand objects' worth.
    assert int(stats["gc_unfrozen_refs"]) < 50_000, stats
    assert int(stats["gc_unfrozen"]) < 20_000, stats
    # CPython ran no full collection of its own; the policy's safety net not yet either.
    assert stats["gc_max_ms_2"] == "0.00" and stats["gc_full"] == "0", stats
    owner.close()
    watcher.close()
    # Stopped here, with room for a busy machine: 200,000 states to let go of.
    assert daemon.stop(timeout=60) == 0
