"""The event-log format (spec/JETLOG.md): segment header, records, and a streaming reader.

Sans-IO like the wire codec: :func:`encode_header` / :func:`encode_record` return bytes
for the daemon to write; :class:`LogReader` takes bytes in any chunking and yields
headers, records, corruption reports and, at the end, a truncation report.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING
from typing import BinaryIO
from typing import Optional
from typing import Union

if TYPE_CHECKING:
    from mmap import mmap

from .codec import _str16_bytes
from .codes import Status
from .errors import LocalProtocolError
from .errors import RemoteProtocolError

__all__ = [
    "MAGIC",
    "RECORD_MARKER",
    "Corruption",
    "LogHeader",
    "LogHeaderIncomplete",
    "LogKind",
    "LogReader",
    "LogRecord",
    "Truncation",
    "conn_close_data",
    "conn_name_data",
    "conn_open_data",
    "conn_snapshot_data",
    "decode_header",
    "encode_header",
    "encode_record",
    "iter_log",
    "parse_record_data",
    "route_data",
]

MAGIC = b"\x89JETLOG\n"  # JETLOG.md 2: like PNG's, catches text-mode and 7-bit damage
FORMAT_VERSION = 2  # JETLOG.md 2: what we write; readers accept 1 and 2
READ_VERSIONS = (1, 2)
RECORD_MARKER = 0x4A52  # "JR", JETLOG.md 3: lets a reader resynchronise quickly
RECORD_HEAD_SIZE = 10  # marker:u16 | length:u32 | crc:u32
RECORD_FIXED_SIZE = 13  # ts_ns:u64 | conn_id:u32 | kind:u8
DEFAULT_MAX_RECORD = 64 * 1024 * 1024 + 1024  # JETLOG.md 3: a 64 MiB frame and change

_HEADER_FIXED = struct.Struct(">8sHHQI")  # magic, version, flags, created_ns, segment
_U64 = struct.Struct(">Q")  # version 2: run_ns, between segment and name
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_RECORD_HEAD = struct.Struct(">HII")
_RECORD_FIXED = struct.Struct(">QIB")
_ROUTE = struct.Struct(">IIIIB")
_STATUS_VALUES = frozenset(int(s) for s in Status)


class LogKind(IntEnum):
    """Record kinds (JETLOG.md 4)."""

    FRAME_IN = 0x01  # data: one whole frame received from the connection
    FRAME_OUT = 0x02  # data: one whole frame sent to the connection
    CONN_OPEN = 0x03  # data: address:str16
    CONN_CLOSE = 0x04  # data: status:u8 | reason:str16
    CONN_NAME = 0x05  # data: name:str16 (the peer's INFO named it)
    CONN_SNAPSHOT = 0x06  # data: address:str16 | name:str16 (open at segment start)
    ROUTE = 0x07  # data: requester conn,id | owner conn,id | function | key:str16
    CONN_AUTH = 0x08  # data: method:u8 | user:str16 (never a password; PROTOCOL.md 15.2)


@dataclass(frozen=True, slots=True)
class LogHeader:
    """Segment file header (JETLOG.md 2).

    ``run_ns`` (version 2) names the daemon run: the ``created_ns`` of its first
    segment; read from a version-1 file it is None (the reader infers the run). Writing
    version 2 without ``run_ns``: segment 0 starts its run (``run_ns`` is
    ``created_ns``); a later segment's run is unknown, so it is written as version 1
    rather than with a wrong run.
    """

    name: str
    created_ns: int
    segment: int = 0
    version: int = FORMAT_VERSION
    flags: int = 0
    size: int = 0  # bytes the header occupies in the file (set by the reader)
    run_ns: Optional[int] = None


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record (JETLOG.md 3); ``offset`` is where it starts in the file."""

    ts_ns: int
    conn_id: int
    kind: int
    data: bytes
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Corruption:
    """Bytes ``[offset, offset + length)`` are not valid records and were skipped."""

    offset: int
    length: int
    reason: str


@dataclass(frozen=True, slots=True)
class Truncation:
    """The input ends inside a record (a writer still writing, or one that crashed)."""

    offset: int
    present: int
    needed: int


LogItem = Union[LogHeader, LogRecord, Corruption]

_new = object.__new__
_SET_TS, _SET_CONN, _SET_KIND, _SET_DATA, _SET_OFFSET = (
    getattr(LogRecord, name).__set__ for name in ("ts_ns", "conn_id", "kind", "data", "offset")
)


def _str16(text: str, what: str) -> bytes:
    """A str16 (JETLOG.md: as in PROTOCOL.md 5.1), checked by the same rule as the codec's."""
    raw = _str16_bytes(text, what)
    return _U16.pack(len(raw)) + raw


def encode_header(header: LogHeader) -> bytes:
    """Encode a segment header, CRC included (JETLOG.md 2).

    Raises:
        LocalProtocolError: if a field does not fit its width or the name is too long.
    """
    version = header.version
    if version not in READ_VERSIONS:
        raise LocalProtocolError(f"cannot write jet log version {version!r}")
    if version == 2 and header.run_ns is None and header.segment != 0:
        version = 1  # the run is unknown: let readers infer it rather than state a wrong one
    try:
        head = _HEADER_FIXED.pack(MAGIC, version, header.flags, header.created_ns, header.segment)
        if version >= 2:
            head += _U64.pack(header.created_ns if header.run_ns is None else header.run_ns)
    except struct.error as exc:
        raise LocalProtocolError(f"log header field out of range ({exc})") from None
    head += _str16(header.name, "name")
    return head + _U32.pack(zlib.crc32(head))


def encode_record(ts_ns: int, conn_id: int, kind: int, data: bytes) -> bytes:
    """Encode one record: marker, length, CRC-32 over length and body, body (JETLOG.md 3).

    Args:
        ts_ns: nanoseconds since the Unix epoch (u64).
        conn_id: the daemon's connection id (u32; 0 is the daemon itself).
        kind: a :class:`LogKind` (u8).
        data: the kind's data (a whole frame, or one of the ``*_data`` helpers' output).

    Raises:
        LocalProtocolError: if a field does not fit its width.
    """
    try:
        body = _RECORD_FIXED.pack(ts_ns, conn_id, kind) + data
    except struct.error as exc:
        raise LocalProtocolError(f"log record field out of range ({exc})") from None
    except TypeError:
        raise LocalProtocolError(f"record data must be bytes, got {type(data).__name__}") from None
    if len(body) > 0xFFFF_FFFF:
        raise LocalProtocolError("log record longer than 2**32 - 1 bytes")
    length = _U32.pack(len(body))
    return _U16.pack(RECORD_MARKER) + length + _U32.pack(zlib.crc32(body, zlib.crc32(length))) + body


# --- record data helpers (JETLOG.md 4) ----------------------------------------------


def conn_open_data(address: str) -> bytes:
    """CONN_OPEN data: ``address:str16`` (JETLOG.md 4). Raises LocalProtocolError if too long."""
    return _str16(address, "address")


def conn_close_data(status: int, reason: str) -> bytes:
    """CONN_CLOSE data: ``status:u8 | reason:str16`` (JETLOG.md 4).

    Raises:
        LocalProtocolError: for an unknown status or a reason over 65535 bytes.
    """
    if status not in _STATUS_VALUES:
        raise LocalProtocolError(f"unknown status {status!r}")  # PROTOCOL.md 8
    return bytes((status,)) + _str16(reason, "reason")


def conn_name_data(name: str) -> bytes:
    """CONN_NAME data: ``name:str16`` (JETLOG.md 4). Raises LocalProtocolError if too long."""
    return _str16(name, "name")


def conn_snapshot_data(address: str, name: str) -> bytes:
    """CONN_SNAPSHOT data: ``address:str16 | name:str16`` (JETLOG.md 4)."""
    return _str16(address, "address") + _str16(name, "name")


def conn_auth_data(method: int, user: str) -> bytes:
    """CONN_AUTH data: ``method:u8 | user:str16`` (JETLOG.md 4): 1 password, 2 certificate.

    Raises:
        LocalProtocolError: for a method outside u8 or a user name over 65535 bytes.
    """
    if not 0 <= method <= 0xFF:
        raise LocalProtocolError(f"CONN_AUTH method out of range: {method}")
    return bytes((method,)) + _str16(user, "user")


def route_data(requester_conn: int, requester_id: int, owner_conn: int, owner_id: int, function: int, key: str) -> bytes:
    """ROUTE data (JETLOG.md 4): requester and owner (connection, request id), function, key.

    Raises:
        LocalProtocolError: if a number does not fit its width or the key is too long.
    """
    try:
        head = _ROUTE.pack(requester_conn, requester_id, owner_conn, owner_id, function)
    except struct.error as exc:
        raise LocalProtocolError(f"ROUTE field out of range ({exc})") from None
    return head + _str16(key, "key")


def _read_str16(data: bytes, off: int) -> tuple[str, int]:
    if len(data) - off < 2:
        raise RemoteProtocolError("str16 length truncated")
    (n,) = _U16.unpack_from(data, off)
    if off + 2 + n > len(data):
        raise RemoteProtocolError(f"str16 length {n} runs past the record")
    try:
        return data[off + 2 : off + 2 + n].decode("utf-8"), off + 2 + n
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"str16 is not valid UTF-8 ({exc.reason})") from None


def parse_record_data(kind: int, data: bytes) -> dict[str, object]:
    """Decode the ``data`` of a non-frame record into named fields.

    Raises:
        RemoteProtocolError: if the data does not match its kind's layout.
    """
    fields: dict[str, object]
    if kind == LogKind.CONN_OPEN:
        address, off = _read_str16(data, 0)
        fields = {"address": address}
    elif kind == LogKind.CONN_CLOSE:
        if not data:
            raise RemoteProtocolError("CONN_CLOSE without status")
        try:
            status: object = Status(data[0])
        except ValueError:
            status = data[0]
        reason, off = _read_str16(data, 1)
        fields = {"status": status, "reason": reason}
    elif kind == LogKind.CONN_NAME:
        name, off = _read_str16(data, 0)
        fields = {"name": name}
    elif kind == LogKind.CONN_SNAPSHOT:
        address, off = _read_str16(data, 0)
        name, off = _read_str16(data, off)
        fields = {"address": address, "name": name}
    elif kind == LogKind.CONN_AUTH:
        if not data:
            raise RemoteProtocolError("CONN_AUTH without method")
        user, off = _read_str16(data, 1)
        fields = {"method": data[0], "user": user}
    elif kind == LogKind.ROUTE:
        if len(data) < _ROUTE.size:
            raise RemoteProtocolError("ROUTE record truncated")
        rconn, rid, oconn, oid, function = _ROUTE.unpack_from(data, 0)
        key, off = _read_str16(data, _ROUTE.size)
        fields = {
            "requester_conn": rconn,
            "requester_id": rid,
            "owner_conn": oconn,
            "owner_id": oid,
            "function": function,
            "key": key,
        }
    else:
        raise RemoteProtocolError(f"record kind 0x{kind:02X} has no structured data")
    if off != len(data):
        raise RemoteProtocolError(f"{len(data) - off} trailing byte(s) in {LogKind(kind).name} data")
    return fields


# --- the segment header ------------------------------------------------------------


class LogHeaderIncomplete(RemoteProtocolError):
    """The bytes end inside the segment header: not damage, just too few bytes yet (a
    file being created). ``needed`` is how many bytes the header needs in all, as far
    as the bytes present tell (at least that many)."""

    def __init__(self, message: str, needed: int) -> None:
        super().__init__(message)
        self.needed = needed


def decode_header(data: Union[bytes, bytearray, memoryview, mmap]) -> LogHeader:
    """Decode the segment header at the start of ``data`` (JETLOG.md 2).

    Args:
        data: the file's first bytes (bytes, bytearray, memoryview or mmap); bytes after
            the header are ignored.

    Returns:
        The header; its ``size`` is the file offset where the first record starts.

    Raises:
        LogHeaderIncomplete: (a :class:`RemoteProtocolError`) if ``data`` ends inside
            the header while what is there is sound so far.
        RemoteProtocolError: for a bad magic, an unsupported version, a header CRC
            mismatch or a name that is not UTF-8.
    """
    have = len(data)
    if bytes(data[: min(len(MAGIC), have)]) != MAGIC[: min(len(MAGIC), have)]:
        raise RemoteProtocolError("not a jet event log: bad magic")
    if have < _HEADER_FIXED.size:
        raise LogHeaderIncomplete(f"jet log ends inside its header ({have} bytes)", _HEADER_FIXED.size + 2)
    _magic, version, flags, created_ns, segment = _HEADER_FIXED.unpack_from(data, 0)
    if version not in READ_VERSIONS:
        raise RemoteProtocolError(f"unsupported jet log version {version}")
    run_ns: Optional[int] = None
    name_at = _HEADER_FIXED.size
    if version >= 2:  # JETLOG.md 2: run_ns sits between segment and name
        name_at += _U64.size
    fixed = name_at + 2  # up to and including the name's length
    if have < fixed:
        raise LogHeaderIncomplete(f"jet log ends inside its header ({have} bytes)", fixed)
    if version >= 2:
        (run_ns,) = _U64.unpack_from(data, _HEADER_FIXED.size)
    (n,) = _U16.unpack_from(data, name_at)
    size = fixed + n + 4
    if have < size:
        raise LogHeaderIncomplete(f"jet log ends inside its header ({have} of {size} bytes)", size)
    (crc,) = _U32.unpack_from(data, size - 4)
    if crc != zlib.crc32(bytes(data[: size - 4])):
        raise RemoteProtocolError("jet log header CRC mismatch")
    try:
        name = bytes(data[fixed : size - 4]).decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError("jet log header name is not valid UTF-8") from None
    return LogHeader(name, created_ns, segment, version, flags, size, run_ns)


# --- the streaming reader -----------------------------------------------------------


class LogReader:
    """Sans-IO reader of one segment: feed bytes, pull items, then :meth:`finish`.

    Yields the :class:`LogHeader` first, then :class:`LogRecord` items; a damaged region
    becomes one :class:`Corruption` item and reading resumes at the next valid record
    (JETLOG.md 5). A record length above ``max_record`` counts as damage; nothing is
    buffered for it.

    Raises:
        RemoteProtocolError: if the file header is not a valid jet log header.
    """

    def __init__(self, *, max_record: int = DEFAULT_MAX_RECORD) -> None:
        self.max_record = max_record
        self._buf = bytearray()
        self._pos = 0  # index into _buf
        self._base = 0  # file offset of _buf[0]
        self._header: Optional[LogHeader] = None
        self._bad_start: Optional[int] = None  # file offset where damage began
        self._bad_reason = ""
        self._pending: Optional[LogRecord] = None  # the record found right after damage
        self._eof = False

    @property
    def header(self) -> Optional[LogHeader]:
        return self._header

    def feed(self, data: bytes) -> None:
        """Append bytes read from the file."""
        if self._pos > 1 << 20 and self._pos > len(self._buf) // 2:
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        self._buf += data

    def _read_header(self) -> Optional[LogHeader]:
        if len(self._buf) < len(MAGIC):
            return None
        try:
            header = decode_header(self._buf)
        except LogHeaderIncomplete:
            return None
        self._pos = header.size
        return header

    def _record_at(self, pos: int, resyncing: bool = False) -> Union[LogRecord, str, None]:
        """The record at ``pos``, a reason why there is none, or None if incomplete.

        ``resyncing``: ``pos`` is a candidate found by scanning damaged bytes.
        """
        buf = self._buf
        if len(buf) - pos < RECORD_HEAD_SIZE:
            if len(buf) - pos >= 2 and _U16.unpack_from(buf, pos)[0] != RECORD_MARKER:
                return "bad record marker"
            return None
        marker, length, crc = _RECORD_HEAD.unpack_from(buf, pos)
        if marker != RECORD_MARKER:
            return "bad record marker"
        if length < RECORD_FIXED_SIZE or length > self.max_record:
            return f"implausible record length {length}"
        end = pos + RECORD_HEAD_SIZE + length
        if end > len(buf):
            return None
        if resyncing and end + 2 <= len(buf) and (buf[end] != 0x4A or buf[end + 1] != 0x52):
            # JETLOG.md 5: a candidate must be followed by a marker (or the end) before
            # its CRC is worth computing; damage full of "JR" bytes with large lengths
            # would otherwise cost a CRC of up to max_record bytes per candidate.
            return "no record follows the candidate"
        # JETLOG.md 3: the CRC covers the 4 length bytes, then the body.
        if zlib.crc32(buf[pos + RECORD_HEAD_SIZE : end], zlib.crc32(buf[pos + 2 : pos + 6])) != crc:
            return "record CRC mismatch"
        ts_ns, conn_id, kind = _RECORD_FIXED.unpack_from(buf, pos + RECORD_HEAD_SIZE)
        # Built like the wire decoder builds messages (the frozen dataclass __init__
        # costs more than the rest of the record's parsing).
        record = _new(LogRecord)
        _SET_TS(record, ts_ns)
        _SET_CONN(record, conn_id)
        _SET_KIND(record, kind)
        _SET_DATA(record, bytes(buf[pos + RECORD_HEAD_SIZE + RECORD_FIXED_SIZE : end]))
        _SET_OFFSET(record, self._base + pos)
        return record

    def feed_eof(self) -> None:
        """Say that the input has ended: :meth:`items` then also yields the final
        :class:`Truncation` or :class:`Corruption`, and records that follow damage
        whose length pointed past the end of the file (JETLOG.md 5)."""
        self._eof = True

    def _valid_record_after(self, pos: int) -> bool:
        """True if a complete, CRC-valid record starts anywhere after ``pos``."""
        buf = self._buf
        nxt = buf.find(b"\x4a\x52", pos + 1)
        while nxt >= 0:
            if isinstance(self._record_at(nxt, resyncing=True), LogRecord):
                return True
            nxt = buf.find(b"\x4a\x52", nxt + 1)
        return False

    def next_item(self) -> Optional[Union[LogItem, Truncation]]:
        """The next header, record or damage report; None if more bytes are needed
        (or, after :meth:`feed_eof`, when everything has been reported).

        Raises:
            RemoteProtocolError: if the file header is invalid, or the input ended
                inside it.
        """
        if self._header is None:
            self._header = self._read_header()
            if self._header is None and self._eof:
                raise RemoteProtocolError(f"jet log ends inside its header ({len(self._buf)} bytes)")
            return self._header
        if self._pending is not None:
            record, self._pending = self._pending, None
            return record
        buf = self._buf
        while True:
            pos = self._pos
            found = self._record_at(pos, self._bad_start is not None)
            if found is None:
                if not self._eof:
                    return None
                if pos >= len(buf):
                    if self._bad_start is None:
                        return None
                    report = Corruption(self._bad_start, self._base + pos - self._bad_start, self._bad_reason)
                    self._bad_start = None
                    return report
                # JETLOG.md 5: at the end of the input an incomplete record is a
                # truncated last record, unless valid records follow it: then its
                # length field was damaged, and it is damage like any other.
                if self._bad_start is None and not self._valid_record_after(pos):
                    self._pos = len(buf)
                    remaining = len(buf) - pos
                    needed = RECORD_HEAD_SIZE
                    if remaining >= RECORD_HEAD_SIZE:
                        needed += _RECORD_HEAD.unpack_from(buf, pos)[1]
                    return Truncation(self._base + pos, remaining, needed)
                found = "record runs past the end of the input"
            if isinstance(found, LogRecord):
                self._pos = pos + RECORD_HEAD_SIZE + len(found.data) + RECORD_FIXED_SIZE
                if self._bad_start is not None:
                    report = Corruption(self._bad_start, self._base + pos - self._bad_start, self._bad_reason)
                    self._bad_start = None
                    self._pending = found
                    return report
                return found
            # Damage: remember where it began, then look for the next marker.
            if self._bad_start is None:
                self._bad_start = self._base + pos
                self._bad_reason = found
            nxt = buf.find(b"\x4a\x52", pos + 1)
            if nxt >= 0:
                self._pos = nxt
            elif self._eof:
                self._pos = len(buf)
            else:
                # Keep the last byte: it may be the first half of the next marker.
                self._pos = max(pos + 1, len(buf) - 1)
                return None

    def items(self) -> Iterator[Union[LogItem, Truncation]]:
        """Iterate over everything complete in the bytes fed so far (after
        :meth:`feed_eof`: everything, final reports included)."""
        while True:
            yield from self._sound_records()
            item = self.next_item()
            if item is None:
                return
            yield item

    def _sound_records(self) -> Iterator[LogRecord]:
        """:meth:`record_tuples` as :class:`LogRecord` items, parsed inline (one
        generator less per record: measured 1.5x faster than wrapping it). Built like the
        wire decoder builds messages: the frozen dataclass ``__init__`` costs more than
        the parsing. Keep the checks identical to :meth:`record_tuples`'."""
        if self._header is None or self._pending is not None or self._bad_start is not None:
            return
        buf = self._buf  # feed() grows and compacts this same object in place
        head = _RECORD_HEAD.unpack_from
        fixed = _RECORD_FIXED.unpack_from
        crc32 = zlib.crc32
        new = _new
        set_ts, set_conn, set_kind, set_data, set_offset = _SET_TS, _SET_CONN, _SET_KIND, _SET_DATA, _SET_OFFSET
        max_record = self.max_record
        while True:
            pos = self._pos  # re-read: the caller may feed or pull between records
            if len(buf) - pos < RECORD_HEAD_SIZE + RECORD_FIXED_SIZE:
                return
            marker, length, crc = head(buf, pos)
            end = pos + RECORD_HEAD_SIZE + length
            if marker != RECORD_MARKER or length < RECORD_FIXED_SIZE or length > max_record or end > len(buf):
                return  # next_item() judges it: incomplete, or damage
            body = buf[pos + RECORD_HEAD_SIZE : end]
            if crc32(body, crc32(buf[pos + 2 : pos + 6])) != crc:
                return
            ts_ns, conn_id, kind = fixed(body, 0)
            record = new(LogRecord)
            set_ts(record, ts_ns)
            set_conn(record, conn_id)
            set_kind(record, kind)
            set_data(record, bytes(body[RECORD_FIXED_SIZE:]))
            set_offset(record, self._base + pos)
            self._pos = end
            yield record

    def record_tuples(self) -> Iterator[tuple[int, int, int, bytes, int]]:
        """The bulk reader's fast path: ``(ts_ns, conn_id, kind, data, offset)`` of each
        complete, valid record from the current position on, as plain tuples.

        Stops, without consuming it, at the first thing that is not such a record: the
        file header (not read yet), a damaged or incomplete record, a record queued
        behind damage. Call :meth:`next_item` then (it reports that thing exactly as
        :meth:`items` would), and come back here after it::

            while True:
                for ts_ns, conn_id, kind, data, offset in reader.record_tuples():
                    ...
                item = reader.next_item()
                if item is None:
                    break
                ...

        :meth:`items` gives the same records as :class:`LogRecord` objects, in the same
        order, interleaved with everything else.
        """
        if self._header is None or self._pending is not None or self._bad_start is not None:
            return
        buf = self._buf  # feed() grows and compacts this same object in place
        head = _RECORD_HEAD.unpack_from
        fixed = _RECORD_FIXED.unpack_from
        crc32 = zlib.crc32
        max_record = self.max_record
        while True:
            pos = self._pos  # re-read: the caller may feed or pull between records
            if len(buf) - pos < RECORD_HEAD_SIZE + RECORD_FIXED_SIZE:
                return
            marker, length, crc = head(buf, pos)
            end = pos + RECORD_HEAD_SIZE + length
            if marker != RECORD_MARKER or length < RECORD_FIXED_SIZE or length > max_record or end > len(buf):
                return  # next_item() judges it: incomplete, or damage
            # JETLOG.md 3: the CRC covers the 4 length bytes, then the body.
            body = buf[pos + RECORD_HEAD_SIZE : end]
            if crc32(body, crc32(buf[pos + 2 : pos + 6])) != crc:
                return
            ts_ns, conn_id, kind = fixed(body, 0)
            self._pos = end
            yield ts_ns, conn_id, kind, bytes(body[RECORD_FIXED_SIZE:]), self._base + pos

    def finish(self) -> Optional[Union[Corruption, Truncation]]:
        """Call at end of input, after draining :meth:`items`: the damage or truncated
        record left at the end, if any.

        Records found behind that damage (possible when a damaged length pointed past
        the end of the file) stay queued: drain :meth:`items` again to get them, or use
        :meth:`feed_eof` and :meth:`items` (as :func:`iter_log` does) instead.

        Raises:
            RemoteProtocolError: if the input ended inside the file header.
        """
        self.feed_eof()
        item = self.next_item()
        if item is None or isinstance(item, (Corruption, Truncation)):
            return item
        self._pending = item  # type: ignore[assignment]
        return None


def iter_log(stream: BinaryIO, *, chunk_size: int = 1 << 20, max_record: int = DEFAULT_MAX_RECORD) -> Iterator[Union[LogItem, Truncation]]:
    """Read a whole segment from a binary file object: header, records, damage reports,
    and a final :class:`Truncation` if the file ends inside a record."""
    reader = LogReader(max_record=max_record)
    while True:
        chunk = stream.read(chunk_size)
        if not chunk:
            break
        reader.feed(chunk)
        yield from reader.items()
    reader.feed_eof()
    yield from reader.items()
