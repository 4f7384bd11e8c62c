"""Area 10: the event log (spec/JETLOG.md): records, ROUTE, rotation, snapshots, repair."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from jetd_testlib import RawPeer
from jetd_testlib import v

from jetwire import AddState
from jetwire import FetchStates
from jetwire import FrameType
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import decode_frame
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import LogRecord
from jetwire.log import Truncation
from jetwire.log import iter_log
from jetwire.log import parse_record_data


def _read(path: Path) -> tuple[LogHeader, list[LogRecord], list[object]]:
    with open(path, "rb") as stream:
        items = list(iter_log(stream))
    header = items[0]
    assert isinstance(header, LogHeader)
    records = [i for i in items[1:] if isinstance(i, LogRecord)]
    problems = [i for i in items[1:] if not isinstance(i, LogRecord)]
    return header, records, problems


def _segments(directory: Path) -> list[Path]:
    return sorted(directory.glob("jet-*.jetlog"))


def _traffic(address):
    owner = RawPeer(address, "owner")
    client = RawPeer(address, "client")
    owner.request(lambda rid: AddState(rid, "k", v(1)))
    fid = client.request(lambda rid: FetchStates(rid, "")).fetch_id
    client.recv()
    client.send(SetState(50, "k", v(2)))
    routed = owner.recv()
    owner.send(NotifyState(None, "k", v(2)), Response(routed.id, Status.OK, v(2)))
    client.recv_n(2)
    owner.close()
    client.recv()  # FETCH_REMOVE
    return fid, routed.id, client


@pytest.mark.parametrize("fsync", ["interval", "always", "never"])
def test_records_of_a_session(start_jetd, tmp_path, fsync):
    logdir = tmp_path / "log"
    daemon = start_jetd("--log-dir", str(logdir), "--log-fsync", fsync)
    _fid, owner_id, client = _traffic(daemon.address)
    daemon.stop()
    client.close()
    [segment] = _segments(logdir)
    assert segment.name.startswith("jet-") and f"-{daemon.proc.pid}-000000.jetlog" in segment.name
    header, records, problems = _read(segment)
    assert (header.name, header.segment) == ("jetd", 0)
    assert problems == []
    assert all(a.ts_ns <= b.ts_ns for a, b in itertools.pairwise(records))
    kinds = [r.kind for r in records]
    opens = [r for r in records if r.kind == LogKind.CONN_OPEN]
    assert len(opens) == 2 and parse_record_data(LogKind.CONN_OPEN, opens[0].data)["address"].startswith("127.0.0.1:")
    names = {r.conn_id: parse_record_data(r.kind, r.data)["name"] for r in records if r.kind == LogKind.CONN_NAME}
    assert sorted(names.values()) == ["client", "owner"]
    owner_conn = next(c for c, n in names.items() if n == "owner")
    client_conn = next(c for c, n in names.items() if n == "client")
    # The requester's FRAME_IN, then ROUTE, then the FRAME_OUT to the owner.
    route_at = kinds.index(LogKind.ROUTE)
    route = parse_record_data(LogKind.ROUTE, records[route_at].data)
    assert route == {
        "requester_conn": client_conn,
        "requester_id": 50,
        "owner_conn": owner_conn,
        "owner_id": owner_id,
        "function": 3,
        "key": "k",
    }
    before, after = records[route_at - 1], records[route_at + 1]
    assert before.kind == LogKind.FRAME_IN and before.conn_id == client_conn
    assert decode_frame(before.data) == SetState(50, "k", v(2))
    assert after.kind == LogKind.FRAME_OUT and after.conn_id == owner_conn
    assert decode_frame(after.data) == SetState(owner_id, "k", v(2))
    # Every frame logged is a whole frame; fetch events are not in FRAME_OUT by default.
    outs = [decode_frame(r.data) for r in records if r.kind == LogKind.FRAME_OUT]
    assert not any(type(m).__name__.startswith("Fetch") and hasattr(m, "fetch_id") and not isinstance(m, Response) for m in outs)
    assert Response(50, Status.OK, v(2)) in outs
    closes = [parse_record_data(r.kind, r.data) for r in records if r.kind == LogKind.CONN_CLOSE]
    assert len(closes) == 2 and all(c["status"] == Status.OK for c in closes)
    assert any(c["reason"] == "shutting down" for c in closes)


def test_log_events_records_fetch_events(start_jetd, tmp_path):
    logdir = tmp_path / "log"
    daemon = start_jetd("--log-dir", str(logdir), "--log-events")
    _fid, _, client = _traffic(daemon.address)
    daemon.stop()
    client.close()
    _, records, _ = _read(_segments(logdir)[0])
    events = [r.data for r in records if r.kind == LogKind.FRAME_OUT and r.data[0] == FrameType.EVENT]
    names = [type(decode_frame(e)).__name__ for e in events]
    assert names.count("FetchAdd") == 1 and names.count("FetchChange") == 1 and names.count("FetchRemove") == 1


def test_rotation_with_snapshots_and_new_segment_on_restart(start_jetd, tmp_path):
    logdir = tmp_path / "log"
    daemon = start_jetd("--log-dir", str(logdir), "--log-rotate-size", "2000")
    owner = RawPeer(daemon.address, "stayer")
    owner.request(lambda rid: AddState(rid, "k", v(0)))
    for i in range(60):
        owner.request(lambda rid, i=i: NotifyState(rid, "k", v(i)))
        if i % 20 == 0:
            time.sleep(0.06)  # let the writer run between bursts
    daemon.stop()
    segments = _segments(logdir)
    assert len(segments) >= 3
    total_in = 0
    for number, path in enumerate(segments):
        header, records, problems = _read(path)
        assert header.segment == number and problems == []
        if number > 0:
            first = records[0]
            assert first.kind == LogKind.CONN_SNAPSHOT
            assert parse_record_data(first.kind, first.data)["name"] == "stayer"
        total_in += sum(1 for r in records if r.kind == LogKind.FRAME_IN)
    assert total_in == 1 + 1 + 60  # INFO, ADD_STATE, 60 notifies: nothing lost across segments
    second = start_jetd("--log-dir", str(logdir))
    second.stop()
    assert len(_segments(logdir)) == len(segments) + 1


def test_truncated_last_record_is_cut_on_start(start_jetd, tmp_path):
    logdir = tmp_path / "log"
    daemon = start_jetd("--log-dir", str(logdir))
    client = _traffic(daemon.address)[2]
    daemon.stop()
    client.close()
    [segment] = _segments(logdir)
    _, records, _ = _read(segment)
    good_size = segment.stat().st_size
    with open(segment, "ab") as stream:  # a crash in the middle of a record
        stream.write(b"JR\x00\x00\x01\x00\x12\x34\x56\x78partial")
    with open(segment, "rb") as stream:
        assert isinstance(list(iter_log(stream))[-1], Truncation)
    again = start_jetd("--log-dir", str(logdir))
    again.stop()
    assert segment.stat().st_size == good_size
    _, after, problems = _read(segment)
    assert after == records and problems == []
    assert "cut it there" in again.stderr()


def test_unwritable_log_dir_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = subprocess.run(
        [sys.executable, "-m", "jetd", "--host", "127.0.0.1", "--port", "0", "--log-dir", str(blocker / "x")],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=str(Path(__file__).parents[2]),
    )
    assert result.returncode == 1
    assert "jetd: error" in result.stderr and "Traceback" not in result.stderr


def _all_records(directory: Path) -> list[LogRecord]:
    records: list[LogRecord] = []
    for number, path in enumerate(_segments(directory)):
        header, found, problems = _read(path)
        assert header.segment == number and problems == []
        assert all(a.ts_ns <= b.ts_ns for a, b in itertools.pairwise(found))
        records.extend(found)
    return records


def test_slow_writer_never_blocks_the_loop_and_loses_nothing(tmp_path, monkeypatch):
    """JETLOG.md 6.3: the loop never waits for the writer; the backlog it reports is what
    the caller (the server) pushes back on; nothing is dropped."""
    import threading

    from jetd.eventlog import EventLog
    from jetwire.log import conn_open_data

    release = threading.Event()
    write = EventLog._write

    def write_when_released(self: EventLog, data: bytes) -> None:
        release.wait(30)  # a disk that does not move until the test says so
        write(self, data)

    monkeypatch.setattr(EventLog, "_write", write_when_released)
    eventlog = EventLog(tmp_path, chunk_size=256, max_backlog=1024, fsync="never")
    eventlog.open()
    eventlog.append(1, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:1"))
    frames = [bytes([1, 0, 0, 0, 4]) + i.to_bytes(4, "big") for i in range(3000)]
    for frame in frames:  # returns although the writer has written nothing
        eventlog.append(1, LogKind.FRAME_IN, frame)
    assert eventlog.over_backlog and eventlog.backlog > 3000 * 20
    release.set()
    eventlog.close()
    assert eventlog.backlog == 0 and eventlog.stats.dropped_bytes == 0
    assert eventlog.stats.peak_backlog > 1024
    records = _all_records(tmp_path)
    assert [r.data for r in records if r.kind == LogKind.FRAME_IN] == frames


def test_rotation_in_process_keeps_order_and_snapshots(tmp_path):
    from jetd.eventlog import EventLog
    from jetwire.log import conn_close_data
    from jetwire.log import conn_name_data
    from jetwire.log import conn_open_data

    eventlog = EventLog(tmp_path, rotate_size=500, chunk_size=100_000)
    eventlog.open()
    eventlog.append(1, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:1"))
    eventlog.append(1, LogKind.CONN_NAME, conn_name_data("one"))
    eventlog.append(2, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:2"))
    frames = [bytes([1, 0, 0, 0, 4]) + i.to_bytes(4, "big") for i in range(100)]
    for i, frame in enumerate(frames):
        eventlog.append(1, LogKind.FRAME_IN, frame)
        if i == 50:
            eventlog.append(2, LogKind.CONN_CLOSE, conn_close_data(Status.OK, "bye"))
        if i % 10 == 0:
            eventlog.flush()
    eventlog.close()
    segments = _segments(tmp_path)
    assert len(segments) >= 4
    for path in segments[1:]:
        snapshots = {}
        for record in _read(path)[1]:
            if record.kind != LogKind.CONN_SNAPSHOT:
                break
            snapshots[record.conn_id] = parse_record_data(record.kind, record.data)["name"]
        assert snapshots.get(1) == "one"
    assert [r.data for r in _all_records(tmp_path) if r.kind == LogKind.FRAME_IN] == frames


def _wait(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.01)


def test_removed_directory_loses_commits_then_the_log_resumes(tmp_path, caplog):
    """JETLOG.md 6.5, in process: a segment deleted under the writer is a failure (one
    ERROR line); commits from then on are reported lost, never durable; retry() makes the
    directory again and resumes (one line), with a snapshot naming the open connection;
    later commits are durable and their records are in the new segment."""
    import logging
    import shutil

    from jetd.eventlog import EventLog
    from jetwire.log import conn_name_data
    from jetwire.log import conn_open_data

    caplog.set_level(logging.INFO, "jetd.eventlog")
    logdir = tmp_path / "log"
    eventlog = EventLog(logdir, fsync="always", on_error="testing")
    eventlog.open()
    eventlog.append(1, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:1"))
    eventlog.append(1, LogKind.CONN_NAME, conn_name_data("one"))
    first = eventlog.commit()
    _wait(lambda: eventlog.durable >= first, "the first commit")
    shutil.rmtree(logdir)
    eventlog.append(1, LogKind.FRAME_IN, bytes([1, 0, 0, 0, 4, 0, 0, 0, 1]))
    lost = eventlog.commit()
    _wait(lambda: eventlog.lost >= lost, "the lost commit")
    assert eventlog.durable < lost and eventlog.failed and "was deleted" in eventlog.failed
    eventlog.append(1, LogKind.FRAME_IN, bytes([1, 0, 0, 0, 4, 0, 0, 0, 2]))  # dropped: still failed
    also_lost = eventlog.commit()
    _wait(lambda: eventlog.lost >= also_lost, "the second lost commit")
    assert eventlog.durable < also_lost
    eventlog.retry()
    _wait(lambda: eventlog.failed is None, "the resume")
    eventlog.forget_losses()
    eventlog.append(1, LogKind.FRAME_IN, bytes([1, 0, 0, 0, 4, 0, 0, 0, 3]))
    durable = eventlog.commit()
    _wait(lambda: eventlog.durable >= durable, "a durable commit after the resume")
    eventlog.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "testing" in errors[0].getMessage()
    assert sum("writing again" in r.getMessage() for r in caplog.records) == 1
    assert eventlog.stats.failures == 1 and eventlog.stats.resumes == 1
    (segment,) = _segments(logdir)
    _header, records, problems = _read(segment)
    assert problems == []
    assert records[0].kind == LogKind.CONN_SNAPSHOT and parse_record_data(records[0].kind, records[0].data)["name"] == "one"
    assert [r.data[-1] for r in records if r.kind == LogKind.FRAME_IN] == [3]


def test_retry_waits_for_free_space(tmp_path):
    """JETLOG.md 6.5: the log resumes only with resume_free bytes free on the file system."""
    import shutil

    from jetd.eventlog import EventLog

    logdir = tmp_path / "log"
    eventlog = EventLog(logdir, fsync="always", resume_free=1 << 62)
    eventlog.open()
    shutil.rmtree(logdir)
    seq = eventlog.commit()
    _wait(lambda: eventlog.lost >= seq, "the lost commit")
    eventlog.retry()
    seq = eventlog.commit()  # queued after the retry: done once the retry was tried
    _wait(lambda: eventlog.lost >= seq, "the commit after the retry")
    assert eventlog.failed is not None and eventlog.stats.resumes == 0
    assert _segments(logdir) == []  # the attempt's file is removed again
    eventlog.resume_free = 0
    eventlog.retry()
    _wait(lambda: eventlog.failed is None, "the resume")
    eventlog.close()
