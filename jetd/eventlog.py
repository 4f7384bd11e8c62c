"""jetd's event log: segment files in the format of spec/JETLOG.md, written off the hot path.

The daemon's loop only appends ``(ts_ns, conn_id, kind, data)`` tuples to a list
(:meth:`EventLog.append`); a writer thread swaps the list out, encodes the records with
:mod:`jetwire.log`, writes them, rotates segments and syncs per the fsync policy
(JETLOG.md 6). If the writer falls behind by more than ``max_backlog`` bytes the loop
writes the backlog itself, which slows the daemon down rather than losing records or
growing without bound.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import BinaryIO, Optional, Union

from jetwire.log import (
    Corruption,
    LogHeader,
    LogKind,
    LogReader,
    Truncation,
    conn_snapshot_data,
    encode_header,
    encode_record,
    parse_record_data,
)

__all__ = ["DEFAULT_FLUSH_INTERVAL", "DEFAULT_MAX_BACKLOG", "EventLog", "repair_segment"]

log = logging.getLogger("jetd.eventlog")

DEFAULT_FLUSH_INTERVAL = 0.05  # seconds between writer passes when the loop is quiet
DEFAULT_MAX_BACKLOG = 64 * 1024 * 1024  # bytes of record data queued before the loop helps
FSYNC_INTERVAL = 1.0  # JETLOG.md 6: "interval" syncs at most once a second

Record = tuple[int, int, int, bytes]


def repair_segment(path: Path) -> Optional[Union[Truncation, Corruption]]:
    """JETLOG.md 5: cut a segment that ends inside a record back to its last complete
    record. Damage that runs to the end of the file is cut the same way (nothing valid
    follows it). Returns what was cut, or None if the file ended cleanly.

    Raises:
        OSError: if the file cannot be read or truncated.
    """
    reader = LogReader()
    with open(path, "rb") as stream:
        while chunk := stream.read(1 << 20):
            reader.feed(chunk)
            for _ in reader.items():
                pass
    try:
        tail = reader.finish()
    except Exception as exc:  # a header that never completed: nothing valid at all
        log.warning("event log %s has no complete header (%s); leaving it alone", path, exc)
        return None
    if tail is None:
        return None
    size = path.stat().st_size
    if isinstance(tail, Corruption) and tail.offset + tail.length != size:
        return None  # damage in the middle: readers skip it; we never rewrite history
    with open(path, "r+b") as stream:
        stream.truncate(tail.offset)
    return tail


class EventLog:
    """Appends records to segment files in ``directory`` from a writer thread.

    Args:
        directory: the log directory (created if missing).
        name: the daemon's name, written in every segment header.
        fsync: ``always``, ``interval`` or ``never`` (JETLOG.md 6).
        rotate_size: a segment that reaches this many bytes is closed and a new one begun.
        flush_interval: seconds between writer passes.
        max_backlog: bytes of queued record data above which :meth:`append` writes the
            backlog itself.

    Raises:
        OSError: from :meth:`open` if the directory or first segment cannot be created.
    """

    def __init__(
        self,
        directory: Union[str, Path],
        *,
        name: str = "jetd",
        fsync: str = "interval",
        rotate_size: int = 64 * 1024 * 1024,
        flush_interval: float = DEFAULT_FLUSH_INTERVAL,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.fsync = fsync
        self.rotate_size = rotate_size
        self.flush_interval = flush_interval
        self.max_backlog = max_backlog
        self.started = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.segment = -1
        self.path: Optional[Path] = None
        self.failed: Optional[str] = None
        self._records: deque[Record] = deque()  # append/popleft are thread-safe
        self._backlog = 0
        self._file: Optional[BinaryIO] = None
        self._size = 0
        self._last_ts = 0
        self._last_sync = 0.0
        self._open_conns: dict[int, list[str]] = {}  # conn_id -> [address, name]
        self._write_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    # --- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Repair the newest old segment if needed, start segment 0 and the writer thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        old = sorted(self.directory.glob("jet-*.jetlog"))
        if old:
            cut = repair_segment(old[-1])
            if cut is not None:
                log.warning("event log %s ended in a damaged or truncated record at offset %d; cut it there", old[-1], cut.offset)
        self._start_segment()
        self._thread = threading.Thread(target=self._run, name="jetd-eventlog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write everything queued, sync, and close the segment."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._write_lock:
            self._write_pending()
            if self._file is not None:
                self._sync()
                self._file.close()
                self._file = None

    # --- the hot path ----------------------------------------------------------------------

    def append(self, conn_id: int, kind: int, data: bytes) -> None:
        """Queue one record (JETLOG.md 3), stamped now."""
        self._records.append((time.time_ns(), conn_id, kind, data))
        self._backlog += len(data)
        if self._backlog > self.max_backlog:
            # The writer fell behind: write here rather than grow without bound.
            with self._write_lock:
                self._write_pending()

    # --- the writer ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            with self._write_lock:
                self._write_pending()

    def _start_segment(self) -> None:
        if self._file is not None:
            self._sync()
            self._file.close()
        self.segment += 1
        self.path = self.directory / f"jet-{self.started}-{os.getpid()}-{self.segment:06d}.jetlog"
        self._file = open(self.path, "xb")  # noqa: SIM115 - lives until rotation or close
        now = time.time_ns()
        header = encode_header(LogHeader(self.name, now, self.segment))
        parts = [header]
        if self.segment > 0:
            # JETLOG.md 4: each segment can be read alone.
            ts = max(now, self._last_ts)
            for conn_id, (address, name) in sorted(self._open_conns.items()):
                parts.append(encode_record(ts, conn_id, LogKind.CONN_SNAPSHOT, conn_snapshot_data(address, name)))
        data = b"".join(parts)
        self._file.write(data)
        self._size = len(data)

    def _track(self, conn_id: int, kind: int, data: bytes) -> None:
        """Follow which connections are open, for the snapshots of the next segment."""
        try:
            if kind == LogKind.CONN_OPEN:
                self._open_conns[conn_id] = [str(parse_record_data(kind, data)["address"]), ""]
            elif kind == LogKind.CONN_NAME and conn_id in self._open_conns:
                self._open_conns[conn_id][1] = str(parse_record_data(kind, data)["name"])
            elif kind == LogKind.CONN_CLOSE:
                self._open_conns.pop(conn_id, None)
        except Exception:  # our own records; a failure here must not stop the log
            log.exception("event log: cannot track connection record")

    def _write_pending(self) -> None:
        """Encode and write the queued records (caller holds ``_write_lock``)."""
        queue = self._records
        records = [queue.popleft() for _ in range(len(queue))]
        self._backlog = 0
        if not records or self._file is None or self.failed:
            return
        try:
            parts: list[bytes] = []
            size = self._size
            last = self._last_ts
            for ts, conn_id, kind, data in records:
                if ts < last:
                    ts = last  # JETLOG.md 3: ts_ns never decreases within a segment
                last = ts
                self._last_ts = ts
                if size >= self.rotate_size:
                    self._file.write(b"".join(parts))
                    parts = []
                    self._start_segment()
                    size = self._size
                record = encode_record(ts, conn_id, kind, data)
                parts.append(record)
                size += len(record)
                if kind in (LogKind.CONN_OPEN, LogKind.CONN_NAME, LogKind.CONN_CLOSE):
                    self._track(conn_id, kind, data)
            self._file.write(b"".join(parts))
            self._size = size
            self._file.flush()
            if self.fsync == "always" or (
                self.fsync == "interval" and time.monotonic() - self._last_sync >= FSYNC_INTERVAL
            ):
                self._sync()
        except OSError as exc:
            self.failed = f"{exc.strerror or exc}"
            log.error("event log %s: write failed (%s); the event log is off from here", self.path, self.failed)

    def _sync(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self.fsync != "never":
            os.fsync(self._file.fileno())
        self._last_sync = time.monotonic()
