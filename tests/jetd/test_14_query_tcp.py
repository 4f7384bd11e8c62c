"""Area 14: query fetches over real TCP (PROTOCOL.md 14): a sorted fetch whose peer
stops reading is parked and catches up with one whole window; a filtered fetch's held
changes arrive with their latest values; other fetchers get every update meanwhile."""

from __future__ import annotations

import json
import random

from jetd_testlib import RawPeer

from jetwire import SORT_DESCENDING
from jetwire import AddState
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchQuery
from jetwire import FetchUnmatch
from jetwire import FetchWindow
from jetwire import FilterOp
from jetwire import GetState
from jetwire import NotifyState
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import Response
from jetwire import SortBy
from jetwire import Value
from jetwire import ValueFilter
from jetwire import ValueType

PLAYERS = 40
PAD = "x" * 20000  # big values: the window events fill the slow peer's buffers quickly


def _player(i: int, score: int) -> Value:
    return Value(ValueType.JSON, json.dumps({"pad": PAD, "score": score, "even": i % 2 == 0}).encode())


def _top(n: int) -> Query:
    return Query((PathMatcher(PathOp.STARTS_WITH, ("p/",)),), (), SortBy.FIELD, "score", SORT_DESCENDING, 1, n)


def _apply(rows: list[tuple[str, Value]], event: FetchWindow) -> list[tuple[str, Value]]:
    rows = (rows + [("", Value(ValueType.NONE))] * event.size)[: event.size]
    for entry in event.entries:
        rows[entry.index - 1] = (entry.key, entry.value)
    return rows


def test_parked_sorted_and_filtered_fetches_catch_up(start_jetd):
    daemon = start_jetd("--soft-limit", str(64 << 10), "--hard-limit", str(256 << 20), "--log-level", "DEBUG")
    rng = random.Random(7)
    scores = {i: rng.randrange(1000) for i in range(PLAYERS)}
    owner = RawPeer(daemon.address, "owner")
    owner.send(*(AddState(i + 1, f"p/{i:02d}", _player(i, s)) for i, s in scores.items()))
    owner.recv_n(PLAYERS)
    slow = RawPeer(daemon.address, "slow", rcvbuf=4096)
    fast = RawPeer(daemon.address, "fast")
    evens = Query((PathMatcher(PathOp.STARTS_WITH, ("p/",)),), (ValueFilter(FilterOp.EQ, Value.of(True), "even"),))
    windows: dict[str, list[tuple[str, Value]]] = {}
    for name, peer in (("slow", slow), ("fast", fast)):
        peer.send(FetchQuery(1, _top(5)), FetchQuery(2, evens))
        first = peer.recv_n(2 + PLAYERS // 2 + 1)
        assert isinstance(first[0], Response) and isinstance(first[1], FetchWindow)
        windows[name] = _apply([], first[1])
    # Enough large window updates to go far above the soft limit of the slow peer (a
    # 4 KiB receive buffer, not reading); the other one has a normal buffer.
    for round_ in range(30):
        batch = []
        for _ in range(20):
            i = rng.randrange(PLAYERS)
            scores[i] = rng.randrange(1000)
            batch.append(NotifyState(None, f"p/{i:02d}", _player(i, scores[i])))
        owner.send(*batch, GetState(1000 + round_, "p/00"))
        owner.recv_until(lambda m: isinstance(m, Response))
    expected = [f"p/{i:02d}" for i in sorted(scores, key=lambda i: (scores[i], f"p/{i:02d}"), reverse=True)[:5]]
    # Both read now: held windows come whole, held changes with their latest values.
    for name, peer in (("slow", slow), ("fast", fast)):
        plain: dict[str, int] = {}
        while [k for k, _ in windows[name]] != expected or any(
            plain.get(f"p/{i:02d}") != scores[i] for i in scores if i % 2 == 0
        ):
            event = peer.recv(timeout=10)
            if isinstance(event, FetchWindow):
                windows[name] = _apply(windows[name], event)
            elif isinstance(event, (FetchAdd, FetchChange)):
                plain[event.key] = json.loads(event.value.data)["score"]
            else:
                assert not isinstance(event, FetchUnmatch)  # "even" never changes
        assert [json.loads(v.data)["score"] for _, v in windows[name]] == [scores[int(k[2:])] for k in expected]
    log = daemon.stderr()
    assert "slow #" in log and "slow@" in log.split("queueing locally")[0], log[-2000:]  # it was paused
    for peer in (owner, slow, fast):
        peer.close()
