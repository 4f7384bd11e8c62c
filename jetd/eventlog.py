"""jetd's event log: segment files in the format of spec/JETLOG.md, written off the hot path.

The daemon's loop encodes each record straight into one growing ``bytearray`` with
precompiled ``struct`` objects and ``zlib.crc32`` (:meth:`EventLog.append`, about half a
microsecond), and hands whole buffers to a writer thread when one reaches
``chunk_size`` bytes, at every :meth:`EventLog.flush` (the server calls it on its
periodic tick) and at every :meth:`EventLog.commit`. The writer thread only calls
``write`` and ``fsync``, which release the GIL, so it runs beside the loop instead of
competing with it for the interpreter; the loop also decides where segments end
(JETLOG.md 1, 4), so records, headers and snapshots reach the file in the order they
were stamped.

Group commit (JETLOG.md 6.1): :meth:`EventLog.commit` hands the buffer over with a
sequence number; the writer writes everything queued up to it, makes one ``fsync`` (with
``always``), sets :attr:`EventLog.durable` to it and calls :attr:`EventLog.signal` (the
server's thread-safe wake-up of its loop), which then sends the output held back for it.

The loop never waits for the writer. :attr:`EventLog.backlog` is the bytes encoded and not
yet written; the server stops reading from peers while it is above ``max_backlog``
(JETLOG.md 6.3) and sets :attr:`EventLog.notify_below` to be signalled when the writer has
brought it down. Records are never dropped, except after a write error (the log then
turns itself off, once, with an ERROR line).

Retention (JETLOG.md 6.4): with ``max_bytes`` or ``max_age``, the writer deletes the
oldest segments of the directory, never the one it writes, after each new segment and
once a second, logging each deletion.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional, Union

from jetwire.log import (
    RECORD_MARKER,
    Corruption,
    LogHeader,
    LogKind,
    LogReader,
    Truncation,
    conn_snapshot_data,
    encode_header,
    parse_record_data,
)

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_BACKLOG",
    "EventLog",
    "EventLogStats",
    "repair_segment",
]

log = logging.getLogger("jetd.eventlog")

DEFAULT_CHUNK_SIZE = 256 * 1024  # bytes of encoded records handed to the writer at once
DEFAULT_MAX_BACKLOG = 64 * 1024 * 1024  # JETLOG.md 6.3: bytes not yet written above which input pauses
FSYNC_INTERVAL = 1.0  # JETLOG.md 6.2: "interval" syncs at most a second after a write
RETENTION_INTERVAL = 1.0  # JETLOG.md 6.4: seconds between checks of max_bytes and max_age
SEGMENT_GLOB = "jet-*.jetlog"  # JETLOG.md 1

# JETLOG.md 3: the CRC covers the 4 length bytes and the body; the body starts with
# ts_ns:u64 | conn_id:u32 | kind:u8. _CRC_PART packs length and those 13 bytes so that
# one crc32 over it, continued over the data, is the record's CRC; _RECORD_HEAD packs
# the 23 bytes in front of the data: marker, length, crc, ts_ns, conn_id, kind.
_CRC_PART = struct.Struct(">IQIB")
_RECORD_HEAD = struct.Struct(">HIIQIB")
_CRC_PART_PACK = _CRC_PART.pack
_RECORD_HEAD_PACK = _RECORD_HEAD.pack
_MARKER = RECORD_MARKER
_FIXED_SIZE = 13
_time_ns = time.time_ns
_crc32 = zlib.crc32
_FRAME_IN = LogKind.FRAME_IN.value
_CONN_OPEN = LogKind.CONN_OPEN.value
_CONN_CLOSE = LogKind.CONN_CLOSE.value
_CONN_NAME = LogKind.CONN_NAME.value
_CONN_SNAPSHOT = LogKind.CONN_SNAPSHOT.value


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




@dataclass
class EventLogStats:
    """What the event log did, for the shutdown log line and benchmarks."""

    bytes: int = 0  # record and header bytes handed to the writer
    chunks: int = 0  # buffers handed to the writer
    segments: int = 0  # segments begun
    commits: int = 0  # group commits asked for by the loop (JETLOG.md 6.1)
    syncs: int = 0  # fsyncs made by the writer
    peak_backlog: int = 0  # most bytes handed over and not yet written, seen at a hand-over
    deleted_segments: int = 0  # segments deleted by retention (JETLOG.md 6.4)
    deleted_bytes: int = 0
    dropped_bytes: int = 0  # bytes discarded after a write error turned the log off

    def summary(self) -> str:
        """One log line: ``name=value`` for every counter."""
        return " ".join(f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value}" for name, value in vars(self).items())


class EventLog:
    """Encodes records on the loop thread; a writer thread writes and syncs them.

    Every method except the writer thread's own is meant for the loop thread (the one
    that calls :meth:`append`).

    Args:
        directory: the log directory (created if missing).
        name: the daemon's name, written in every segment header.
        fsync: ``always``, ``interval`` or ``never`` (JETLOG.md 6).
        rotate_size: a segment that reaches this many bytes is closed and a new one
            begun before the next record.
        chunk_size: bytes of encoded records that make the loop hand its buffer to the
            writer without waiting for :meth:`flush`.
        max_backlog: the backlog (bytes encoded, not yet written) above which
            :attr:`over_backlog` is true: the caller stops producing records (the server
            pauses input, JETLOG.md 6.3). The log itself never blocks nor drops.
        max_bytes: delete the oldest segments while the directory's segments total more
            (JETLOG.md 6.4); 0: no limit.
        max_age: delete segments last written more than this many seconds ago; 0: no limit.

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
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        max_backlog: int = DEFAULT_MAX_BACKLOG,
        max_bytes: int = 0,
        max_age: float = 0.0,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.fsync = fsync
        self.rotate_size = rotate_size
        self.chunk_size = chunk_size
        self.max_backlog = max_backlog
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.started = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.segment = -1
        self.path: Optional[Path] = None
        self.failed: Optional[str] = None
        self.stats = EventLogStats()
        # The IO layer sets this to the time of a read while the core handles it, and 0
        # after: the frames of one read were all received then, so their FRAME_IN
        # records share one clock reading. Records the daemon sends are stamped when
        # made (a request answered within the read is still seen to take time).
        self.turn_ns = 0
        # Loop side: the buffer being filled, the len(_buf) at which append hands it
        # over (or rotates), bytes of the current segment already handed over.
        self._buf = bytearray()
        self._limit = 0
        self._segment_size = 0
        self._last_ts = 0
        self._open_conns: dict[int, list[str]] = {}  # conn_id -> [address, name]
        # Between the threads: (path of a segment to begin first, or None; bytes; the
        # commit sequence number this item completes, or 0).
        self._queue: deque[tuple[Optional[Path], Union[bytes, bytearray], int]] = deque()
        self._queued = 0  # bytes in _queue, under _lock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self._commit_seq = 0  # loop side: the last commit handed over
        # Written by the writer thread, read by the loop (plain int stores are atomic).
        self.durable = 0  # the last commit whose records are written (and synced with always)
        # Called from the writer thread after a commit, and when the backlog drops to
        # notify_below (which it then resets to -1); set by the server.
        self.signal: Optional[Callable[[], None]] = None
        self.notify_below = -1
        # Writer side.
        self._file: Optional[BinaryIO] = None
        self._file_path: Optional[Path] = None
        self._unsynced = False
        self._last_sync = 0.0
        self._last_retention = 0.0

    # --- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Repair the newest old segment if needed, start segment 0 and the writer thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        old = sorted(self.directory.glob(SEGMENT_GLOB))
        if old:
            cut = repair_segment(old[-1])
            if cut is not None:
                log.warning("event log %s ended in a damaged or truncated record at offset %d; cut it there", old[-1], cut.offset)
        path, data = self._begin_segment()
        self._file = open(path, "xb")  # noqa: SIM115 - lives until rotation or close
        self._file_path = path
        self._file.write(data)
        self._file.flush()
        if self.fsync == "always":
            os.fsync(self._file.fileno())
            self._sync_directory()
        self._last_sync = time.monotonic()
        self._retain()
        self._set_limit()
        self._thread = threading.Thread(target=self._run, name="jetd-eventlog", daemon=True)
        self._thread.start()

    def flush(self) -> None:
        """Hand the records encoded so far to the writer (the server calls this on its
        periodic tick, so that a quiet daemon's records reach the file soon)."""
        if self._buf:
            self._hand_over_buffer()
            self._set_limit()

    def commit(self) -> int:
        """Hand the records encoded so far to the writer as one group commit (JETLOG.md
        6.1). Returns its sequence number: once :attr:`durable` reaches it, every record
        appended before this call is written, and fsynced with ``always``."""
        self._commit_seq += 1
        self.stats.commits += 1
        buf = self._buf
        if buf:
            self._buf = bytearray()
            self._segment_size += len(buf)
            self._set_limit()
            self._hand_over(None, buf, self._commit_seq)
        else:
            self._hand_over(None, b"", self._commit_seq)
        return self._commit_seq

    @property
    def pending(self) -> bool:
        """True if records were appended since the last hand-over."""
        return bool(self._buf)

    @property
    def appended(self) -> int:
        """Bytes of records and headers encoded since :meth:`open` (a running total)."""
        return self.stats.bytes + len(self._buf)

    @property
    def backlog(self) -> int:
        """Bytes encoded and not yet written: the loop's buffer and the writer's queue."""
        return len(self._buf) + self._queued

    @property
    def over_backlog(self) -> bool:
        """True while :attr:`backlog` is above ``max_backlog`` (JETLOG.md 6.3)."""
        return len(self._buf) + self._queued > self.max_backlog

    def close(self) -> None:
        """Write everything encoded, sync, close the segment and log the counters."""
        if self._thread is None:
            return
        self.flush()
        self._stop = True
        self.signal = None
        self._wake.set()
        self._thread.join()
        self._thread = None
        if self._file is not None:
            try:
                self._sync()
                self._file.close()
            except OSError as exc:
                self._fail(exc)
            self._file = None
        log.info("event log closed: %s", self.stats.summary())

    # --- the hot path ----------------------------------------------------------------------

    def append(self, conn_id: int, kind: int, data: bytes) -> None:
        """Encode one record (JETLOG.md 3) at the end of the buffer, stamped now (a
        FRAME_IN: with :attr:`turn_ns`, when the IO layer set it)."""
        buf = self._buf
        if len(buf) >= self._limit:
            buf = self._spill()
        ts = self.turn_ns if kind == _FRAME_IN else 0
        if not ts:
            ts = _time_ns()
        if ts < self._last_ts:
            ts = self._last_ts  # JETLOG.md 3: ts_ns never decreases within a segment
        self._last_ts = ts
        length = _FIXED_SIZE + len(data)
        buf += _RECORD_HEAD_PACK(_MARKER, length, _crc32(data, _crc32(_CRC_PART_PACK(length, ts, conn_id, kind))), ts, conn_id, kind)
        buf += data
        if _CONN_OPEN <= kind <= _CONN_NAME:
            self._track(conn_id, kind, data)

    # --- the loop's side of the hand-over --------------------------------------------------

    def _set_limit(self) -> None:
        self._limit = max(0, min(self.chunk_size, self.rotate_size - self._segment_size))

    def _spill(self) -> bytearray:
        """The buffer is full or the segment is: hand it over, and begin the next
        segment if this one reached the rotation size. Returns the new buffer."""
        if self._buf:
            self._hand_over_buffer()
        if self._segment_size >= self.rotate_size:
            path, data = self._begin_segment()
            self._hand_over(path, data)
            self._segment_size = len(data)
        self._set_limit()
        return self._buf

    def _hand_over_buffer(self) -> None:
        buf = self._buf
        self._buf = bytearray()
        self._segment_size += len(buf)
        self._hand_over(None, buf)

    def _hand_over(self, path: Optional[Path], data: Union[bytes, bytearray], commit: int = 0) -> None:
        """Queue ``data`` for the writer (never waits: JETLOG.md 6.3)."""
        size = len(data)
        if self.failed:
            self.stats.dropped_bytes += size
            if not commit:
                return
            data, size = b"", 0  # the commit still goes through: held output must not wait forever
        with self._lock:
            self._queued += size
            queued = self._queued
            self._queue.append((path, data, commit))
        if queued > self.stats.peak_backlog:
            self.stats.peak_backlog = queued
        self.stats.bytes += size
        self.stats.chunks += 1
        self._wake.set()

    def _begin_segment(self) -> tuple[Path, bytes]:
        """Name the next segment and encode its header and, after the first, one
        CONN_SNAPSHOT per open connection (JETLOG.md 4: each segment can be read alone)."""
        self.segment += 1
        self.stats.segments += 1
        self.path = path = self.directory / f"jet-{self.started}-{os.getpid()}-{self.segment:06d}.jetlog"
        now = _time_ns()
        if self.segment == 0:
            self.run_ns = now  # JETLOG.md 2: the run is named by its first segment's created_ns
        parts = [encode_header(LogHeader(self.name, now, self.segment, run_ns=self.run_ns))]
        if self.segment > 0:
            ts = self._last_ts = max(now, self._last_ts)
            for conn_id, (address, name) in sorted(self._open_conns.items()):
                data = conn_snapshot_data(address, name)
                length = _FIXED_SIZE + len(data)
                crc = _crc32(data, _crc32(_CRC_PART_PACK(length, ts, conn_id, _CONN_SNAPSHOT)))
                parts.append(_RECORD_HEAD_PACK(_MARKER, length, crc, ts, conn_id, _CONN_SNAPSHOT) + data)
        return path, b"".join(parts)

    def _track(self, conn_id: int, kind: int, data: bytes) -> None:
        """Follow which connections are open, for the snapshots of the next segment."""
        try:
            if kind == _CONN_OPEN:
                self._open_conns[conn_id] = [str(parse_record_data(kind, data)["address"]), ""]
            elif kind == _CONN_NAME:
                if conn_id in self._open_conns:
                    self._open_conns[conn_id][1] = str(parse_record_data(kind, data)["name"])
            else:
                self._open_conns.pop(conn_id, None)
        except Exception:  # our own records; a failure here must not stop the log
            log.exception("event log: cannot track connection record")

    # --- the writer thread -----------------------------------------------------------------

    def _run(self) -> None:
        interval = self.fsync == "interval"
        always = self.fsync == "always"
        retention = bool(self.max_bytes or self.max_age)
        timeout = FSYNC_INTERVAL if interval or retention else None
        queue = self._queue
        lock = self._lock
        while True:
            self._wake.wait(timeout)
            self._wake.clear()
            commit = 0
            # Everything queued is written before the one fsync that covers it: commits
            # handed over while the previous fsync ran share the next (group commit).
            while queue:
                path, data, seq = queue[0]
                if path is not None:
                    self._begin(path)
                if data:
                    self._write(data)
                with lock:
                    queue.popleft()
                    self._queued -= len(data)
                    queued = self._queued
                if seq:
                    commit = seq
                below = self.notify_below
                if below >= 0 and queued <= below:
                    self.notify_below = -1
                    self._signal()
            if commit:
                if always and self._unsynced and not self.failed:
                    self._try_sync()
                self.durable = commit
                self._signal()
            now = time.monotonic()
            if interval and self._unsynced and now - self._last_sync >= FSYNC_INTERVAL:
                self._try_sync()
            if retention and now - self._last_retention >= RETENTION_INTERVAL:
                self._retain()
            if self._stop and not queue:
                return

    def _signal(self) -> None:
        signal = self.signal
        if signal is not None:
            try:
                signal()
            except Exception:  # the loop is gone (shutdown): nobody waits any more
                log.debug("event log: cannot wake the loop", exc_info=True)

    def _begin(self, path: Path) -> None:
        """Close the current segment (synced) and create the next one."""
        if self.failed:
            return
        try:
            if self._file is not None:
                self._sync()
                self._file.close()
                self._file = None
            self._file = open(path, "xb")  # noqa: SIM115 - lives until rotation or close
            self._file_path = path
            if self.fsync == "always":
                self._sync_directory()  # JETLOG.md 6.1: the new file itself survives an OS crash
        except OSError as exc:
            self._fail(exc)
            return
        self._retain()

    def _write(self, data: Union[bytes, bytearray]) -> None:
        """Write one handed-over buffer (``write`` and ``fsync`` release the GIL)."""
        if self.failed:
            self.stats.dropped_bytes += len(data)
            return
        try:
            assert self._file is not None
            self._file.write(data)
            self._file.flush()
            self._unsynced = True
            if self.fsync == "interval" and time.monotonic() - self._last_sync >= FSYNC_INTERVAL:
                self._sync()
        except OSError as exc:
            self._fail(exc)

    def _sync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _retain(self) -> None:
        """JETLOG.md 6.4: delete the oldest segments, never the current one, while the
        directory's segments total more than ``max_bytes``, and those last written more
        than ``max_age`` seconds ago; log each deletion."""
        self._last_retention = time.monotonic()
        if not (self.max_bytes or self.max_age):
            return
        found: list[tuple[Path, int, float]] = []
        try:
            paths = sorted(self.directory.glob(SEGMENT_GLOB))
        except OSError as exc:
            log.warning("event log: cannot list %s for retention: %s", self.directory, exc.strerror or exc)
            return
        for path in paths:
            try:
                st = path.stat()
            except OSError:
                continue  # deleted meanwhile
            found.append((path, st.st_size, st.st_mtime))
        total = sum(size for _, size, _ in found)
        now = time.time()
        for path, size, mtime in found:
            if path == self._file_path:
                continue
            if self.max_bytes and total > self.max_bytes:
                reason = f"the log directory holds {total} bytes, above log_max_bytes {self.max_bytes}"
            elif self.max_age and now - mtime > self.max_age:
                reason = f"last written {now - mtime:.1f} s ago, above log_max_age {self.max_age:g} s"
            else:
                continue
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.warning("event log: cannot delete %s: %s", path, exc.strerror or exc)
                continue
            total -= size
            self.stats.deleted_segments += 1
            self.stats.deleted_bytes += size
            log.info("event log: deleted %s (%d bytes): %s", path, size, reason)

    def _try_sync(self) -> None:
        try:
            self._sync()
        except OSError as exc:
            self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.failed = f"{exc.strerror or exc}"
        log.error("event log %s: write failed (%s); the event log is off from here", self.path, self.failed)

    def _sync(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self.fsync != "never":
            os.fsync(self._file.fileno())
            self.stats.syncs += 1
        self._unsynced = False
        self._last_sync = time.monotonic()

