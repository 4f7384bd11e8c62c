"""Spark tests of the ``jetlog`` source and ``jet-ingest`` on one local[2] session.

The scenario test drives a real jetd (``--log-dir``) over raw TCP sockets with jetwire,
then checks every warehouse table against what the scenario did.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Decoder
from jetwire import Info
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from tools.ingest.synth import write_synthetic_log

pytestmark = pytest.mark.spark


class RawPeer:
    """A jet connection over a plain socket: counts every frame and byte each way."""

    def __init__(self, host: str, port: int, name: str) -> None:
        self.sock = socket.create_connection((host, port), timeout=5)
        self.decoder = Decoder()
        self.sent = [0, 0]  # frames, bytes
        self.received = [0, 0]
        self.inbox: list[Message] = []
        self.send(Info(name=name))
        assert isinstance(self.next(), Info)  # PROTOCOL.md 10.1: INFO first

    def send(self, msg: Message) -> None:
        data = encode(msg)
        self.sent[0] += 1
        self.sent[1] += len(data)
        self.sock.sendall(data)

    def next(self) -> Message:
        while True:
            if self.inbox:
                return self.inbox.pop(0)
            msg = self.decoder.next_message()
            if msg is not None:
                self.received[0] += 1
                self.received[1] += self.decoder.consumed - getattr(self, "_consumed", 0)
                self._consumed = self.decoder.consumed
                return msg
            data = self.sock.recv(65536)
            assert data, "jetd closed the connection"
            self.decoder.receive_data(data)

    def expect(self, kind: type, **fields: Any) -> Any:
        msg = self.next()
        assert isinstance(msg, kind), msg
        for name, value in fields.items():
            assert getattr(msg, name) == value, (name, msg)
        return msg

    def close(self) -> None:
        self.sock.close()


def run_scenario(host: str, port: int) -> dict[str, Any]:
    owner = RawPeer(host, port, "owner")
    client = RawPeer(host, port, "client")
    owner.send(AddState(1, "plant/temp", Value.of(20)))
    owner.expect(Response, id=1, status=Status.OK)
    owner.send(AddMethod(2, "plant/reset"))
    owner.expect(Response, id=2, status=Status.OK)

    # 10: an accepted SET (PROTOCOL.md 10.3: NOTIFY before OK)
    client.send(SetState(10, "plant/temp", Value.of(21)))
    routed = owner.expect(SetState, key="plant/temp")
    owner.send(NotifyState(3, "plant/temp", Value.of(21)))
    owner.expect(Response, id=3, status=Status.OK)
    time.sleep(0.002)  # the owner "thinks": latencies must be visibly positive
    owner.send(Response(routed.id, value=Value.of(21)))
    client.expect(Response, id=10, status=Status.OK)
    # 11: a rejected SET
    client.send(SetState(11, "plant/temp", Value.of(99)))
    routed = owner.expect(SetState, key="plant/temp")
    owner.send(Response(routed.id, Status.REJECTED, message="too hot"))
    client.expect(Response, id=11, status=Status.REJECTED)
    # 12: a CALL
    client.send(CallMethod(12, "plant/reset", Value.of({"hard": True})))
    routed = owner.expect(CallMethod, key="plant/reset")
    time.sleep(0.004)
    owner.send(Response(routed.id, value=Value.of(7)))
    client.expect(Response, id=12, status=Status.OK)
    # 13: a SET nobody can take: answered by the daemon, never routed
    client.send(SetState(13, "plant/nope", Value.of(1)))
    client.expect(Response, id=13, status=Status.NOT_FOUND)
    # a fire-and-forget NOTIFY from the owner (PROTOCOL.md 7.1)
    owner.send(NotifyState(None, "plant/temp", Value.of(22.5)))
    # 14: routed, then the owner disconnects without answering (PROTOCOL.md 10.6)
    client.send(SetState(14, "plant/temp", Value.of(23)))
    owner.expect(SetState, key="plant/temp")
    owner.close()
    client.expect(Response, id=14, status=Status.OWNER_GONE)
    client.close()
    return {"owner": owner, "client": client}


def _wait_closed(log_dir: Path, spark: Any, closes: int) -> None:
    """jetd logs a CONN_CLOSE when it notices the client's close: wait for both."""
    from tools.ingest.parse import read_segment

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        n = sum(
            sum(1 for k in b.column("kind").to_pylist() if k == "CONN_CLOSE")
            for f in log_dir.iterdir()
            for b in read_segment(str(f))
        )
        if n >= closes:
            return
        time.sleep(0.05)


def assert_same_as_oracle(tables: dict[str, Any]) -> None:
    """The derived tables hold exactly the rows the earlier Spark SQL implementation
    (spark_oracle.py, which rebuilt them from all frames) computes."""
    import spark_oracle

    frames = spark_oracle.with_seq(tables["frames"])
    exchanges = spark_oracle.request_exchanges(frames)
    expected = {"requests": spark_oracle.requests(frames, exchanges),
                "state_changes": spark_oracle.state_changes(frames, exchanges),
                "connections": spark_oracle.connections(frames)}

    def rows(df: Any) -> list[tuple[Any, ...]]:
        # Floats to 1e-6: durations are µs differences, which the oracle takes as doubles.
        return sorted((tuple(round(v, 6) if isinstance(v, float) else v for v in r) for r in df.collect()), key=repr)

    for name, want in expected.items():
        got = tables[name]
        assert set(got.columns) == set(want.columns), name
        assert rows(got) == rows(want.select(*got.columns)), name


def test_scenario_tables_match(spark: Any, start_jetd: Callable[..., Any], tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    from tools.ingest.cli import ingest_once
    from tools.ingest.cli import load_tables
    from tools.ingest.cli import read_table
    from tools.ingest.report import collect_summary
    from tools.ingest.report import write_report

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    daemon = start_jetd("--log-dir", str(log_dir), "--log-fsync", "always")
    peers = run_scenario(daemon.host, daemon.port)
    time.sleep(0.2)
    assert daemon.stop() == 0  # flushes the log
    warehouse = tmp_path / "wh"
    added = ingest_once(spark, str(log_dir), warehouse)
    tables = load_tables(spark, warehouse)
    frames = tables["frames"]
    assert frames.count() == added > 0
    assert frames.filter(F.col("corrupt").isNotNull() | F.col("frame_error").isNotNull()).count() == 0
    assert_same_as_oracle(tables)

    reqs = {r["request_id"]: r for r in tables["requests"].collect()}
    assert sorted(reqs) == [10, 11, 12, 13, 14]
    assert {i: reqs[i]["status"] for i in reqs} == {
        10: "OK", 11: "REJECTED", 12: "OK", 13: "NOT_FOUND", 14: "OWNER_GONE"}
    assert {i: reqs[i]["routed"] for i in reqs} == {10: True, 11: True, 12: True, 13: False, 14: True}
    assert {i: reqs[i]["owner_status"] for i in reqs} == {10: "OK", 11: "REJECTED", 12: "OK", 13: None, 14: None}
    assert {i: reqs[i]["function"] for i in reqs} == {
        10: "SET_STATE", 11: "SET_STATE", 12: "CALL_METHOD", 13: "SET_STATE", 14: "SET_STATE"}
    assert all(reqs[i]["requester_name"] == "client" for i in reqs)
    assert all(reqs[i]["owner_name"] == "owner" for i in (10, 11, 12, 14))
    assert reqs[12]["result_text"] == "7" and reqs[10]["result_text"] == "21"
    assert reqs[11]["message"] == "too hot"
    for i in reqs:
        assert reqs[i]["latency_ns"] > 0
    for i in (10, 11, 12):  # the owner's part is inside the requester's latency
        assert 0 < reqs[i]["owner_latency_ns"] < reqs[i]["latency_ns"]
    assert reqs[10]["latency_ns"] > 2_000_000 and reqs[12]["latency_ns"] > 4_000_000
    starts = [reqs[i]["ts_ns"] for i in sorted(reqs)]
    assert starts == sorted(starts)

    changes = tables["state_changes"].orderBy("seq").collect()
    assert [(c["key"], c["change"], c["value_before"], c["value_after"]) for c in changes] == [
        ("plant/temp", "ADD", None, "20"),
        ("plant/temp", "NOTIFY", "20", "21"),
        ("plant/temp", "NOTIFY", "21", "22.5"),
        ("plant/temp", "DISCONNECT", "22.5", None),
    ]
    assert {c["owner_name"] for c in changes} == {"owner"}
    assert [c["ts_ns"] for c in changes] == sorted(c["ts_ns"] for c in changes)

    conns = {c["name"]: c for c in tables["connections"].collect()}
    assert set(conns) == {"owner", "client"}
    for name, peer in peers.items():
        c = conns[name]
        assert (c["frames_in"], c["bytes_in"]) == tuple(peer.sent), name
        assert (c["frames_out"], c["bytes_out"]) == tuple(peer.received), name
        assert c["address"].startswith("127.0.0.1:")
        assert c["closed"] is not None and c["duration_s"] > 0
    assert conns["owner"]["closed"] < conns["client"]["closed"]

    # Idempotent: a second run over the same logs adds nothing.
    assert ingest_once(spark, str(log_dir), warehouse) == 0
    assert read_table(spark, warehouse, "frames").count() == added

    summary = collect_summary(tables)
    assert summary.rows == {"frames": added, "state_changes": 4, "requests": 5, "connections": 2,
                            "traffic": tables["traffic"].count()}
    # The rollup the report reads counts every record once.
    assert tables["traffic"].agg(F.sum("records")).first()[0] == added
    assert int(summary.per_second["events"].sum()) == added
    assert dict(zip(summary.errors["status"], summary.errors["count"], strict=True)) == {
        "REJECTED": 1, "NOT_FOUND": 1, "OWNER_GONE": 1}
    write_report(summary, warehouse / "report.html")
    html = (warehouse / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "OWNER_GONE" in html


def test_ingest_in_two_runs_matches_the_oracle(spark: Any, tmp_path: Path) -> None:
    """A log ingested in two runs, the first ending mid-record and mid-request: the
    second run settles what the first carried, and no row is missing or twice."""
    from tools.ingest.cli import ingest_once
    from tools.ingest.cli import load_tables

    whole = tmp_path / "whole.jetlog"
    records = write_synthetic_log(str(whole), 3000)
    data = whole.read_bytes()
    logs = tmp_path / "logs"
    logs.mkdir()
    seg = logs / "jetd-000000.jetlog"
    seg.write_bytes(data[: len(data) * 2 // 5 + 7])
    warehouse = tmp_path / "wh"
    first = ingest_once(spark, str(logs), warehouse)
    open_now = load_tables(spark, warehouse)["requests"].filter("status = 'UNANSWERED'")
    assert open_now.count() == 1  # the request the cut left open: shown, pending, until answered
    seg.write_bytes(data)
    second = ingest_once(spark, str(logs), warehouse)
    assert 0 < first < records and first + second == records
    tables = load_tables(spark, warehouse)
    assert tables["frames"].count() == records
    assert tables["requests"].count() == 3000
    assert tables["requests"].filter("status = 'UNANSWERED'").count() == 0
    assert_same_as_oracle(tables)


def test_logs_jetd_writes_match_the_oracle(spark: Any, tmp_path: Path) -> None:
    """Two daemon runs written by the real jetd core (random peers, timeouts, late and
    missing answers, a few damaged records), ingested in two runs: the derived tables
    equal the oracle's."""
    from jetd_logs import RUN
    from jetd_logs import JetdLog

    from tools.ingest.cli import ingest_once
    from tools.ingest.cli import load_tables

    logs = tmp_path / "logs"
    logs.mkdir()
    warehouse = tmp_path / "wh"
    JetdLog(11, 400).write(logs / "jetd-a.jetlog", damage=3)
    ingest_once(spark, str(logs), warehouse)
    JetdLog(12, 400, start_ns=RUN + 10**12).write(logs / "jetd-b.jetlog", created_ns=RUN + 10**12)
    ingest_once(spark, str(logs), warehouse)
    tables = load_tables(spark, warehouse)
    assert tables["requests"].filter("owner_status IS NOT NULL AND status = 'TIMEOUT'").count() > 0
    assert_same_as_oracle(tables)


def test_source_reads_dir_glob_list_and_sql(spark: Any, tmp_path: Path) -> None:
    a = tmp_path / "jet-a.jetlog"
    b = tmp_path / "sub" / "jet-b.jetlog"
    b.parent.mkdir()
    na = write_synthetic_log(str(a), 50)
    nb = write_synthetic_log(str(b), 30, segment=1)
    (tmp_path / "notes.txt").write_text("not a log")
    assert spark.read.format("jetlog").load(str(tmp_path)).count() == na  # the dir: logs only
    assert spark.read.format("jetlog").load(str(tmp_path / "**" / "*.jetlog")).count() == na + nb
    assert spark.read.format("jetlog").load([str(a), str(b)]).count() == na + nb
    # Chunked reads of one file give each record exactly once, peer names included.
    chunked = spark.read.format("jetlog").option("chunkSize", "997").load(str(a))
    assert chunked.rdd.getNumPartitions() > 5
    assert chunked.select("offset").distinct().count() == na
    assert chunked.filter("conn_id = 2 and kind = 'FRAME_OUT' and peer_name is null").count() == 0
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW jl USING jetlog OPTIONS (path '{a}')")
    got = spark.sql("SELECT function, count(*) AS n FROM jl WHERE kind = 'ROUTE' GROUP BY function").collect()
    assert {r["function"]: r["n"] for r in got} == {"SET_STATE": 45, "CALL_METHOD": 5}
    with pytest.raises(Exception, match=r"CRC mismatch|runs past the end"):
        data = bytearray(a.read_bytes())
        data[200] ^= 0xFF
        a.write_bytes(bytes(data))
        spark.read.format("jetlog").option("mode", "FAILFAST").load(str(a)).count()


def test_streaming_reads_each_record_once(spark: Any, tmp_path: Path) -> None:
    from jetwire.log import LogHeader
    from jetwire.log import LogKind
    from jetwire.log import conn_open_data
    from jetwire.log import encode_header
    from jetwire.log import encode_record

    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    seg = log_dir / "jet-0.jetlog"
    records = [encode_record(10**18 + i, 1 + i % 3, LogKind.CONN_OPEN, conn_open_data(f"127.0.0.1:{i}"))
               for i in range(60)]
    seg.write_bytes(encode_header(LogHeader("jetd", 10**18, 0)) + b"".join(records[:20]) + records[20][:7])
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run() -> None:
        query = (spark.readStream.format("jetlog").load(str(log_dir)).writeStream.format("parquet")
                 .option("path", str(out)).option("checkpointLocation", str(ckpt)).start())
        query.processAllAvailable()
        query.stop()

    run()
    assert spark.read.parquet(str(out)).count() == 20  # the partial record waits
    with open(seg, "ab") as fh:  # the daemon finishes the record and writes more
        fh.write(records[20][7:] + b"".join(records[21:40]))
    (log_dir / "jet-1.jetlog").write_bytes(encode_header(LogHeader("jetd", 2 * 10**18, 1)) + b"".join(records[40:]))
    run()  # a restart from the checkpoint
    rows = spark.read.parquet(str(out)).select("file", "offset", "address").collect()
    assert len(rows) == 60 == len({(r["file"], r["offset"]) for r in rows})
    assert sorted(int(r["address"].split(":")[1]) for r in rows) == list(range(60))
    batches = sorted((p for p in (ckpt / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    offsets = json.loads(batches[-1].read_text().splitlines()[-1])
    assert offsets["files"][str(seg)] == seg.stat().st_size


def _log_records(log_dir: Path) -> set[tuple[str, int]]:
    """(file, offset) of every complete record in the log directory."""
    from tools.ingest.parse import read_segment

    return {
        (str(f), off)
        for f in log_dir.iterdir()
        for b in read_segment(str(f))
        for off, kind in zip(b.column("offset").to_pylist(), b.column("kind").to_pylist(), strict=True)
        if kind is not None
    }


def test_follow_ingests_a_live_log_exactly_once(spark: Any, start_jetd: Callable[..., Any], tmp_path: Path) -> None:
    """``jet-ingest --follow`` (what ``main`` runs, on the shared session) against a jetd
    that keeps logging: the batch ingest, micro-batches, --idle-exit, derived tables."""
    import io
    import threading

    from rich.console import Console

    from tools.ingest.cli import _parser
    from tools.ingest.cli import load_tables
    from tools.ingest.cli import run

    log_dir, warehouse = tmp_path / "logs", tmp_path / "wh"
    log_dir.mkdir()
    daemon = start_jetd("--log-dir", str(log_dir), "--log-fsync", "always")
    run_scenario(daemon.host, daemon.port)  # before jet-ingest starts: the batch ingest takes it
    _wait_closed(log_dir, spark, 2)  # jetd writes its log on its next tick
    args = _parser().parse_args([str(log_dir), "--out", str(warehouse), "--follow", "--interval", "0.5",
                                 "--idle-exit", "3", "--no-report", "--follow-for", "90"])
    out = io.StringIO()
    result: list[object] = []

    def follow() -> None:
        try:
            result.append(run(spark, args, Console(file=out, width=200)))
        except BaseException as exc:  # reported by the assertions below
            result.append(exc)

    runner = threading.Thread(target=follow, daemon=True)
    runner.start()

    def lines() -> list[str]:
        return out.getvalue().splitlines()

    def wait_for(pred: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 90
        while not pred():
            assert runner.is_alive(), f"jet-ingest ended ({result}) waiting for {what}: {lines()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {lines()}"
            time.sleep(0.1)

    def batches_with_rows() -> int:
        return sum(1 for ln in lines() if ln.startswith("micro-batch") and not ln.rstrip().endswith(" 0 new record(s)"))

    try:
        wait_for(lambda: any(ln.startswith("following") for ln in lines()), "the stream to start")
        run_scenario(daemon.host, daemon.port)  # while it follows
        wait_for(lambda: batches_with_rows() >= 1, "a micro-batch with the new records")
        assert daemon.stop() == 0  # closes the connections' records and the segment
        runner.join(120)
    finally:
        if runner.is_alive():
            for query in spark.streams.active:
                query.stop()
            runner.join(30)
    assert result == [0], (result, lines())
    assert any(ln.startswith("no new records") for ln in lines()), lines()
    logged = _log_records(log_dir)
    table = DeltaTable(str(warehouse / "frames")).to_pyarrow_table(columns=["file", "offset", "kind"])
    got = list(zip(table.column("file").to_pylist(), table.column("offset").to_pylist(), strict=True))
    assert len(got) == len(set(got)) == len(logged) > 0  # every record, none twice
    assert set(got) == logged
    # The derived tables, built by the batch run and then micro-batch by micro-batch,
    # hold what a rebuild from all frames gives: both scenarios' requests, none open.
    tables = load_tables(spark, warehouse)
    assert tables["requests"].count() == 10
    assert_same_as_oracle(tables)


def test_follow_skips_a_micro_batch_already_ingested(spark: Any, tmp_path: Path) -> None:
    """``--follow`` in-process: micro-batches whose records the progress table already holds
    (the last one replayed after a restart; bytes a batch run took meanwhile) commit
    nothing and do not crash, and records appended afterwards are ingested once."""
    import argparse
    import io
    import threading

    from rich.console import Console

    from jetwire.log import LogHeader
    from jetwire.log import LogKind
    from jetwire.log import conn_open_data
    from jetwire.log import encode_header
    from jetwire.log import encode_record
    from tools.ingest.cli import _follow
    from tools.ingest.cli import ingest_once
    from tools.ingest.warehouse import Warehouse

    log_dir, warehouse = tmp_path / "logs", tmp_path / "wh"
    log_dir.mkdir()
    seg = log_dir / "jet-0.jetlog"
    records = [encode_record(10**18 + i, 1 + i % 3, LogKind.CONN_OPEN, conn_open_data(f"127.0.0.1:{i}"))
               for i in range(80)]
    seg.write_bytes(encode_header(LogHeader("jetd", 10**18, 0)) + b"".join(records[:20]))

    def append(first: int, last: int) -> None:
        with open(seg, "ab") as fh:
            fh.write(b"".join(records[first:last]))

    def follow(until: Callable[[list[str]], bool], on_line: Callable[[str], None]) -> list[str]:
        """Runs ``_follow``, calling ``on_line`` on each micro-batch line it prints, until
        ``until(lines)`` holds; then stops its query and returns the lines."""
        out = io.StringIO()
        args = argparse.Namespace(logdir=str(log_dir), out=str(warehouse), since=None, interval=0.2, mode="PERMISSIVE",
                                  idle_exit=None, follow_for=60.0)
        stopped = threading.Event()
        failures: list[BaseException] = []

        def batches() -> list[str]:
            return [ln for ln in out.getvalue().splitlines() if ln.startswith("micro-batch")]

        def watch() -> None:
            # The CLI stops on Ctrl-C or --idle-exit; here the stream stops once the
            # awaited batch has committed (or after 60 s if it never comes).
            seen = 0
            deadline = time.monotonic() + 60
            try:
                while not stopped.wait(0.1) and time.monotonic() < deadline:
                    lines = batches()
                    for ln in lines[seen:]:
                        on_line(ln)
                    seen = len(lines)
                    if until(lines):
                        break
            except BaseException as exc:
                failures.append(exc)
            finally:
                for query in spark.streams.active:
                    query.stop()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            _follow(spark, args, Console(file=out, width=200))
        finally:
            stopped.set()
            watcher.join(30)
        if failures:
            raise failures[0]
        return batches()

    def ingested() -> list[tuple[str, int]]:
        table = DeltaTable(str(warehouse / "frames")).to_pyarrow_table(columns=["file", "offset"])
        return list(zip(table.column("file").to_pylist(), table.column("offset").to_pylist(), strict=True))

    def assert_exactly_once(n: int) -> None:
        got = ingested()
        assert len(got) == len(set(got)) == n
        assert set(got) == _log_records(log_dir)
        assert [s.done for s in Warehouse.load(warehouse).files.values() if s.path == str(seg)] == [seg.stat().st_size]

    def then_append(after: str, first: int, last: int, ingested_so_far: int) -> Callable[[str], None]:
        def on_line(line: str) -> None:
            if line.startswith(after):
                assert_exactly_once(ingested_so_far)
                append(first, last)
        return on_line

    def until_batch(prefix: str) -> Callable[[list[str]], bool]:
        return lambda lines: any(ln.startswith(prefix) for ln in lines)

    # 1. The stream ingests 20 records, then 20 appended while it follows (batches 0, 1).
    lines = follow(until_batch("micro-batch 1:"), then_append("micro-batch 0:", 20, 40, 20))
    assert lines == ["micro-batch 0: 20 new record(s)", "micro-batch 1: 20 new record(s)"]
    assert_exactly_once(40)
    # 2. A batch run ingests the next 20 while nobody follows.
    append(40, 60)
    assert ingest_once(spark, str(log_dir), warehouse, console=Console(file=io.StringIO())) == 20
    assert_exactly_once(60)
    # 3. Restart as after a crash between the warehouse's commit of batch 1 and Spark's:
    # batch 1 is replayed, then batch 2 covers the records the batch run took. Neither
    # adds a row; records appended after them are ingested once, by batch 3.
    for name in ("1", ".1.crc"):
        # missing_ok: the first follow stopped its query before Spark committed batch 1
        (warehouse / "_jet_ingest" / "checkpoint" / "commits" / name).unlink(missing_ok=True)
    version = Warehouse.load(warehouse).version
    lines = follow(until_batch("micro-batch 3:"), then_append("micro-batch 2:", 60, 80, 60))
    assert lines == ["micro-batch 1: 0 new record(s)", "micro-batch 2: 0 new record(s)",
                     "micro-batch 3: 20 new record(s)"]
    assert_exactly_once(80)
    assert Warehouse.load(warehouse).version == version + 1  # only batch 3 committed
    assert not (warehouse / "_jet_ingest" / "staging").exists() or not any(
        (warehouse / "_jet_ingest" / "staging").iterdir())


def test_jet_ingest_failfast_fails_on_damage_quietly_and_commits_nothing(tmp_path: Path) -> None:
    """``python -m tools.ingest --mode FAILFAST`` as a user runs it (its own JVM): damage
    is exit status 1 with the reason and no traceback; Spark's WARN lines and stage
    progress bars stay off the console; nothing is committed."""
    import os
    import subprocess
    import sys

    from tools.ingest.session import REPO_ROOT
    from tools.ingest.warehouse import Warehouse

    logs, wh = tmp_path / "logs", tmp_path / "wh"
    logs.mkdir()
    seg = logs / "jet-0.jetlog"
    write_synthetic_log(str(seg), 400)
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a record in the middle: CRC mismatch
    seg.write_bytes(bytes(data))
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300", "JET_INGEST_CDS": "0"}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    done = subprocess.run([sys.executable, "-m", "tools.ingest", str(logs), "--out", str(wh), "--mode", "FAILFAST",
                           "--master", "local[1]"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done
    assert "CRC mismatch" in done.stdout and "nothing of this run was committed" in done.stdout, done
    assert "FAILFAST" in done.stdout
    console = done.stdout + done.stderr
    assert "Traceback" not in console, console
    assert " WARN " not in console and "[Stage " not in console, console
    assert Warehouse.load(wh).version == 0
    assert not (wh / "frames").exists()


def test_spark_reads_whole_versions_after_a_crash_and_travels_in_time(spark: Any, tmp_path: Path) -> None:
    """A run killed after its derived tables' commits, before frames' (the run is
    decided): ``read_table`` sees the previous version of frames; the next run finishes
    the killed one (once) and then adds its own; every version and time stays readable."""
    import datetime

    from test_commit import QUIET
    from test_commit import _ingest_process
    from test_commit import _segments

    from tools.ingest import read_table
    from tools.ingest.cli import ingest_once

    logs, wh = tmp_path / "logs", tmp_path / "wh"
    _segments(logs, 0, 2, 40)
    first = ingest_once(None, str(logs), wh, console=QUIET)
    after_first = datetime.datetime.now(datetime.UTC)
    _segments(logs, 2, 5, 40)
    assert _ingest_process(logs, wh, "committed-traffic").returncode == 86
    assert read_table(spark, wh, "frames").count() == first
    _segments(logs, 5, 6, 40)
    added = ingest_once(None, str(logs), wh, console=QUIET)  # the killed run's rows came with the recovery
    frames = read_table(spark, wh, "frames")
    assert frames.count() == frames.select("file", "offset").distinct().count() == DeltaTable(
        str(wh / "frames")).to_pyarrow_table().num_rows
    assert added == first // 2 and frames.count() == 3 * first
    versions = [h["version"] for h in DeltaTable(str(wh / "frames")).history() if h.get("jet.operation") == "ingest"]
    counts = [read_table(spark, wh, "frames", version=v).count() for v in sorted(versions)]
    assert counts == [first, 5 * first // 2, 3 * first]
    assert read_table(spark, wh, "frames", timestamp=after_first).count() == first
    with pytest.raises(ValueError, match="version"):
        read_table(spark, wh, "frames", version=99)
