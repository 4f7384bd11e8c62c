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
brought it down. Records are never dropped, except while the log cannot be written.

Write errors (JETLOG.md 6.5): a failed write, create or fsync, or a segment whose file
was deleted, puts the log in :attr:`EventLog.failed` with one ERROR line; a group commit
that covered records lost so is reported in :attr:`EventLog.lost` instead of
:attr:`EventLog.durable`. From then on records are dropped until the loop's
:meth:`EventLog.retry` (the server calls it every ``RETRY_INTERVAL`` seconds) succeeds in
beginning a new segment, which is logged too. What the daemon does meanwhile is the
server's business (``--log-on-error``).

Retention (JETLOG.md 6.4): with ``max_bytes`` or ``max_age``, the writer deletes the
oldest segments of the directory, never the one it writes, after each new segment and
once a second, logging each deletion.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import logging
import os
import struct
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import BinaryIO
from typing import Optional
from typing import Union

from jetwire.log import RECORD_MARKER
from jetwire.log import Corruption
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import LogReader
from jetwire.log import Truncation
from jetwire.log import conn_snapshot_data
from jetwire.log import encode_header
from jetwire.log import parse_record_data

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_MAX_BACKLOG",
    "EventLog",
    "EventLogStats",
    "auto_max_bytes",
    "repair_segment",
]

log = logging.getLogger("jetd.eventlog")

DEFAULT_CHUNK_SIZE = 256 * 1024  # bytes of encoded records handed to the writer at once
DEFAULT_MAX_BACKLOG = 64 * 1024 * 1024  # JETLOG.md 6.3: bytes not yet written above which input pauses
FSYNC_INTERVAL = 1.0  # JETLOG.md 6.2: "interval" syncs at most a second after a write
# Upper bounds (seconds) of the fsync-time histogram (issue 33: /metrics, $jet/daemon).
FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RETENTION_INTERVAL = 1.0  # JETLOG.md 6.4: seconds between checks of max_bytes and max_age
SEGMENT_GLOB = "jet-*.jetlog"  # JETLOG.md 1
RETRY_INTERVAL = 2.0  # JETLOG.md 6.5: seconds between attempts to write again after an error
# JETLOG.md 6.5: free bytes the log's file system must have before writing resumes, so
# that a disk freed by a few KiB does not start and stop the log every retry.
DEFAULT_RESUME_FREE = 1024 * 1024
# JETLOG.md 6.4: without --log-max-bytes, the log keeps at most this fraction of the
# space free at start (plus the segments already there), and at least one segment.
AUTO_MAX_BYTES_FRACTION = 0.5

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




def auto_max_bytes(directory: Path, rotate_size: int) -> int:
    """JETLOG.md 6.4: the default ``log_max_bytes`` for ``directory`` (which must exist):
    the segments already there plus half the space free on its file system now, at least
    ``rotate_size``.

    Raises:
        OSError: if the file system cannot be asked.
    """
    st = os.statvfs(directory)
    free = st.f_bavail * st.f_frsize
    held = 0
    for path in directory.glob(SEGMENT_GLOB):
        with contextlib.suppress(OSError):
            held += path.stat().st_size
    return max(rotate_size, held + int(free * AUTO_MAX_BYTES_FRACTION))


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
    dropped_bytes: int = 0  # bytes discarded while the log could not be written (JETLOG.md 6.5)
    failures: int = 0  # times the log stopped on an error (JETLOG.md 6.5)
    resumes: int = 0  # times it began writing again
    # Issue 33: the writer's group-commit fsyncs by duration (upper bounds FSYNC_BUCKETS,
    # the last: above them all) and their total. Written by the writer thread only.
    sync_seconds: float = 0.0
    sync_buckets: list[int] = field(default_factory=lambda: [0] * (len(FSYNC_BUCKETS) + 1))

    def summary(self) -> str:
        """One log line: ``name=value`` for every counter."""
        return " ".join(f"{name}={value:.3f}" if isinstance(value, float) else f"{name}={value}"
                        for name, value in vars(self).items() if not isinstance(value, list))


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
            (JETLOG.md 6.4); 0: no limit; None: :func:`auto_max_bytes` at :meth:`open`.
        max_age: delete segments last written more than this many seconds ago; 0: no limit.
        resume_free: free bytes the file system must have for writing to resume after an
            error (JETLOG.md 6.5).
        on_error: what the daemon does while the log cannot be written, for the ERROR line.

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
        max_bytes: Optional[int] = 0,
        max_age: float = 0.0,
        resume_free: int = DEFAULT_RESUME_FREE,
        on_error: str = "",
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.fsync = fsync
        self.rotate_size = rotate_size
        self.chunk_size = chunk_size
        self.max_backlog = max_backlog
        self.max_bytes = max_bytes or 0
        self._auto_max_bytes = max_bytes is None
        self.max_age = max_age
        self.resume_free = resume_free
        self.on_error = on_error
        self.started = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self.segment = -1
        self.path: Optional[Path] = None
        # JETLOG.md 6.5, set by the writer thread: why the log cannot be written, or None.
        self.failed: Optional[str] = None
        self._failed_at = 0.0
        self._dropped_at_failure = 0
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
        self._dropped = False  # loop side: records dropped since the last commit
        # Written by the writer thread, read by the loop (plain int stores are atomic).
        self.durable = 0  # the last commit whose records are written (and synced with always)
        self.lost = 0  # the last commit some of whose records were lost to a write error
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
        self._batch_lost = False  # records of the coming commit were dropped or failed

    # --- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Repair the newest old segment if needed, start segment 0 and the writer thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._auto_max_bytes:
            self.max_bytes = auto_max_bytes(self.directory, self.rotate_size)
            log.info("event log: keeping at most %d bytes in %s (half the free space at start; --log-max-bytes)", self.max_bytes, self.directory)
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

    def retry(self) -> None:
        """While :attr:`failed`: drop what the loop holds and queue the beginning of a new
        segment, which the writer tries to create; if it can, the log resumes with it
        (JETLOG.md 6.5). The server calls this every ``RETRY_INTERVAL`` seconds."""
        if not self.failed or self._thread is None:
            return
        self.flush()
        path, data = self._begin_segment()
        self._hand_over(path, data)
        self._segment_size = len(data)
        self._set_limit()

    def forget_losses(self) -> None:
        """The server saw the log resume: the next commit covers only what follows."""
        self._dropped = False

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
        if self.failed and path is None:  # a new segment goes through: it is how the log resumes
            self.stats.dropped_bytes += size
            self._dropped = True
            if not commit:
                return
            data, size = b"", 0  # the commit still goes through: held output must not wait forever
        if commit and self._dropped:
            commit = -commit  # the writer reports it lost, whatever happens to the rest
            self._dropped = False
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
        # Once a second at least: retention, and the check that the segment still exists.
        timeout = FSYNC_INTERVAL
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
                if path is not None and self.failed:
                    self._recover(path, data)  # JETLOG.md 6.5: its header is the test write
                else:
                    if path is not None:
                        self._begin(path)
                    if data:
                        self._write(data)
                with lock:
                    queue.popleft()
                    self._queued -= len(data)
                    queued = self._queued
                if seq < 0:
                    self._batch_lost = True  # the loop dropped some of its records
                    seq = -seq
                if seq:
                    commit = seq
                below = self.notify_below
                if below >= 0 and queued <= below:
                    self.notify_below = -1
                    self._signal()
            if commit:
                if always and not self.failed:
                    self._check_linked()
                    if self._unsynced:
                        self._try_sync()
                if self.failed or self._batch_lost:
                    self.lost = commit  # JETLOG.md 6.5: never reported durable
                else:
                    self.durable = commit
                self._batch_lost = False
                self._signal()
            now = time.monotonic()
            if interval and self._unsynced and now - self._last_sync >= FSYNC_INTERVAL:
                self._try_sync()
            if now - self._last_retention >= RETENTION_INTERVAL:
                if not self.failed:
                    self._check_linked()
                if retention:
                    self._retain()
                else:
                    self._last_retention = now
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
        if self.failed or self._file is None:
            self.stats.dropped_bytes += len(data)
            self._batch_lost = True
            return
        try:
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

    def _check_linked(self) -> None:
        """JETLOG.md 6.5: a segment whose file was deleted (its directory removed) still
        takes writes and fsyncs, into a file nobody can read: that is a failure too."""
        if self._file is None:
            return
        try:
            linked = os.fstat(self._file.fileno()).st_nlink > 0
        except OSError as exc:
            self._fail(exc)
            return
        if not linked:
            self._fail(OSError(errno.ENOENT, f"segment {self._file_path} was deleted"))

    def _fail(self, exc: OSError) -> None:
        """Stop writing (once per outage, with one ERROR line) and wake the loop."""
        self._batch_lost = True
        if self.failed:
            return
        self.failed = f"{exc.strerror or exc}"
        self._failed_at = time.monotonic()
        self._dropped_at_failure = self.stats.dropped_bytes
        self.stats.failures += 1
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()  # what its buffer still holds is lost with the rest
            self._file = None
        self._unsynced = False
        log.error(
            "event log %s: cannot write (%s); retrying every %g s%s",
            self.path,
            self.failed,
            RETRY_INTERVAL,
            f"; meanwhile {self.on_error}" if self.on_error else "",
        )
        self._signal()

    def _recover(self, path: Path, data: Union[bytes, bytearray]) -> None:
        """JETLOG.md 6.5: create ``path`` (the directory too, if it was removed), write
        its header and sync it; on success the log writes again, into it."""
        stream: Optional[BinaryIO] = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            st = os.statvfs(self.directory)
            free = st.f_bavail * st.f_frsize
            if free < self.resume_free:
                raise OSError(errno.ENOSPC, f"{free} bytes free, {self.resume_free} needed to resume")
            stream = open(path, "xb")  # noqa: SIM115 - lives until rotation or close
            stream.write(data)
            stream.flush()
            if self.fsync != "never":
                os.fsync(stream.fileno())
                self._sync_directory()
        except OSError as exc:
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
                with contextlib.suppress(OSError):
                    path.unlink()
            log.debug("event log: still cannot write: %s", exc.strerror or exc)
            return
        self._file = stream
        self._file_path = path
        self._unsynced = False
        self._last_sync = time.monotonic()
        self.failed = None
        self.stats.resumes += 1
        log.warning(
            "event log: writing again, into %s, after %.1f s (%d bytes of records lost meanwhile)",
            path,
            time.monotonic() - self._failed_at,
            self.stats.dropped_bytes - self._dropped_at_failure,
        )
        self._signal()

    def _sync(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        if self.fsync != "never":
            began = time.monotonic()
            os.fsync(self._file.fileno())
            self.stats.syncs += 1
            # Issue 33 (/metrics, $jet/daemon): how long it took, in FSYNC_BUCKETS.
            took = time.monotonic() - began
            self.stats.sync_seconds += took
            self.stats.sync_buckets[bisect.bisect_left(FSYNC_BUCKETS, took)] += 1
        self._unsynced = False
        self._last_sync = time.monotonic()

