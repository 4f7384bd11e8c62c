"""The peers of tests/jetd/test_21_gc_cycles.py, run in a process of their own so that
every object the test process then finds unreachable is the daemon's:

    python gc21_churn.py HOST PORT WEBHOST WEBPORT ROUNDS

Each round, over TCP and over WebSocket: an owner adds JSON states; one peer fetches
them plainly and another through a sorted window; a routed SET is answered by the owner;
one is left pending and the owner closes (OWNER_GONE); one is left to time out; GETs;
UNFETCH; a wrong AUTHENTICATE; the owner removes a state and goes away; everyone closes.
Exits 0 when every expected answer came."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "web"))

from jetd_testlib import FramedPeer
from jetd_testlib import RawPeer
from jetd_testlib import v
from webtest import WsPeer

from jetwire import AddState
from jetwire import Authenticate
from jetwire import FetchQuery
from jetwire import FetchStates
from jetwire import GetState
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Unfetch
from jetwire.messages import NotifyState
from peer.query import build_query
from peer.query import field

TIMEOUT = 60.0


def answer(peer: FramedPeer, rid: int) -> Response:
    message, _ = peer.recv_until(lambda m: isinstance(m, Response) and m.id == rid, TIMEOUT)
    assert isinstance(message, Response)
    return message


def routed(owner: FramedPeer) -> SetState:
    message, _ = owner.recv_until(lambda m: isinstance(m, SetState), TIMEOUT)
    assert isinstance(message, SetState)
    return message


def one_round(make: Any, tag: str) -> None:
    prefix = f"gc/{tag}/"
    owner = make()
    fetcher = make()
    window = make()
    client = make()
    for i in range(20):
        owner.send(AddState(i + 1, f"{prefix}{i:02d}", v({"score": i, "kind": "a" if i % 2 else "b"})))
    answer(owner, 20)
    fetch = fetcher.request(lambda rid: FetchStates(rid, prefix), TIMEOUT)
    assert fetch.status == Status.OK, fetch
    query = build_query(prefix, where=[field("kind") == "a"], sort_by="score", descending=True, top=5)
    window.send(FetchQuery(1, query))
    answer(window, 1)
    # A routed SET answered by the owner.
    client.send(SetState(1, f"{prefix}03", v({"score": 99, "kind": "a"})))
    request = routed(owner)
    assert request.id is not None
    owner.send(Response(request.id, Status.OK))
    answer(client, 1)
    owner.send(NotifyState(None, f"{prefix}03", v({"score": 99, "kind": "a"})))
    client.send(GetState(2, f"{prefix}05"))
    answer(client, 2)
    # A wrong password (answered after the daemon's check).
    client.send(Authenticate(3, "nobody", "wrong"))
    answer(client, 3)
    if fetch.fetch_id is not None:
        fetcher.send(Unfetch(1000, fetch.fetch_id))
        answer(fetcher, 1000)
    owner.send(RemoveState(100, f"{prefix}00"))
    answer(owner, 100)
    # A routed SET left pending: the owner goes away (OWNER_GONE), one left to time out
    # on another owner.
    slow = make()
    slow.send(AddState(1, f"{prefix}slow", v(0)))
    answer(slow, 1)
    client.send(SetState(4, f"{prefix}slow", v(1)))
    client.send(SetState(5, f"{prefix}07", v(1)))
    routed(owner)
    owner.close()
    assert answer(client, 5).status == Status.OWNER_GONE
    assert answer(client, 4).status == Status.TIMEOUT
    for peer in (slow, fetcher, window, client):
        peer.close()


def main(argv: list[str]) -> int:
    host, port, web_host, web_port, rounds = argv[0], int(argv[1]), argv[2], int(argv[3]), int(argv[4])
    for n in range(rounds):
        one_round(lambda: RawPeer((host, port)), f"tcp{n}")
        one_round(lambda: WsPeer((web_host, web_port)), f"ws{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
