"""Synthetic event logs in the exact shape jetd writes (spec/JETLOG.md 4), built with the
``jetwire.log`` writer: for tests and for the benchmark.

``synthetic_log`` writes a realistic mix: owners adding states and methods, clients
setting and calling through the daemon (ROUTE records, owner requests, notifies,
responses), rejections, fetch events, and connections opening, naming and closing.
"""

from __future__ import annotations

from collections.abc import Iterator

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import FetchChange
from jetwire import Info
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire.codes import Function
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import conn_close_data
from jetwire.log import conn_name_data
from jetwire.log import conn_open_data
from jetwire.log import encode_header
from jetwire.log import encode_record
from jetwire.log import route_data

__all__ = ["synthetic_records", "write_synthetic_log"]

BASE_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def synthetic_records(rounds: int, *, start_ns: int = BASE_NS, step_ns: int = 1000) -> Iterator[bytes]:
    """Encoded records of ``rounds`` routed request rounds between an owner (conn 1), a
    client (conn 2) and a fetcher (conn 3). Round ``r`` is a CALL when ``r % 10 == 9``
    (5 records), a rejected SET when ``r % 10 == 4`` (5 records), else an accepted SET
    (8 records: request, ROUTE, owner request, NOTIFY and its response, FETCH_CHANGE,
    owner answer, answer to the client)."""
    t = start_ns

    def rec(conn: int, kind: int, data: bytes) -> bytes:
        nonlocal t
        t += step_ns
        return encode_record(t, conn, kind, data)

    for conn, name in ((1, "owner"), (2, "client"), (3, "fetcher")):
        yield rec(conn, LogKind.CONN_OPEN, conn_open_data(f"127.0.0.1:{40000 + conn}"))
        yield rec(conn, LogKind.FRAME_IN, encode(Info(name=name)))
        yield rec(conn, LogKind.CONN_NAME, conn_name_data(name))
    keys = [f"plant/line{i % 7}/temp{i % 13}" for i in range(91)]
    for i, key in enumerate(keys):
        yield rec(1, LogKind.FRAME_IN, encode(AddState(i + 1, key, Value.of(0))))
        yield rec(1, LogKind.FRAME_OUT, encode(Response(i + 1)))
    yield rec(1, LogKind.FRAME_IN, encode(AddMethod(1000, "plant/reset")))
    yield rec(1, LogKind.FRAME_OUT, encode(Response(1000)))
    for r in range(rounds):
        rid = r % 1_000_000 + 1
        oid = r % 1_000_000 + 2_000_000
        if r % 10 == 9:
            arg = Value.of({"round": r})
            yield rec(2, LogKind.FRAME_IN, encode(CallMethod(rid, "plant/reset", arg)))
            yield rec(0, LogKind.ROUTE, route_data(2, rid, 1, oid, Function.CALL_METHOD, "plant/reset"))
            yield rec(1, LogKind.FRAME_OUT, encode(CallMethod(oid, "plant/reset", arg)))
            yield rec(1, LogKind.FRAME_IN, encode(Response(oid, value=Value.of(r))))
            yield rec(2, LogKind.FRAME_OUT, encode(Response(rid, value=Value.of(r))))
            continue
        key = keys[r % len(keys)]
        value = Value.of(float(r) / 4)
        yield rec(2, LogKind.FRAME_IN, encode(SetState(rid, key, value)))
        yield rec(0, LogKind.ROUTE, route_data(2, rid, 1, oid, Function.SET_STATE, key))
        yield rec(1, LogKind.FRAME_OUT, encode(SetState(oid, key, value)))
        if r % 10 == 4:
            yield rec(1, LogKind.FRAME_IN, encode(Response(oid, Status.REJECTED, message="out of range")))
            yield rec(2, LogKind.FRAME_OUT, encode(Response(rid, Status.REJECTED, message="out of range")))
            continue
        yield rec(1, LogKind.FRAME_IN, encode(NotifyState(r + 3_000_000, key, value)))
        yield rec(1, LogKind.FRAME_OUT, encode(Response(r + 3_000_000)))
        yield rec(3, LogKind.FRAME_OUT, encode(FetchChange(1, key, value)))
        yield rec(1, LogKind.FRAME_IN, encode(Response(oid, value=value)))
        yield rec(2, LogKind.FRAME_OUT, encode(Response(rid, value=value)))
    for conn in (2, 3, 1):
        yield rec(conn, LogKind.CONN_CLOSE, conn_close_data(Status.OK, "closed by peer"))


def write_synthetic_log(path: str, rounds: int, *, name: str = "jetd", segment: int = 0,
                        start_ns: int = BASE_NS) -> int:
    """Write a segment of :func:`synthetic_records` to ``path``; returns the record count."""
    count = 0
    with open(path, "wb") as fh:
        fh.write(encode_header(LogHeader(name, start_ns, segment)))
        buf: list[bytes] = []
        for record in synthetic_records(rounds, start_ns=start_ns):
            buf.append(record)
            count += 1
            if len(buf) >= 4096:
                fh.write(b"".join(buf))
                buf.clear()
        fh.write(b"".join(buf))
    return count
