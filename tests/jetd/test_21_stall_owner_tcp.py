"""A closed owner's many states over TCP (issue 29, PROTOCOL.md 10.6): the daemon's
loop drives the removal's slices (Daemon.work) to the end, every FETCH_REMOVE arrives
once, in byte order of key, and the keys are free again."""

from __future__ import annotations

from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Response
from jetwire import Status

N = 20_000  # far more than one slice of about 1 ms


def test_a_closed_owners_many_states_all_go(jetd):
    owner = RawPeer(jetd.address, "owner")
    client = RawPeer(jetd.address, "client")
    owner.send(*(AddState(i + 1, f"s/{i:05d}", v(i)) for i in range(N)))
    answers = owner.recv_n(N, timeout=120)
    assert all(a.status == Status.OK for a in answers)
    fid = client.request(lambda rid: FetchStates(rid, "s/"), timeout=60).fetch_id
    adds = client.recv_n(N, timeout=120)
    assert all(isinstance(a, FetchAdd) for a in adds)
    owner.close()
    removes = client.recv_n(N, timeout=120)
    assert removes == [FetchRemove(fid, f"s/{i:05d}", v(i)) for i in range(N)]
    assert client.request(lambda rid: GetState(rid, f"s/{N - 1:05d}")).status == Status.NOT_FOUND
    client.send(AddState(99_999, "s/00000", v("again")))
    # PROTOCOL.md 10.5: its own fetch's event, then the OK.
    assert client.recv_n(2) == [FetchAdd(fid, "s/00000", v("again")), Response(99_999, Status.OK)]
