"""A daemon run whose history starts after its segment 0 (issue 27 item 3): what can be
derived is derived, and what cannot is said.

The log: an owner adds its states once, at the start; a client sets them, the daemon
routes each set to the owner, which notifies the new value by a NOTIFY event (the
common way, PROTOCOL.md 7.1) and answers. The run is cut in two segments (the second
starting with CONN_SNAPSHOT records, JETLOG.md 4), and only the second is ingested, as
after retention deleted the first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from jetwire import AddState
from jetwire import Info
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Value
from jetwire import encode
from jetwire.codes import Function
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import conn_name_data
from jetwire.log import conn_open_data
from jetwire.log import conn_snapshot_data
from jetwire.log import encode_header
from jetwire.log import encode_record
from jetwire.log import route_data

RUN = 1_767_225_600_000_000_000
SEQ_SEGMENT = 1 << 40


def _records(rounds: int, keys: int = 20) -> list[bytes]:
    t = RUN
    out: list[bytes] = []

    def rec(conn: int, kind: int, data: bytes) -> None:
        nonlocal t
        t += 1000
        out.append(encode_record(t, conn, kind, data))

    for conn, name in ((1, "owner"), (2, "client")):
        rec(conn, LogKind.CONN_OPEN, conn_open_data(f"127.0.0.1:{40000 + conn}"))
        rec(conn, LogKind.FRAME_IN, encode(Info(name=name)))
        rec(conn, LogKind.CONN_NAME, conn_name_data(name))
    for i in range(keys):
        rec(1, LogKind.FRAME_IN, encode(AddState(i + 1, f"k/{i}", Value.of(0))))
        rec(1, LogKind.FRAME_OUT, encode(Response(i + 1)))
    for r in range(rounds):
        key, value = f"k/{r % keys}", Value.of(r)
        rec(2, LogKind.FRAME_IN, encode(SetState(r + 1, key, value)))
        rec(0, LogKind.ROUTE, route_data(2, r + 1, 1, r + 100_000, Function.SET_STATE, key))
        rec(1, LogKind.FRAME_OUT, encode(SetState(r + 100_000, key, value)))
        rec(1, LogKind.FRAME_IN, encode(NotifyState(None, key, value)))  # an event
        rec(1, LogKind.FRAME_IN, encode(Response(r + 100_000)))
        rec(2, LogKind.FRAME_OUT, encode(Response(r + 1)))
    return out


def _write_run(full: Path, later: Path) -> None:
    """The run in two segments into ``full``; only its second into ``later``."""
    records = _records(600)
    half = len(records) // 2
    head0 = encode_header(LogHeader("jetd", RUN, 0, version=2, run_ns=RUN))
    head1 = encode_header(LogHeader("jetd", RUN + 10**9, 1, version=2, run_ns=RUN))
    snapshot = [encode_record(RUN + 10**9, c, LogKind.CONN_SNAPSHOT, conn_snapshot_data(f"127.0.0.1:{40000 + c}", n))
                for c, n in ((1, "owner"), (2, "client"))]
    for d in (full, later):
        d.mkdir()
        (d / "jetd-000001.jetlog").write_bytes(head1 + b"".join(snapshot + records[half:]))
    (full / "jetd-000000.jetlog").write_bytes(head0 + b"".join(records[:half]))


def _table(warehouse: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = DeltaTable(str(warehouse / name)).to_pyarrow_table().to_pylist()
    return rows


def test_a_run_read_from_a_later_segment_keeps_the_changes_it_holds(tmp_path: Path) -> None:
    """The owner of a state added before the history starts is shown by the first set the
    daemon routes to it: its NOTIFY events count from there (they were all dropped: 0
    state changes, as the issue found). Checked against the whole run's ingest."""
    from tools.ingest.cli import ingest_once

    _write_run(tmp_path / "full", tmp_path / "later")
    ingest_once(None, str(tmp_path / "full"), tmp_path / "wh-full")
    ingest_once(None, str(tmp_path / "later"), tmp_path / "wh-later")
    whole = [r for r in _table(tmp_path / "wh-full", "state_changes") if r["seq"] >= SEQ_SEGMENT]
    later = _table(tmp_path / "wh-later", "state_changes")

    def same(r: dict[str, Any]) -> tuple[Any, ...]:
        return r["key"], r["change"], r["ts_ns"], r["owner_conn"], r["owner_name"], r["value_after"]

    assert len(whole) > 250 and sorted(map(same, later), key=repr) == sorted(map(same, whole), key=repr)
    # What cannot be derived: the value each state had before its first change here.
    firsts = {r["key"]: r for r in sorted(later, key=lambda r: r["seq"], reverse=True)}
    assert all(r["value_before"] is None for r in firsts.values())
    assert sum(r["value_before"] is not None for r in later) == len(later) - len(firsts)


def test_partial_history_is_said_in_the_table_and_first_in_the_report(tmp_path: Path) -> None:
    """Each state_changes row of a partial run says what is missing and what cannot be
    derived (column ``history``); the report's first lines name the missing segments.
    A --since that cuts into a run is said the same way; a whole run says nothing."""
    import pandas as pd
    from rich.console import Console

    from tools.ingest.cli import ingest_once
    from tools.ingest.report import Summary
    from tools.ingest.report import print_summary
    from tools.ingest.report import write_report
    from tools.ingest.warehouse import Warehouse
    from tools.ingest.warehouse import history_notes

    _write_run(tmp_path / "full", tmp_path / "later")
    ingest_once(None, str(tmp_path / "later"), tmp_path / "wh-later")
    notes = history_notes(Warehouse.load(tmp_path / "wh-later").files.values())
    assert list(notes) == [RUN]
    note = notes[RUN]
    assert "segment(s) 0 of 2 not read" in note and "owner" in note and "value before its first change" in note
    assert {r["history"] for r in _table(tmp_path / "wh-later", "state_changes")} == {note}
    assert {r["history"] for r in _table(tmp_path / "wh-later", "connections")} == {note}

    ingest_once(None, str(tmp_path / "full"), tmp_path / "wh-full")
    assert history_notes(Warehouse.load(tmp_path / "wh-full").files.values()) == {}
    assert {r["history"] for r in _table(tmp_path / "wh-full", "state_changes")} == {None}
    assert {r["history"] for r in _table(tmp_path / "wh-full", "connections")} == {None}

    since = RUN + 10**9 // 2  # inside segment 0
    ingest_once(None, str(tmp_path / "full"), tmp_path / "wh-since", since_ns=since)
    (cut,) = history_notes(Warehouse.load(tmp_path / "wh-since").files.values()).values()
    assert "records before 2026-01-01 00:00:00 UTC skipped (--since)" in cut and "not read" not in cut
    # ... and it stays said in later runs that add to it
    ingest_once(None, str(tmp_path / "full"), tmp_path / "wh-since")
    assert list(history_notes(Warehouse.load(tmp_path / "wh-since").files.values()).values()) == [cut]

    empty = pd.DataFrame()
    summary = Summary({"frames": 1}, empty, empty, empty, empty, pd.DataFrame({"status": [], "latency_ms": []}),
                      pd.DataFrame({"name": [], "conn_id": [], "frames": []}), source="logs", history=[note])
    console = Console(record=True, width=400)
    print_summary(summary, console)
    assert console.export_text().splitlines()[0] == note
    write_report(summary, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    assert page.index("Partial history") < page.index("id='source'") and "segment(s) 0 of 2 not read" in page
