"""Vectorised parsing of jet event-log segments (spec/JETLOG.md) into Arrow record batches.

No JVM here: this module is what the Spark ``jetlog`` data source runs inside its Python
workers, and what the JVM-free tests exercise directly.

How a segment is read:

1. :func:`scan_records` walks the record chain (JETLOG.md 3) from a start offset. It is
   the one per-record Python loop: records are back to back and each one's ``length``
   says where the next begins, so locating them is inherently sequential. It checks the
   marker, the length bounds and the CRC, and on damage resynchronises per JETLOG.md 5.
2. :func:`parse_batch` gathers every fixed-position field of all located records at
   once with numpy fancy indexing over the file's bytes (``ts_ns``, ``conn_id``,
   ``kind``, frame type, ids, codes, str16 lengths, value headers), validates the frame
   layouts of PROTOCOL.md 4-7 with vector masks, copies variable-length fields (keys,
   values, messages) with one gather each, and builds pyarrow arrays from the buffers.
"""

from __future__ import annotations

import bisect
import functools
import gzip
import mmap
import os
import struct
import zlib
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from enum import IntEnum
from typing import Final
from typing import NamedTuple
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jetwire.codes import EventCode
from jetwire.codes import FrameType
from jetwire.codes import Function
from jetwire.codes import Status
from jetwire.codes import ValueType
from jetwire.errors import RemoteProtocolError
from jetwire.log import DEFAULT_MAX_RECORD
from jetwire.log import RECORD_MARKER
from jetwire.log import LogHeaderIncomplete
from jetwire.log import LogKind
from jetwire.log import decode_header

from .chain import CRC_TABLE
from .chain import FIXED_SIZE as _FIXED_SIZE
from .chain import HEAD as _HEAD  # JETLOG.md 3: marker | length | crc
from .chain import HEAD_SIZE as _HEAD_SIZE
from .chain import NATIVE
from .chain import walk

__all__ = [
    "ARROW_SCHEMA",
    "CORRUPT",
    "FRAMES_SCHEMA",
    "MODES",
    "SOURCE_SCHEMA",
    "SPARK_SCHEMA",
    "TRUNCATED",
    "JetlogError",
    "PlannedSegment",
    "ScanResult",
    "SegmentChanged",
    "SegmentHeader",
    "SegmentIdentity",
    "batch_rows",
    "check_segment",
    "find_boundary",
    "infer_runs",
    "open_segment",
    "parse_batch",
    "plan_segment",
    "read_file_header",
    "read_header",
    "read_segment",
    "resume_offset",
    "scan_records",
    "time_range",
]

MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
# ``kind`` of the rows that are not records (JETLOG.md 5), beside the record kinds.
CORRUPT = "CORRUPT"  # a damaged region, or a bad segment header (the whole file)
TRUNCATED = "TRUNCATED"  # the file ends inside this record

# The fixed schema of the `jetlog` source; docs/README of tools.ingest explains each column.
SPARK_SCHEMA = (
    "file string not null, offset long not null, daemon string, segment long, ts_ns long, ts timestamp, "
    "conn_id long, peer_name string, kind string not null, direction string, msg_type string, "
    "request_id long, function string, status string, fetch_id long, key string, "
    "value_type string, value binary, value_text string, text string, address string, "
    "route_requester_conn long, route_requester_id long, route_owner_conn long, "
    "route_owner_id long, size long not null, frame_error string, corrupt string, run_ns long"
)

_TS = pa.timestamp("us", tz="UTC")  # what Spark expects for TimestampType (NOTES.md: no implicit casts)
ARROW_SCHEMA = pa.schema(
    [
        pa.field("file", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        ("daemon", pa.string()),
        ("segment", pa.int64()),
        ("ts_ns", pa.int64()),
        ("ts", _TS),
        ("conn_id", pa.int64()),
        ("peer_name", pa.string()),
        pa.field("kind", pa.string(), nullable=False),
        ("direction", pa.string()),
        ("msg_type", pa.string()),
        ("request_id", pa.int64()),
        ("function", pa.string()),
        ("status", pa.string()),
        ("fetch_id", pa.int64()),
        ("key", pa.string()),
        ("value_type", pa.string()),
        ("value", pa.binary()),
        ("value_text", pa.string()),
        ("text", pa.string()),
        ("address", pa.string()),
        ("route_requester_conn", pa.int64()),
        ("route_requester_id", pa.int64()),
        ("route_owner_conn", pa.int64()),
        ("route_owner_id", pa.int64()),
        pa.field("size", pa.int64(), nullable=False),
        ("frame_error", pa.string()),
        ("corrupt", pa.string()),
    ]
)
# The frames table: the rows above and the run they belong to (tools.ingest.pipeline).
FRAMES_SCHEMA = ARROW_SCHEMA.append(pa.field("run_ns", pa.int64()))
# What the ``jetlog`` source yields: the records plus the daemon run (JETLOG.md 2), which
# with ``conn_id`` identifies a connection across restarts.
SOURCE_SCHEMA = ARROW_SCHEMA.append(pa.field("run_ns", pa.int64()))

_LEN = struct.Struct(">I")
_MARKER_BYTES = struct.pack(">H", RECORD_MARKER)

# Spark converts a batch while the worker parses the next: batches of 32k rows kept
# both busier than 128k in a count() (BENCHMARKS.md, tenth session). Parsing costs the
# same per row from about 32k rows up.
DEFAULT_BATCH_ROWS = 1 << 15
DEFAULT_BATCH_BYTES = 128 << 20  # keeps Arrow's int32 binary offsets far from overflow


class JetlogError(Exception):
    """A damaged or invalid event log met in FAILFAST mode, or an unusable header."""


_HEADER_READ = 34 + 0xFFFF + 4  # the largest header (JETLOG.md 2: version 2, a 65535-byte name)
_GZIP_MAGIC = b"\x1f\x8b"


@contextmanager
def open_segment(path: str, limit: Optional[int] = None) -> Iterator[bytes | mmap.mmap]:
    """The bytes of a segment file, at most ``limit`` of them: a read-only mapping, or
    for a gzip-compressed segment (a rotated log compressed by logrotate, say) the
    decompressed bytes (offsets are then offsets in the decompressed segment).

    Raises:
        JetlogError: the gzip stream is corrupt or ends early (never skipped silently).
        OSError: the file cannot be read (FileNotFoundError if it is gone).
    """
    with open(path, "rb") as fh:
        if fh.read(2) == _GZIP_MAGIC:
            fh.seek(0)
            try:
                with gzip.GzipFile(fileobj=fh) as gz:
                    data = gz.read() if limit is None else gz.read(limit)
            except (OSError, EOFError, zlib.error) as exc:
                raise JetlogError(f"{path}: gzip-compressed segment cannot be read: {exc}") from None
            yield data
            return
        size = os.fstat(fh.fileno()).st_size
        if limit is not None:
            size = min(size, limit)
        if size == 0:
            yield b""
            return
        mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
    try:
        yield mm
    finally:
        mm.close()


class SegmentIdentity(NamedTuple):
    """What a segment is, whatever its file is called or wherever it was moved
    (JETLOG.md 1: readers do not trust names): the header's daemon name, creation time,
    segment number and CRC (JETLOG.md 2). Hashable; ``list(identity)`` is JSON."""

    daemon: str
    created_ns: int
    segment: int
    header_crc: int


@dataclass(frozen=True)
class SegmentHeader:
    """A segment file header (JETLOG.md 2); ``size`` is where the first record starts.

    ``run_ns`` is the daemon run from a version-2 header, None in version 1 (infer it
    with :func:`infer_runs`).
    """

    name: str
    created_ns: int
    segment: int
    size: int
    version: int = 1
    run_ns: Optional[int] = None
    crc: int = 0

    @property
    def identity(self) -> SegmentIdentity:
        """The segment's identity (:class:`SegmentIdentity`), from the header alone."""
        return SegmentIdentity(self.name, self.created_ns, self.segment, self.crc)


def read_header(buf: bytes | mmap.mmap | memoryview) -> Optional[SegmentHeader]:
    """Parse the segment header at the start of ``buf``.

    Returns None if ``buf`` ends inside the header (a file being created is not damage).

    Raises:
        JetlogError: bad magic, unsupported version, bad header CRC or bad UTF-8 name.
    """
    try:
        header = decode_header(buf)
    except LogHeaderIncomplete:
        return None
    except RemoteProtocolError as exc:
        raise JetlogError(str(exc)) from None
    (crc,) = _LEN.unpack_from(buf, header.size - 4)
    return SegmentHeader(header.name, header.created_ns, header.segment, header.size, header.version,
                         header.run_ns, crc)


def read_file_header(path: str) -> Optional[SegmentHeader]:
    """The header of the segment file ``path`` (gzip-compressed or not); None if the
    file ends inside it.

    Raises:
        JetlogError: the header is invalid.
        OSError: the file cannot be read (FileNotFoundError if it is gone).
    """
    with open_segment(path) as buf:
        return read_header(buf[: _HEADER_READ])


def infer_runs(
    headers: Mapping[str, Optional[SegmentHeader]],
    known: Optional[Callable[[str, SegmentHeader], Optional[int]]] = None,
) -> dict[str, int]:
    """The daemon run (``run_ns``) of each file with a valid header (JETLOG.md 2).

    Version 2 headers say it. For version 1, per daemon name, in ``created_ns`` order,
    a segment whose number is not higher than its predecessor's starts a new run named
    by its ``created_ns`` (JETLOG.md 1: a new segment on every start); the first file of
    a daemon starts a run too, so a run whose first segments are not among ``headers``
    is named by its earliest file here. ``known(path, header)``, if given, may return a
    run recorded earlier for a file (a warehouse's progress table): it wins, and the
    segments after it in the same run follow it.
    """
    out: dict[str, int] = {}
    by_daemon: dict[str, list[tuple[int, int, str, SegmentHeader]]] = {}
    for path, header in headers.items():
        if header is not None:
            by_daemon.setdefault(header.name, []).append((header.created_ns, header.segment, path, header))
    for segments in by_daemon.values():
        run: Optional[int] = None
        prev: Optional[int] = None
        for created, segment, path, header in sorted(segments, key=lambda s: s[:3]):
            recorded = known(path, header) if known is not None else None
            if header.run_ns is not None:
                run = header.run_ns
            elif recorded is not None:
                run = recorded
            elif run is None or prev is None or segment <= prev:
                run = created
            out[path] = run
            prev = segment
    return out


@dataclass
class ScanResult:
    """What :func:`scan_records` found in ``[start, stop)``.

    ``starts`` are the offsets of valid records; ``damage`` lists ``(offset, length,
    reason)`` of skipped regions; ``end`` is the offset after the last complete record
    or damaged region (the resume point); ``truncated`` is ``(offset, present, needed)``
    when the bytes end inside a record.
    """

    starts: np.ndarray
    damage: list[tuple[int, int, str]] = field(default_factory=list)
    end: int = 0
    truncated: Optional[tuple[int, int, int]] = None


def _record_problem(buf: bytes | mmap.mmap, pos: int, have: int, max_record: int, verify_crc: bool) -> Optional[str]:
    """Why the record at ``pos`` is not valid (JETLOG.md 5); "" if the bytes end inside
    it while what is there is sound so far; None if valid."""
    rem = have - pos
    if rem < 2:
        return "" if buf[pos:have] == _MARKER_BYTES[:rem] else "bad record marker"
    if buf[pos : pos + 2] != _MARKER_BYTES:
        return "bad record marker"
    if rem < 6:
        return ""
    length = _LEN.unpack_from(buf, pos + 2)[0]
    if length < _FIXED_SIZE or length > max_record:
        return f"implausible record length {length}"
    end = pos + _HEAD_SIZE + length
    if end > have:
        return ""
    if verify_crc and zlib.crc32(buf[pos + _HEAD_SIZE : end], zlib.crc32(buf[pos + 2 : pos + 6])) != _LEN.unpack_from(
        buf, pos + 6
    )[0]:
        return "record CRC mismatch"
    return None


def _is_candidate(buf: bytes | mmap.mmap, pos: int, have: int, max_record: int) -> bool:
    """JETLOG.md 5 resync: a marker, a plausible length, right after the record the next
    marker (or the end of the data, or the start of a marker cut by it), and a matching
    CRC. The marker after is checked before the CRC: damage full of marker bytes with
    large lengths would otherwise cost a CRC over up to ``max_record`` bytes at each."""
    if have - pos < _HEAD_SIZE:
        return False
    marker, length, crc = _HEAD.unpack_from(buf, pos)
    if marker != RECORD_MARKER or length < _FIXED_SIZE or length > max_record:
        return False
    end = pos + _HEAD_SIZE + length
    if end > have:
        return False
    after = buf[end : end + 2]
    if after != _MARKER_BYTES[: len(after)]:
        return False
    return bool(zlib.crc32(buf[pos + _HEAD_SIZE : end], zlib.crc32(buf[pos + 2 : pos + 6])) == crc)


def _first_marker(buf: bytes | mmap.mmap, pos: int, have: int, max_record: int,
                  accept: Callable[[bytes | mmap.mmap, int, int, int], bool]) -> int:
    """The first record marker at or after ``pos`` that ``accept`` takes (JETLOG.md 5), or ``have``."""
    while True:
        pos = buf.find(_MARKER_BYTES, pos, have)
        if pos < 0:
            return have
        if accept(buf, pos, have, max_record):
            return pos
        pos += 1


def _next_candidate(buf: bytes | mmap.mmap, pos: int, have: int, max_record: int) -> int:
    """The first resync candidate at or after ``pos`` (JETLOG.md 5), or ``have``."""
    return _first_marker(buf, pos, have, max_record, _is_candidate)


def _is_sync_point(buf: bytes | mmap.mmap, pos: int, have: int, max_record: int) -> bool:
    """A resync candidate whose successor is valid too, or incomplete at the end.

    Where a chunk starts (:func:`find_boundary`). Asking for two chained records makes a
    false start inside a record body (a marker, a plausible length and a matching CRC by
    chance) practically impossible. Every sync point is a candidate, so the chunk before
    reaches it whether it arrives by the chain or by resynchronising after damage.
    """
    if not _is_candidate(buf, pos, have, max_record):
        return False
    nxt = pos + _HEAD_SIZE + _LEN.unpack_from(buf, pos + 2)[0]
    return nxt >= have or _record_problem(buf, nxt, have, max_record, True) in (None, "")


def find_boundary(
    buf: bytes | mmap.mmap, pos: int, max_record: int = DEFAULT_MAX_RECORD, *, header_size: int = 0
) -> int:
    """Where a chunk that nominally starts at ``pos`` really starts: ``header_size`` if
    ``pos`` is inside the header, else the first sync point at or after ``pos`` (or the
    end of ``buf``). The chunk before scans up to exactly there (:func:`scan_records`)."""
    if pos <= header_size:
        return header_size
    return _first_marker(buf, pos, len(buf), max_record, _is_sync_point)


_CRC_TABLE = np.array(CRC_TABLE, dtype=np.uint32)
_WINDOW = 4 << 20  # bytes searched for markers at a time (bounds the temporaries)


def _crc32_4(a: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """``zlib.crc32`` of the 4 bytes at each of ``pos``, vectorised."""
    crc = np.full(len(pos), 0xFFFFFFFF, dtype=np.uint32)
    for i in range(4):
        crc = _CRC_TABLE[(crc ^ a[pos + i]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def _walk_vectorised(data: bytes | mmap.mmap, pos: int, until: int, max_record: int, verify_crc: bool,
                     window: int = _WINDOW) -> tuple[np.ndarray, int]:
    """:func:`tools.ingest.chain.walk` in numpy, for the interpreted build: the same
    records, returned, and the same stop.

    Every marker before ``until`` is a candidate; each candidate's length says where the
    next one must be. The chain from ``pos`` runs through consecutive candidates except
    where a marker inside a record's body is skipped, so only those jumps are followed
    one by one. The CRCs, when verified, are then checked in order along the chain.
    """
    have = len(data)
    lim = min(until, have - _HEAD_SIZE + 1)  # a record's head must fit
    none = np.zeros(0, dtype=np.int64)
    if pos >= lim:
        return none, pos
    a = np.frombuffer(data, dtype=np.uint8)
    found = []
    for lo in range(pos, lim, window):
        hi = min(lo + window, lim)
        found.append(np.flatnonzero((a[lo:hi] == _MARKER_BYTES[0]) & (a[lo + 1 : hi + 1] == _MARKER_BYTES[1])) + lo)
    hit = np.concatenate(found)
    if not len(hit) or hit[0] != pos:
        return none, pos
    gather = _Gather(a)
    length = gather.at(hit + 2, 4)
    nxt = hit + _HEAD_SIZE + length
    valid = (length >= _FIXED_SIZE) & (length <= max_record) & (nxt <= have)
    at = np.minimum(np.searchsorted(hit, nxt), len(hit) - 1)
    succ = np.where(hit[at] == nxt, at, -1)  # the candidate where the next record starts
    # Where the chain does not just go on to the next candidate (the last one included).
    breaks = np.flatnonzero((succ != np.arange(1, len(hit) + 1)) | ~valid).tolist()
    runs = []
    i = 0
    while True:
        b = breaks[bisect.bisect_left(breaks, i)]
        if not valid[b]:
            runs.append(np.arange(i, b))
            stop = int(hit[b])
            break
        runs.append(np.arange(i, b + 1))
        stop = int(nxt[b])
        if stop >= until or succ[b] < 0:
            break
        i = int(succ[b])
    chain = np.concatenate(runs)
    starts = hit[chain]
    if verify_crc and len(starts):
        crc32 = zlib.crc32
        heads, wants = _crc32_4(a, starts + 2).tolist(), gather.at(starts + 6, 4).tolist()
        for body, end, head, want in zip((starts + _HEAD_SIZE).tolist(), nxt[chain].tolist(), heads, wants, strict=True):
            if crc32(data[body:end], head) != want:
                bad = body - _HEAD_SIZE
                return starts[: int(np.searchsorted(starts, bad))], bad
    return starts, stop


def scan_records(
    buf: bytes | mmap.mmap,
    start: int,
    until: Optional[int] = None,
    *,
    max_record: int = DEFAULT_MAX_RECORD,
    verify_crc: bool = True,
) -> ScanResult:
    """Locate the records and damaged regions that begin in ``[start, until)``.

    ``start`` and ``until`` must be where chunks really start (the header's end, a
    :func:`find_boundary` result, or the end of ``buf``): the scan follows the chain
    from ``start`` and stops once it reaches ``until``, so that chunks ``[b0, b1)``,
    ``[b1, b2)``... together report exactly what one scan of the whole file reports,
    damage right after a cut included. Records and damage may extend past ``until``;
    the bytes of ``buf`` bound everything (JETLOG.md 5: a record that runs past them is
    a truncated last record, unless a resync candidate follows it: then its length is
    damage).
    """
    have = len(buf)
    if until is None or until > have:
        until = have
    # Compiled, the chain of valid records is walked over bytes (tools.ingest.chain,
    # native loads): of a mapping, a copy of what the records starting before ``until``
    # can span. Offsets in that copy are ``base`` less than in ``buf``. Interpreted, numpy
    # reads the mapping itself.
    data: bytes | mmap.mmap
    if isinstance(buf, bytes) or not NATIVE:
        data, base = buf, 0
    else:
        data, base = bytes(buf[start : min(have, until + _HEAD_SIZE + max_record)]), start
    starts: list[int] = []  # compiled: the walk's, offsets in ``data``
    runs: list[np.ndarray] = []  # interpreted: the vectorised walk's, offsets in ``buf``
    damage: list[tuple[int, int, str]] = []
    pos = start
    truncated: Optional[tuple[int, int, int]] = None
    while True:
        if NATIVE:
            assert isinstance(data, bytes)
            pos = walk(data, pos - base, until - base, max_record, verify_crc, starts) + base
        else:
            run, stop = _walk_vectorised(data, pos - base, until - base, max_record, verify_crc)
            runs.append(run + base)
            pos = stop + base
        if pos >= until:
            break
        # The walk stopped at a record that is not valid, or at the end of the bytes.
        problem = _record_problem(buf, pos, have, max_record, verify_crc)
        nxt = _next_candidate(buf, pos + 1, have, max_record)
        if problem == "":
            if nxt >= have:
                # JETLOG.md 5: the bytes end inside the last record.
                need = _HEAD_SIZE + (_LEN.unpack_from(buf, pos + 2)[0] if have - pos >= _HEAD_SIZE else 0)
                truncated = (pos, have - pos, need)
                break
            problem = "record runs past the end of the file while a valid record follows"
        # JETLOG.md 5: damage in the middle; report it and resume at the next candidate.
        damage.append((pos, nxt - pos, problem or "damage"))
        pos = nxt
    found = np.asarray(starts, dtype=np.int64) + base if NATIVE else np.concatenate([*runs, np.zeros(0, np.int64)])
    return ScanResult(found, damage, pos, truncated)


def time_range(
    buf: bytes | mmap.mmap,
    header_size: int,
    lo_ns: Optional[int],
    hi_ns: Optional[int],
    *,
    max_record: int = DEFAULT_MAX_RECORD,
    grain: int = 1 << 16,
) -> tuple[int, int]:
    """``[start, stop)``: where the records with ``lo_ns <= ts_ns <= hi_ns`` (bounds
    None: open) begin, found by bisection over byte offsets, since ``ts_ns`` never
    decreases within a segment (JETLOG.md 3). Both ends are chunk starts
    (:func:`find_boundary`), so reading ``[start, stop)`` as a chunk reads exactly the
    records between them; every record outside is outside the time range. Damaged
    bytes are skipped by the probes (only valid records carry a time). ``grain``: the
    bisection stops when the bracket is this narrow (bytes read beyond the range).
    """
    have = len(buf)

    def probe(pos: int) -> tuple[int, Optional[int]]:
        """(where a chunk at ``pos`` starts, ts_ns of the first valid record from there)."""
        begin = find_boundary(buf, pos, max_record, header_size=header_size)
        valid = begin
        while valid < have and _record_problem(buf, valid, have, max_record, True) is not None:
            valid = find_boundary(buf, valid + 1, max_record, header_size=header_size)
        if valid >= have:
            return begin, None
        return begin, int.from_bytes(buf[valid + _HEAD_SIZE : valid + _HEAD_SIZE + 8], "big")

    start = header_size
    if lo_ns is not None:
        ts = probe(header_size)[1]
        if ts is None:
            return header_size, header_size  # no record at all
        if ts < lo_ns:
            # The largest probe position whose first record is still before lo_ns.
            a, z = header_size, have
            while z - a > grain:
                m = (a + z) // 2
                t = probe(m)[1]
                if t is not None and t < lo_ns:
                    a = m
                else:
                    z = m
            start = probe(a)[0]
    stop = have
    if hi_ns is not None:
        b, ts = probe(start)
        if ts is None or ts > hi_ns:
            return start, b if ts is not None else have
        # The smallest probe position whose first record is after hi_ns (or none left).
        a, z = start, have
        while z - a > grain:
            m = (a + z) // 2
            t = probe(m)[1]
            if t is None or t > hi_ns:
                z = m
            else:
                a = m
        stop = probe(z)[0] if z < have else have
    return start, stop


def resume_offset(path: str, start: int, limit: int, chunk: int, *, max_record: int = DEFAULT_MAX_RECORD) -> int:
    """Where the next read of ``path`` resumes after its records that begin in
    ``[start, limit)`` were read in chunks of ``chunk`` bytes (as the ``jetlog`` source
    plans them): the offset after the last complete record or damaged region of the
    last chunk that has one. A truncated last record is read again next time
    (JETLOG.md 5). ``start`` must be a record boundary (or inside the header).

    Only the last chunk is scanned (the one before it if no record begins in it), from
    the same boundary the reader starts that chunk at (:func:`find_boundary`).

    Raises:
        JetlogError: the segment header is invalid.
    """
    with open_segment(path, limit) as mm:
        size = len(mm)
        if size <= start:
            return start
        header = read_header(mm)
        if header is None:
            return start
        cuts = range(start, limit, chunk) if limit - start > chunk else range(start, start + 1)
        for cut in reversed(cuts):
            begin = find_boundary(mm, cut, max_record, header_size=header.size)
            if begin < size:
                return scan_records(mm, begin, max_record=max_record).end
        return max(start, header.size)


class SegmentChanged(JetlogError):
    """A segment file is not what the driver planned to read: shorter, another segment
    (its header), or other bytes at the last planned record. The executors may see
    another copy than the driver (a stale network-filesystem or object-store cache), or
    the file was replaced after planning; reading what is there would lose records
    silently (issue 27)."""


@dataclass(frozen=True)
class PlannedSegment:
    """What the driver saw of a segment when it planned a read of its first ``size``
    bytes: the header's identity (None: no valid header then), and ``last``, the offset
    and CRC field of the last complete record that ends within ``size`` (None: none).
    ``size`` None: a gzip-compressed segment (read whole; only its header is checked)."""

    identity: Optional[tuple[str, int, int, int]]
    size: Optional[int]
    last: Optional[tuple[int, int]]


_LAST_WINDOW = 64 << 10  # bytes before the planned end searched for its last record first


def _head_identity(buf: bytes | mmap.mmap) -> Optional[tuple[str, int, int, int]]:
    try:
        header = read_header(buf[:_HEADER_READ])
    except JetlogError:
        return None
    return tuple(header.identity) if header is not None else None  # type: ignore[return-value]


def _cut_header(head: bytes) -> bool:
    """``head`` ends inside a header that is valid so far."""
    try:
        return read_header(head) is None
    except JetlogError:
        return False


def _gzip_head(path: str) -> bytes:
    with gzip.open(path, "rb") as gz:
        try:
            return gz.read(_HEADER_READ)
        except (OSError, EOFError, zlib.error) as exc:
            raise JetlogError(f"{path}: gzip-compressed segment cannot be read: {exc}") from None


def plan_segment(path: str, size: Optional[int], *, max_record: int = DEFAULT_MAX_RECORD) -> PlannedSegment:
    """What a task must find in ``path`` to read its first ``size`` bytes as the driver
    planned (:func:`check_segment`). ``size`` None: a gzip-compressed segment.

    Only the end of the planned bytes is scanned: from a sync point 64 KiB before it
    (further back if no complete record starts there).

    Raises:
        OSError: the file cannot be read.
    """
    if size is None:
        return PlannedSegment(_head_identity(_gzip_head(path)), None, None)
    with open_segment(path, size) as mm:
        identity = _head_identity(mm)
        header = read_header(mm) if identity is not None else None
        if header is None or len(mm) <= header.size:
            return PlannedSegment(identity, size, None)
        window = _LAST_WINDOW
        while True:
            begin = find_boundary(mm, max(header.size, len(mm) - window), max_record, header_size=header.size)
            starts = scan_records(mm, begin, max_record=max_record).starts
            if len(starts) or begin <= header.size:
                break
            window *= 4
        if not len(starts):
            return PlannedSegment(identity, size, None)
        last = int(starts[-1])
        (crc,) = _LEN.unpack_from(mm, last + 6)
        return PlannedSegment(identity, size, (last, crc))


def check_segment(path: str, planned: PlannedSegment, *, max_record: int = DEFAULT_MAX_RECORD) -> None:
    """Check that ``path`` is the segment the driver planned to read (:func:`plan_segment`):
    at least as long, the same header, and the last planned record there with its CRC.
    A segment that grew since is fine (only the planned bytes are read).

    Raises:
        SegmentChanged: it is not; the message names the file and both sizes.
        OSError: the file cannot be read (FileNotFoundError: it is gone).
    """
    if planned.size is None:
        if _head_identity(_gzip_head(path)) != planned.identity:
            raise SegmentChanged(f"{path}: the gzip-compressed segment here has another header than the one the "
                                 "driver planned to read: it was replaced, or this node sees another copy")
        return
    with open(path, "rb") as fh:
        have = os.fstat(fh.fileno()).st_size
        sizes = f"{have:,} bytes here, {planned.size:,} planned by the driver"
        if have < planned.size:
            raise SegmentChanged(f"{path}: shorter than the driver planned to read ({sizes}): this node sees "
                                 "another copy of the file (a stale cache?) or it was truncated; nothing read")
        head = fh.read(_HEADER_READ)
        now = _head_identity(head)
        # A header the driver saw incomplete (a segment being created) is planned as no
        # bytes to read; complete now, that is no change.
        header_was_cut = planned.identity is None and now is not None and _cut_header(head[: planned.size])
        if now != planned.identity and not header_was_cut:
            raise SegmentChanged(f"{path}: another segment than the driver planned to read (its header differs; "
                                 f"{sizes}): it was replaced, or this node sees another file at this path")
        if planned.last is None:
            return
        offset, crc = planned.last
        fh.seek(offset)
        top = fh.read(_HEAD_SIZE)
        ok = len(top) == _HEAD_SIZE and top[:2] == _MARKER_BYTES and _LEN.unpack_from(top, 6)[0] == crc
        if ok:
            (length,) = _LEN.unpack_from(top, 2)
            body = fh.read(length) if length <= max_record else b""
            ok = len(body) == length and zlib.crc32(body, zlib.crc32(top[2:6])) == crc
    if not ok:
        raise SegmentChanged(f"{path}: the last record the driver planned to read (at offset {offset:,}) is not "
                             f"there with its CRC ({sizes}): the file changed, or this node sees another copy")


# --- vectorised field extraction ------------------------------------------------------


# Name columns are one ``take`` from a table of names. Each table ends with a null, at
# index ``_NULL`` (or ``_NULL2`` for two tables side by side): the index of a row that
# has no name. They are numpy integers: beside uint8 codes, numpy wraps a plain 256 to 0.
_NULL: Final = np.int64(256)
_NULL2: Final = np.int64(512)


def _names(*enums: type[IntEnum]) -> pa.Array:
    """The names of byte codes 0-255 of each enum in turn (unknown codes as hex), then null."""
    out: list[Optional[str]] = []
    for enum in enums:
        known = {int(m): m.name for m in enum}
        out += [known.get(i, f"0x{i:02X}") for i in range(256)]
    return pa.array([*out, None], pa.string())


_KIND_NAMES = _names(LogKind)
_FRAME_TYPE_NAMES = _names(FrameType)
_FUNCTION_EVENT_NAMES = _names(Function, EventCode)  # a function, or 256 + an event code
_STATUS_NAMES = _names(Status)
_VTYPE_NAMES = _names(ValueType)
_DIRECTION_NAMES = pa.array([{int(LogKind.FRAME_IN): "in", int(LogKind.FRAME_OUT): "out"}.get(k) for k in range(256)],
                            pa.string())  # by record kind

# Reasons for `frame_error` (a CRC-valid record whose frame breaks PROTOCOL.md) and for
# `corrupt` on non-frame records whose data breaks JETLOG.md 4. Index 0: no error.
_FRAME_ERRORS = [
    None,
    "frame shorter than its 5-byte header",  # PROTOCOL.md 3
    "frame length field disagrees with the record",  # PROTOCOL.md 3
    "unknown frame type",  # PROTOCOL.md 3
    "body too short for its fields",  # PROTOCOL.md 4
    "unknown function",  # PROTOCOL.md 6
    "unknown event code",  # PROTOCOL.md 7
    "str16 or value length runs past the frame, or trailing bytes",  # PROTOCOL.md 5
    "empty key",  # PROTOCOL.md 5.2
    "reserved value type",  # PROTOCOL.md 5.3
    "value has the wrong width or byte for its type",  # PROTOCOL.md 5.3
    "invalid OK payload length",  # PROTOCOL.md 4.2
    "text is not valid UTF-8",  # PROTOCOL.md 5.1
]
_E_SHORT, _E_LEN, _E_TYPE, _E_BODY, _E_FUNC, _E_EVT, _E_LAYOUT, _E_KEY, _E_VRES, _E_VBAD, _E_OKLEN, _E_UTF8 = range(
    1, 13
)
_FRAME_ERROR_NAMES = pa.array(_FRAME_ERRORS, pa.string())
_DATA_ERROR_NAMES = pa.array([None if r is None else f"bad record data: {r}" for r in _FRAME_ERRORS], pa.string())



def _byte_set(codes: Iterable[int]) -> np.ndarray:
    """A table of 256 booleans, true at ``codes``: membership of a byte code is one lookup."""
    table = np.zeros(256, dtype=bool)
    table[[int(c) for c in codes]] = True
    return table


_FUNCTIONS = _byte_set(Function)
_EVENTS = _byte_set(EventCode)
_KEY_FUNCS = _byte_set([Function.ADD_STATE, Function.REMOVE_STATE, Function.SET_STATE, Function.NOTIFY_STATE,
                        Function.CALL_METHOD, Function.ADD_METHOD, Function.REMOVE_METHOD, Function.GET_STATE])
_VALUE_FUNCS = _byte_set([Function.ADD_STATE, Function.SET_STATE, Function.NOTIFY_STATE, Function.CALL_METHOD])
# fetch_id | Key | Value (PROTOCOL.md 7.2; FETCH_UNMATCH 14.2)
_FETCH_EVENTS = _byte_set([EventCode.FETCH_ADD, EventCode.FETCH_CHANGE, EventCode.FETCH_REMOVE,
                           EventCode.FETCH_UNMATCH])
# fetch_id | action | Key (PROTOCOL.md 14.2)
_KEY_EVENTS = _byte_set([EventCode.FETCH_METHOD, EventCode.FETCH_NODE])
_KV_EVENTS = _byte_set([EventCode.SET_STATE, EventCode.NOTIFY_STATE, EventCode.CALL_METHOD])
# A FETCH_METHOD/FETCH_NODE action (1-2), or 3 + a QUERY_ENTRY kind (1-3), then null.
_ACTION_NAMES = pa.array(["", "ADD", "REMOVE", "", "STATE", "METHOD", "NODE", None], pa.string())
_BOOL_TEXT = pa.array(["false", "true"], pa.string())


class _Gather:
    """Masked big-endian reads at per-row positions, bounded by each row's record end.

    One-byte fields come back as uint8 (codes, compared and looked up as such), wider
    ones as int64.
    """

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.end = np.zeros(0, dtype=np.int64)  # per row: where its record ends
        # Per width, the bytes seen as a big-endian integer starting at every offset (a
        # view with a stride of one byte): one gather per read instead of one per byte.
        self.wide = {
            width: np.ndarray(shape=(len(a) - width + 1,), dtype=f">u{width}", buffer=a, strides=(1,))
            for width in (4, 8)
            if len(a) >= width
        }

    def at(self, p: np.ndarray, width: int) -> np.ndarray:
        """The ``width``-byte big-endian integers at ``p`` (unchecked)."""
        v: np.ndarray
        if width == 1:
            v = self.a[p]
        elif (wide := self.wide.get(width)) is not None:
            v = wide[p].astype(np.int64)
        else:
            v = self.a[p].astype(np.int64)
            for i in range(1, width):
                v = (v << 8) | self.a[p + i]
        return v

    def _rows(self, pos: np.ndarray, ok: np.ndarray, size: int) -> tuple[Optional[np.ndarray], np.ndarray]:
        """The rows where ``ok`` and ``size`` bytes at ``pos`` lie inside the record (None:
        all rows), and the same as a new mask."""
        if ok.all():
            inside = pos + size <= self.end
            return (None if inside.all() else np.flatnonzero(inside)), inside
        # Only the rows that have the field are looked at: most fields belong to a few kinds.
        rows = np.flatnonzero(ok)
        inside = pos[rows] + size <= self.end[rows]
        if not inside.all():
            rows = rows[inside]
        has = np.zeros(len(ok), dtype=bool)
        has[rows] = True
        return rows, has

    def uint(self, pos: np.ndarray, ok: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
        """(value, has) of the ``width``-byte field at ``pos``, on the rows where ``ok`` and
        the field lies inside the record; 0 elsewhere. ``has`` is a new array."""
        (value,), has = self.fields(pos, ok, ((0, width),))
        return value, has

    def fields(self, pos: np.ndarray, ok: np.ndarray,
               layout: tuple[tuple[int, int], ...]) -> tuple[list[np.ndarray], np.ndarray]:
        """Like :meth:`uint` for several ``(offset, width)`` fields after ``pos``, on the rows
        where all of them lie inside the record."""
        rows, has = self._rows(pos, ok, max(off + width for off, width in layout))
        p = pos if rows is None else pos[rows]
        values = [self.at(p + off if off else p, width) for off, width in layout]
        if rows is None:
            return values, has
        out = []
        for v in values:
            spread = np.zeros(len(ok), dtype=v.dtype)
            spread[rows] = v
            out.append(spread)
        return out, has

    def str16(self, pos: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(data start, length, position after, ok) of the str16 at ``pos`` (PROTOCOL.md 5.1).

        Only the rows that have it (``ok``) carry meaningful values.
        """
        rows, has = self._rows(pos, ok, 2)
        if rows is None:
            length = self.at(pos, 2)
            after = pos + 2 + length
            has &= after <= self.end
            return pos + 2, length, after, has
        p = pos[rows] + 2
        size = self.at(p - 2, 2)
        stop = p + size
        fits = stop <= self.end[rows]
        start, length, after = np.zeros(len(ok), dtype=np.int64), np.zeros(len(ok), dtype=np.int64), pos + 2
        start[rows], length[rows], after[rows] = p, size, stop
        if not fits.all():
            has[rows[~fits]] = False
        return start, length, after, has


@functools.cache
def _first_table(offsets: tuple[int, ...]) -> np.ndarray:
    """Per 8-bit set of conditions, the offset of the lowest one (0 for none)."""
    return np.array([next((off for i, off in enumerate(offsets) if bits >> i & 1), 0) for bits in range(256)],
                    dtype=np.int64)


def _at_first(base: np.ndarray, conds: list[np.ndarray], offsets: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Per row, ``base`` plus the offset of the first of ``conds`` (at most 8) that holds,
    and whether one does."""
    assert 1 <= len(conds) <= 8 and len(offsets) == len(conds)
    bits = conds[0].view(np.uint8).copy()
    for i in range(1, len(conds)):
        bits |= conds[i].view(np.uint8) << i
    return base + _first_table(offsets)[bits], bits != 0


def _bitmap(valid: np.ndarray) -> Optional[pa.Buffer]:
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _var_array(a: np.ndarray, start: np.ndarray, length: np.ndarray, valid: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A binary/string array of ``a[start:start+length]`` per row, null where not valid.

    The rows' pieces lie in increasing order without overlap (fields of records in file
    order). So the file's bytes, cut at each piece's start and end, form an array whose
    every other element is a row's piece, and one ``take`` copies them out.
    """
    n = len(start)
    everywhere = bool(valid.all())
    rows = None if everywhere else np.flatnonzero(valid)
    m = n if rows is None else len(rows)
    if m == 0:
        return pa.nulls(n, typ)
    begin = start if rows is None else start[rows]
    size = length if rows is None else length[rows]
    cut = np.stack((begin, begin + size), axis=1).ravel()
    if (cut[1:] < cut[:-1]).any():
        raise ValueError("pieces must be in increasing order, without overlap")
    large = len(a) > 2**31 - 1
    pieces = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * m - 1,
                                   [None, pa.py_buffer(cut if large else cut.astype(np.int32)), pa.py_buffer(a)])
    got = pieces.take(np.arange(0, 2 * m, 2, dtype=np.int64))
    if large:
        got = got.cast(pa.binary())
    if rows is None:
        return got.view(typ)
    # Spread the pieces over all rows: the rows without one are null and empty.
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.where(valid, length, 0), out=offsets[1:])
    return pa.Array.from_buffers(typ, n, [_bitmap(valid), pa.py_buffer(offsets), got.buffers()[2]])


def _utf8(arr: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """Cast a binary array to string; rows that are not UTF-8 become null (returned mask)."""
    try:
        return arr.cast(pa.string()), np.zeros(len(arr), dtype=bool)
    except pa.ArrowInvalid:
        pass
    bad = np.zeros(len(arr), dtype=bool)
    texts: list[Optional[str]] = []
    for i, raw in enumerate(arr.to_pylist()):
        if raw is None:
            texts.append(None)
            continue
        try:
            texts.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            bad[i] = True
            texts.append(None)
    return pa.array(texts, pa.string()), bad


def _names_of(table: pa.Array, codes: np.ndarray, valid: np.ndarray) -> pa.Array:
    """The names of ``codes`` in ``table`` (one of the tables above), null where not ``valid``."""
    return table.take(np.where(valid, codes, np.int64(len(table) - 1)))  # int64: codes may be uint8


def _constant(text: str, n: int) -> pa.Array:
    """A string column of ``n`` times ``text``, built from its buffers (``pa.repeat``
    costs some 50 ns a row for strings)."""
    raw = text.encode()
    if (n + 1) * len(raw) >= 2**31:
        return pa.repeat(pa.scalar(text, pa.string()), n)
    offsets = np.arange(0, (n + 1) * len(raw), len(raw), dtype=np.int32) if raw else np.zeros(n + 1, np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])


def _int_col(values: np.ndarray, valid: np.ndarray) -> pa.Array:
    return pa.array(values, pa.int64(), mask=None if valid.all() else ~valid)


def _ffill_names(conn: np.ndarray, setter: np.ndarray, initial: Mapping[int, int]) -> np.ndarray:
    """Per row, the index of the latest name set for its connection (-1: none).

    ``setter`` holds a name index on rows that name their connection, -1 elsewhere;
    ``initial`` maps connections to the name they had before the first row.
    """
    n = len(conn)
    if not (setter >= 0).any():
        # No name is set in these rows (the usual batch): a lookup of the names before.
        return _lookup(conn, initial)
    # Connection ids count up from 1 in each daemon run: as uint16, when they fit, the
    # stable sort is a radix sort (five times faster).
    order = np.argsort(conn.astype(np.uint16) if n and conn.max() < 1 << 16 else conn, kind="stable")
    sc = conn[order]
    sv = setter[order].copy()
    first = np.ones(n, dtype=bool)
    first[1:] = sc[1:] != sc[:-1]
    if initial:
        for i in np.flatnonzero(first & (sv < 0)):
            sv[i] = initial.get(int(sc[i]), -1)
    pos = np.where((sv >= 0) | first, np.arange(n), 0)
    np.maximum.accumulate(pos, out=pos)
    out = np.empty(n, dtype=np.int64)
    out[order] = sv[pos]
    return out


def _lookup(conn: np.ndarray, known: Mapping[int, int]) -> np.ndarray:
    """Per row, ``known[conn]``, or -1."""
    if not known or not len(conn):
        return np.full(len(conn), -1, dtype=np.int64)
    keys = np.fromiter(known, dtype=np.int64, count=len(known))
    values = np.fromiter(known.values(), dtype=np.int64, count=len(known))
    top = int(conn.max())
    if top < 1 << 16:  # ids count up from 1: a table
        table = np.full(top + 1, -1, dtype=np.int64)
        inside = keys <= top
        table[keys[inside]] = values[inside]
        out: np.ndarray = table[conn]
        return out
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    at = np.minimum(np.searchsorted(keys, conn), len(keys) - 1)
    return np.where(keys[at] == conn, values[at], np.int64(-1))


@dataclass
class _Segment:
    """Per-file context of a batch."""

    path: str
    header: SegmentHeader
    names: dict[int, str] = field(default_factory=dict)  # conn_id -> peer name so far


def parse_batch(a: np.ndarray, starts: np.ndarray, seg: _Segment) -> tuple[pa.RecordBatch, np.ndarray]:
    """Parse the records at ``starts`` of the file bytes ``a`` into one batch.

    Updates ``seg.names`` with the peer names set in these records (CONN_NAME,
    CONN_SNAPSHOT, INFO received). Returns the batch and a mask of the rows whose
    record data is malformed for its kind (their ``corrupt`` column is set).
    Records of unknown kinds are skipped (JETLOG.md 4).
    """
    g = _Gather(a)
    body = starts + _HEAD_SIZE
    kind = a[body + 12]  # every record has its 13 fixed bytes (the walk checked)
    keep = (kind >= LogKind.FRAME_IN) & (kind <= LogKind.ROUTE)
    if not keep.all():
        starts, body, kind = starts[keep], body[keep], kind[keep]
    n = len(starts)
    rec_len = g.at(starts + 2, 4)
    end = g.end = body + rec_len
    ts_ns = g.at(body, 8)
    conn = g.at(body + 8, 4)
    data = body + _FIXED_SIZE
    dlen = rec_len - _FIXED_SIZE
    err = np.zeros(n, dtype=np.int64)

    def fail(mask: np.ndarray, code: int) -> None:
        # The first error found for a row is the one reported.
        if mask.any():
            err[mask & (err == 0)] = code

    # --- frames (FRAME_IN / FRAME_OUT), PROTOCOL.md 3-7 ---
    is_frame = (kind == LogKind.FRAME_IN) | (kind == LogKind.FRAME_OUT)
    fail(is_frame & (dlen < 5), _E_SHORT)
    ftype, has_ft = g.uint(data, is_frame, 1)
    flen, has_head = g.uint(data + 1, is_frame, 4)
    fail(has_head & (flen != dlen - 5), _E_LEN)
    frame_ok = has_head & (flen == dlen - 5)
    fb = data + 5
    fail(frame_ok & ((ftype < FrameType.REQUEST) | (ftype > FrameType.INFO)), _E_TYPE)
    is_req = frame_ok & (ftype == FrameType.REQUEST)
    is_resp = frame_ok & (ftype == FrameType.RESPONSE)
    is_evt = frame_ok & (ftype == FrameType.EVENT)
    is_info = frame_ok & (ftype == FrameType.INFO)
    fail((is_req | is_resp) & (flen < 5), _E_BODY)
    fail((is_evt & (flen < 1)) | (is_info & (flen < 12)), _E_BODY)
    rid, has_rid = g.uint(fb, is_req | is_resp, 4)
    # The byte after the request id: a request's function, a response's status.
    byte4, has_byte4 = g.uint(fb + 4, is_req | is_resp, 1)
    func, has_func = byte4, has_byte4 & is_req
    code, has_code = g.uint(fb, is_evt, 1)
    # Protocol 1.1 functions (queries, AUTHENTICATE) are known; a query's body (the Query,
    # PROTOCOL.md 14.1) has no columns of its own.
    fail(has_func & ~_FUNCTIONS[func], _E_FUNC)
    fail(has_code & ~_EVENTS[code], _E_EVT)

    # --- ROUTE, JETLOG.md 4 ---
    is_route = kind == LogKind.ROUTE
    (r_rconn, r_rid, r_oconn, r_oid, r_func), ok_r = g.fields(data, is_route,
                                                              ((0, 4), (4, 4), (8, 4), (12, 4), (16, 1)))
    fail(is_route & ~ok_r, _E_BODY)

    # Where the key (str16) is, per row.
    req_key = has_func & _KEY_FUNCS[func]
    req_prefix = has_func & (func == Function.FETCH_STATES)
    evt_kv = has_code & _KV_EVENTS[code]
    evt_fetch = has_code & _FETCH_EVENTS[code]
    # PROTOCOL.md 14.2, 14.4: FETCH_METHOD / FETCH_NODE (fetch_id | action | Key) and
    # QUERY_ENTRY (request_id | kind | Key | Value); FETCH_WINDOW's entries have no columns.
    evt_keyev = has_code & _KEY_EVENTS[code]
    evt_entry = has_code & (code == EventCode.QUERY_ENTRY)
    evt_window = has_code & (code == EventCode.FETCH_WINDOW)
    action, has_action = g.uint(fb + 5, evt_keyev | evt_entry, 1)
    entry_rid, has_entry_rid = g.uint(fb + 1, evt_entry, 4)
    fail((evt_keyev | evt_entry) & ~(has_action & (action >= 1) & (action <= np.where(evt_entry, 3, 2))), _E_LAYOUT)
    key_pos, has_key = _at_first(data, [req_key | req_prefix, evt_kv, evt_fetch, evt_keyev | evt_entry, ok_r],
                                 (10, 6, 10, 11, 17))
    k_start, k_len, k_after, k_ok = g.str16(key_pos, has_key)
    fail(has_key & ~k_ok, _E_LAYOUT)
    fail(k_ok & (k_len == 0) & ~req_prefix, _E_KEY)

    # fetch ids
    resp_status, has_status = byte4, has_byte4 & is_resp
    plen = flen - 5
    resp_ok = has_status & (resp_status == Status.OK)
    fail(resp_ok & (plen >= 1) & (plen <= 3), _E_OKLEN)  # PROTOCOL.md 4.2: lengths never overlap
    unfetch = has_func & (func == Function.UNFETCH)
    fid_pos, has_fid = _at_first(data, [unfetch | (resp_ok & (plen == 4)), evt_fetch | evt_keyev | evt_window], (10, 6))
    fetch_id, fid_ok = g.uint(fid_pos, has_fid, 4)

    # values, PROTOCOL.md 5.3: a Value always ends its frame exactly
    needs_value = (has_func & _VALUE_FUNCS[func]) | evt_kv | evt_fetch | evt_entry
    val_pos = np.select([needs_value & k_ok, resp_ok & (plen >= 5)], [k_after, fb + 5], -1)
    has_val = val_pos >= 0
    (vtype, vlen), v_ok = g.fields(val_pos, has_val, ((0, 1), (1, 4)))
    v_ok &= val_pos + 5 + vlen == end
    fail(has_val & ~v_ok, _E_LAYOUT)
    fail(v_ok & (vtype >= 0x09) & (vtype < 0x80), _E_VRES)
    fixed_w = np.select([vtype == 0, vtype == 1, (vtype == 2) | (vtype == 3)], [0, 1, 8], -1)
    v_start = val_pos + 5
    bool_byte, _ = g.uint(v_start, v_ok & (vtype == ValueType.BOOL) & (vlen == 1), 1)
    fail(v_ok & (fixed_w >= 0) & (vlen != fixed_w), _E_VBAD)
    fail(v_ok & (vtype == ValueType.BOOL) & (vlen == 1) & (bool_byte > 1), _E_VBAD)

    # text (a str16 that is not a key): messages, names, reasons
    close_evt = has_code & (code == EventCode.CLOSE)
    close_status, has_close_status = g.uint(fb + 1, close_evt, 1)
    is_open = kind == LogKind.CONN_OPEN
    is_close = kind == LogKind.CONN_CLOSE
    is_name = kind == LogKind.CONN_NAME
    is_snap = kind == LogKind.CONN_SNAPSHOT
    conn_status, has_conn_status = g.uint(data, is_close, 1)
    fail(is_close & ~has_conn_status, _E_BODY)
    addr_pos = np.where(is_open | is_snap, data, -1)
    a_start, a_len, a_after, a_ok = g.str16(addr_pos, addr_pos >= 0)
    fail((addr_pos >= 0) & ~a_ok, _E_LAYOUT)
    is_auth = has_func & (func == Function.AUTHENTICATE)
    text_pos, has_text = _at_first(data, [has_status & (resp_status != Status.OK), has_close_status, is_info,
                                          has_conn_status, is_name, is_auth], (10, 7, 15, 1, 0, 10))
    snap_text = is_snap & a_ok  # a snapshot's name follows its address (no other row is a snapshot)
    text_pos[snap_text] = a_after[snap_text]
    has_text |= snap_text
    t_start, t_len, t_after, t_ok = g.str16(text_pos, has_text)
    fail(has_text & ~t_ok, _E_LAYOUT)
    # PROTOCOL.md 15.2: AUTHENTICATE is user | password; the password is skipped, never kept.
    _, _, pw_after, pw_ok = g.str16(np.where(is_auth & t_ok, t_after, -1), is_auth & t_ok)
    fail(is_auth & t_ok & ~pw_ok, _E_LAYOUT)

    # Where each layout must end; anything else is trailing bytes (PROTOCOL.md 9.1).
    ends_after = np.select(
        [is_auth & pw_ok, t_ok, has_val, fid_ok & ~evt_fetch & ~evt_keyev & ~evt_window,
         req_key | req_prefix | ok_r | evt_keyev, is_open & a_ok, resp_ok & (plen == 0)],
        [pw_after, t_after, end, fid_pos + 4, k_after, a_after, fb + 5],
        end,
    )
    fail(ends_after != end, _E_LAYOUT)

    # --- variable-length columns ---
    key_arr, key_bad = _utf8(_var_array(a, k_start, k_len, k_ok, pa.binary()))
    text_arr, text_bad = _utf8(_var_array(a, t_start, t_len, t_ok, pa.binary()))
    addr_arr, addr_bad = _utf8(_var_array(a, a_start, a_len, a_ok, pa.binary()))
    fail(key_bad | text_bad | addr_bad, _E_UTF8)
    value_arr = _var_array(a, v_start, vlen, v_ok, pa.binary())
    # value_text: the types that have a text form (PROTOCOL.md 5.3)
    good_val = v_ok & (err == 0)
    is_bool = good_val & (vtype == ValueType.BOOL)
    is_int = good_val & (vtype == ValueType.INT64)
    is_float = good_val & (vtype == ValueType.FLOAT64)
    is_text = good_val & ((vtype == ValueType.STRING) | (vtype == ValueType.JSON))
    # Each form is made for its own rows only, then all are placed with one take.
    pieces = [_BOOL_TEXT]
    text_at = np.where(is_bool, bool_byte, np.int64(-1))
    placed = 2
    for rows, typ in ((np.flatnonzero(is_int), np.int64), (np.flatnonzero(is_float), np.float64)):
        if rows.size:
            pieces.append(pa.array(g.at(v_start[rows], 8).view(typ)).cast(pa.string()))
            text_at[rows] = np.arange(placed, placed + rows.size)
            placed += rows.size
    rows = np.flatnonzero(is_text)
    if rows.size:
        texts, bad = _utf8(value_arr.take(rows))
        pieces.append(texts)
        text_at[rows] = np.arange(placed, placed + rows.size)
        placed += rows.size
        # PROTOCOL.md 5.3: a STRING must be UTF-8; JSON is carried opaquely (no text if not).
        str_bad = np.zeros(n, dtype=bool)
        str_bad[rows] = bad
        fail(str_bad & (vtype == ValueType.STRING), _E_UTF8)
    pieces.append(pa.nulls(1, pa.string()))
    text_at[text_at < 0] = placed
    value_text = pa.concat_arrays(pieces).take(text_at)

    # Frame errors stay rows (they are traffic facts); bad non-frame data is corruption.
    frame_err = np.where(is_frame, err, 0)
    data_err = np.where(is_frame, 0, err)

    # --- peer names, tracked through the segment (JETLOG.md 4: CONN_NAME, CONN_SNAPSHOT, INFO in) ---
    names_here = (is_name | is_snap | (is_info & (kind == LogKind.FRAME_IN))) & t_ok & (err == 0)
    setter_rows = np.flatnonzero(names_here)
    peer_col: pa.Array
    if setter_rows.size or seg.names:
        name_list = list(seg.names.values())
        initial = {c: i for i, c in enumerate(seg.names)}
        setter = np.full(n, -1, dtype=np.int64)
        new_names = text_arr.take(pa.array(setter_rows)).to_pylist()
        setter[setter_rows] = np.arange(len(name_list), len(name_list) + len(setter_rows))
        name_list.extend(new_names)
        idx = _ffill_names(conn, setter, initial)
        peer_col = _names_of(pa.array([*name_list, None], pa.string()), idx, idx >= 0)
        for r, name in zip(setter_rows.tolist(), new_names, strict=True):
            seg.names[int(conn[r])] = name
    else:
        peer_col = pa.nulls(n, pa.string())

    function_col = _FUNCTION_EVENT_NAMES.take(
        np.select([has_func, has_code, ok_r], [func, code + _NULL, r_func], _NULL2))
    status_col = _STATUS_NAMES.take(
        np.select([has_status, has_close_status, has_conn_status], [resp_status, close_status, conn_status], _NULL))
    text_col = text_arr
    named = has_action & (evt_keyev | evt_entry) & (err == 0)
    if named.any():
        text_col = pc.coalesce(text_arr, _ACTION_NAMES.take(np.where(named, np.where(evt_entry, 3, 0) + action, 7)))
    cols = {
        "file": _constant(seg.path, n),
        "offset": pa.array(starts, pa.int64()),
        "daemon": _constant(seg.header.name, n),
        "segment": pa.array(np.full(n, seg.header.segment, dtype=np.int64)),
        "ts_ns": pa.array(ts_ns, pa.int64()),
        "ts": pa.array(ts_ns // 1000, _TS),
        "conn_id": pa.array(conn, pa.int64()),
        "peer_name": peer_col,
        "kind": _KIND_NAMES.take(kind),
        "direction": _DIRECTION_NAMES.take(kind),
        "msg_type": _names_of(_FRAME_TYPE_NAMES, ftype, has_ft),
        "request_id": _int_col(np.where(has_entry_rid, entry_rid, rid), has_rid | has_entry_rid),
        "function": function_col,
        "status": status_col,
        "fetch_id": _int_col(fetch_id, fid_ok),
        "key": key_arr,
        "value_type": _names_of(_VTYPE_NAMES, vtype, v_ok),
        "value": value_arr,
        "value_text": value_text,
        "text": text_col,
        "address": addr_arr,
        "route_requester_conn": _int_col(r_rconn, ok_r),
        "route_requester_id": _int_col(r_rid, ok_r),
        "route_owner_conn": _int_col(r_oconn, ok_r),
        "route_owner_id": _int_col(r_oid, ok_r),
        "size": pa.array(dlen, pa.int64()),
        "frame_error": _FRAME_ERROR_NAMES.take(frame_err) if frame_err.any() else pa.nulls(n, pa.string()),
        "corrupt": _DATA_ERROR_NAMES.take(data_err) if data_err.any() else pa.nulls(n, pa.string()),
    }
    return pa.RecordBatch.from_pydict(cols, schema=ARROW_SCHEMA), data_err > 0


def _damage_batch(path: str, header: Optional[SegmentHeader], rows: list[tuple[int, int, str, str]]) -> pa.RecordBatch:
    """Rows for what is not a record (JETLOG.md 5): ``(offset, size, kind, corrupt)``
    with ``kind`` CORRUPT (a damaged region or a bad header) or TRUNCATED."""
    return pa.RecordBatch.from_pylist(
        [
            {
                "file": path,
                "offset": off,
                "daemon": header.name if header else None,
                "segment": header.segment if header else None,
                "kind": kind,
                "size": size,
                "corrupt": text,
            }
            for off, size, kind, text in rows
        ],
        schema=ARROW_SCHEMA,
    )


def batch_rows(starts: np.ndarray, a: np.ndarray, max_rows: int, max_bytes: int) -> Iterator[np.ndarray]:
    """Split record offsets into runs of at most ``max_rows`` records / ``max_bytes`` bytes."""
    i = 0
    n = len(starts)
    while i < n:
        j = min(n, i + max_rows)
        if j < n and int(starts[j]) - int(starts[i]) > max_bytes:
            # Cut by bytes: binary search for the last record start within the budget.
            j = max(i + 1, int(np.searchsorted(starts, starts[i] + max_bytes, side="right")) - 1)
        yield starts[i:j]
        i = j


def _initial_names(buf: mmap.mmap | bytes, a: np.ndarray, seg: _Segment, upto: int, max_record: int) -> None:
    """Replay the peer names set before ``upto`` so a chunk that starts mid-file names
    its connections as a whole-file read would."""
    scan = scan_records(buf, seg.header.size, upto, max_record=max_record, verify_crc=False)
    starts = scan.starts
    if not len(starts):
        return
    kind = a[starts + _HEAD_SIZE + 12]
    ftype = a[np.minimum(starts + _HEAD_SIZE + _FIXED_SIZE, len(a) - 1)]
    pick = (kind == LogKind.CONN_NAME) | (kind == LogKind.CONN_SNAPSHOT) | (
        (kind == LogKind.FRAME_IN) & (ftype == FrameType.INFO)
    )
    for sub in batch_rows(starts[pick], a, DEFAULT_BATCH_ROWS, DEFAULT_BATCH_BYTES):
        parse_batch(a, sub, seg)


def read_segment(
    path: str,
    start: int = 0,
    stop: Optional[int] = None,
    *,
    mode: str = "PERMISSIVE",
    max_record: int = DEFAULT_MAX_RECORD,
    batch_rows_max: int = DEFAULT_BATCH_ROWS,
    batch_bytes_max: int = DEFAULT_BATCH_BYTES,
    limit: Optional[int] = None,
    stats: Optional[dict[str, object]] = None,
    add_run: bool = False,
    run_ns: Optional[int] = None,
    exact_start: bool = False,
    truncated_row: bool = False,
) -> Iterator[pa.RecordBatch]:
    """Read the records of one segment file that begin in ``[start, stop)`` as batches.

    ``start`` 0 (or anything inside the header) means from the first record; any other
    ``start`` is moved to where a chunk starting there really starts
    (:func:`find_boundary`), and the read goes up to where a chunk starting at ``stop``
    starts, so adjacent chunks ``[0, m)`` and ``[m, end)`` together yield every record
    and damaged run exactly once. With ``exact_start``, ``start`` is a position a
    previous read ended at (a resume offset, a streaming offset): read from exactly
    there, so that damage right there is reported too.
    ``limit`` caps the bytes considered (a streaming offset: the file may be longer now).
    ``stats``, if given, receives ``end`` (offset after the last complete record) and
    ``truncated``. Batches have :data:`ARROW_SCHEMA`, or with ``add_run``
    :data:`SOURCE_SCHEMA`: a ``run_ns`` column from a version-2 header, else ``run_ns``
    (what :func:`infer_runs` says for a version-1 file).

    Rows that are not records have ``kind`` CORRUPT (damage: ``size`` bytes skipped; a
    bad header: the whole file) or, with ``truncated_row`` (the ``jetlog`` source sets
    it), TRUNCATED (``size`` bytes present), JETLOG.md 5; ``stats`` reports a truncated
    last record either way (a warehouse reads it again once complete, and keeps no row).
    A gzip-compressed segment is read whole, by the chunk that starts at 0.

    Raises:
        JetlogError: in FAILFAST mode on any damage, truncated last record or bad
            header; in any mode on a gzip stream that cannot be read.
        OSError: the file cannot be read (FileNotFoundError: it is gone).
        ValueError: on an unknown ``mode``.
    """
    mode = mode.upper()
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
    with open_segment(path, limit) as mm:
        if not len(mm):
            return
        run = run_ns
        if add_run:
            try:
                header = read_header(mm)
            except JetlogError:
                header = None  # reported by _read_records
            # JETLOG.md 2: a version-2 header names its run; version 1: what the caller inferred.
            if header is not None and header.run_ns is not None:
                run = header.run_ns
        for batch in _read_records(path, mm, start, stop, mode, max_record, batch_rows_max, batch_bytes_max, stats,
                                   exact_start, truncated_row):
            if add_run:
                batch = pa.RecordBatch.from_arrays(
                    [*batch.columns, pa.array(np.full(batch.num_rows, run or 0, dtype=np.int64), pa.int64(),
                                              mask=np.full(batch.num_rows, run is None))],
                    schema=SOURCE_SCHEMA,
                )
            yield batch


def _read_records(
    path: str,
    mm: bytes | mmap.mmap,
    start: int,
    stop: Optional[int],
    mode: str,
    max_record: int,
    rows_max: int,
    bytes_max: int,
    stats: Optional[dict[str, object]],
    exact_start: bool = False,
    truncated_row: bool = True,
) -> Iterator[pa.RecordBatch]:
    have = len(mm)
    try:
        header = read_header(mm)
    except JetlogError as exc:
        # JETLOG.md 2: the whole file is rejected. Reported once, by the chunk at 0.
        if mode == "FAILFAST":
            raise JetlogError(f"{path}: bad segment header: {exc}; the whole file ({have} bytes) is unreadable") from None
        if mode == "PERMISSIVE" and start == 0:
            text = f"bad segment header: {exc}; skipped the whole file ({have} bytes)"
            yield _damage_batch(path, None, [(0, have, CORRUPT, text)])
        return
    if header is None:  # JETLOG.md 5: still being created; nothing to read yet
        return
    # numpy over the mapped bytes; everything below gathers into fresh arrays, so no
    # view outlives the mapping.
    a = np.frombuffer(mm, dtype=np.uint8)
    try:
        seg = _Segment(path, header)
        if exact_start and start > header.size:
            begin = min(start, have)
        else:
            begin = find_boundary(mm, start, max_record, header_size=header.size)
        until = have if stop is None or stop >= have else find_boundary(mm, stop, max_record, header_size=header.size)
        if begin >= until:
            if stats is not None:
                stats["end"], stats["truncated"] = begin, None
            return
        if begin > header.size:
            _initial_names(mm, a, seg, begin, max_record)
        scan = scan_records(mm, begin, until, max_record=max_record)
        if stats is not None:
            stats["end"] = scan.end
            stats["truncated"] = scan.truncated
        if mode == "FAILFAST":
            if scan.damage:
                off, length, reason = scan.damage[0]
                raise JetlogError(f"{path}: {reason} at offset {off} ({length} bytes damaged)")
            if scan.truncated:
                off, present, needed = scan.truncated
                raise JetlogError(f"{path}: truncated record at offset {off}: {present} of {needed} bytes present")
        for sub in batch_rows(scan.starts, a, rows_max, bytes_max):
            batch, bad = parse_batch(a, sub, seg)
            if bad.any():
                if mode == "FAILFAST":
                    row = int(np.flatnonzero(bad)[0])
                    raise JetlogError(
                        f"{path}: {batch.column('corrupt')[row].as_py()} at offset {batch.column('offset')[row].as_py()}"
                    )
                if mode == "DROPMALFORMED":
                    batch = batch.filter(pa.array(~bad))
            if batch.num_rows:
                yield batch
        if mode == "PERMISSIVE" and (scan.damage or (scan.truncated and truncated_row)):
            rows = [(off, length, CORRUPT, f"{reason}; skipped {length} bytes") for off, length, reason in scan.damage]
            if scan.truncated and truncated_row:
                off, present, needed = scan.truncated
                rows.append((off, present, TRUNCATED, f"truncated record: {present} of {needed} bytes present"))
            yield _damage_batch(path, header, rows)
    finally:
        del a
