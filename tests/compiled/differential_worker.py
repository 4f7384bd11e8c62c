"""Feeds byte streams to this interpreter's jetwire Decoder and jetd Daemon and prints
everything that comes out, one JSON line per stream: tests/build/test_compiled.py runs
it under the compiled and the pure build and compares the two line by line (issue 19)."""

from __future__ import annotations

import json
import sys

from jetd.config import Config
from jetd.core import Connection
from jetd.core import Daemon
from jetwire import AddMethod
from jetwire import AddState
from jetwire import Decoder
from jetwire import FetchQuery
from jetwire import FetchStates
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import SortBy
from jetwire import Value
from jetwire import encode
from jetwire.errors import JetError


def decoded(chunks: list[bytes]) -> list[str]:
    decoder = Decoder(max_body=4096)
    out: list[str] = []
    for chunk in chunks:
        try:
            decoder.receive_data(chunk)
            while (message := decoder.next_message()) is not None:
                out.append(repr(message))
        except JetError as exc:
            out.append(f"{type(exc).__name__}: {exc}")
            break
    return out


def daemon_output(chunks: list[bytes]) -> list[object]:
    """A daemon with an owner (states and a method) and a fetcher (a plain fetch and a
    sorted query): the stream is what a third peer sends; every connection's output
    after each chunk, and whether the peer is closing."""
    daemon = Daemon(Config(max_body=4096))
    owner, fan, peer = (daemon.connect(name, 0.0) for name in ("owner", "fan", "peer"))
    daemon.receive_data(owner, b"".join(encode(m) for m in (
        AddState(1, "k/0", Value.of(1)), AddState(2, "k/1", Value.of("a")), AddState(3, "k/2", Value.of(2.5)),
        AddMethod(4, "m/0"))), 0.0)
    top = Query((PathMatcher(PathOp.STARTS_WITH, ("k/",)),), sort_by=SortBy.KEY, window_from=1, window_to=3)
    daemon.receive_data(fan, encode(FetchStates(1, "")) + encode(FetchQuery(2, top)), 0.0)
    out: list[object] = []

    def collect(now: float) -> None:
        while daemon.has_work:
            daemon.work(now)
        daemon.take_dirty()
        conns: tuple[Connection, ...] = (owner, fan, peer)
        out.append([b"".join(conn.out).hex() for conn in conns] + [peer.closing])
        for conn in conns:
            conn.out.clear()

    collect(0.0)
    for i, chunk in enumerate(chunks):
        now = float(i)
        daemon.receive_data(peer, chunk, now)
        collect(now)
    return out


def main() -> None:
    for line in sys.stdin:
        chunks = [bytes.fromhex(h) for h in json.loads(line)]
        print(json.dumps({"decoded": decoded(chunks), "daemon": daemon_output(chunks)}), flush=True)


if __name__ == "__main__":
    main()
