"""jet event-log segments (spec/JETLOG.md) as input events, read with :mod:`jetwire.log`.

Streams are connection ids: FRAME_IN is direction 0 (peer -> daemon), FRAME_OUT
direction 1. Segments of one daemon run continue each other's connection ids; a segment
numbered 0 starts a new run, whose streams are numbered ``run * RUN_STREAM_STRIDE +
conn_id`` so that connections of different runs never mix.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from typing import Optional

from jetwire import RemoteProtocolError
from jetwire.log import MAGIC
from jetwire.log import Corruption
from jetwire.log import LogHeader
from jetwire.log import LogHeaderIncomplete
from jetwire.log import LogKind
from jetwire.log import LogReader
from jetwire.log import LogRecord
from jetwire.log import Truncation
from jetwire.log import decode_header
from jetwire.log import parse_record_data

from .events import Event
from .events import FrameBatch
from .events import FrameTuple
from .events import InputError
from .events import Note
from .events import Open
from .events import WholeFrame

RUN_STREAM_STRIDE = 1_000_000
_FRAME_KINDS = {int(LogKind.FRAME_IN): 0, int(LogKind.FRAME_OUT): 1}  # kind -> direction
_FRAME_DIRECTIONS = [_FRAME_KINDS.get(kind) for kind in range(256)]  # the same, by index
READ_CHUNK = 1 << 20


def is_log(head: bytes) -> bool:
    """True if ``head`` starts with the jet event-log magic (JETLOG.md 2)."""
    return head[:8] == MAGIC


def is_cut_log(head: bytes, path: Path) -> bool:
    """True if a file whose whole content is ``head`` (shorter than the magic) is a
    segment cut inside its magic: a start of the magic, or nothing at all in a
    ``*.jetlog`` file (a daemon killed right after it created the segment)."""
    return len(head) < len(MAGIC) and MAGIC.startswith(head) and (len(head) > 0 or path.suffix == ".jetlog")


def cut_header_message(path: Path, size: int) -> str:
    """The damage report of a segment that ends after ``size`` bytes, inside its magic."""
    return f"{path.name}: damaged segment header: ends after {size} of at least {len(MAGIC)} bytes; segment skipped"


def expand_log_paths(spec: str) -> list[Path]:
    """A file, a directory (its ``*.jetlog`` files, or failing that every file that
    starts with the log magic, in name order) or a glob.

    Raises:
        InputError: if nothing matches or a path does not exist.
    """
    if any(ch in spec for ch in "*?["):
        paths = [Path(p) for p in sorted(glob.glob(spec)) if os.path.isfile(p)]
        if not paths:
            raise InputError(f"{spec}: no file matches")
        return paths
    path = Path(spec)
    if path.is_dir():
        paths = sorted(p for p in path.iterdir() if p.is_file() and p.suffix == ".jetlog")
        if not paths:
            paths = sorted(p for p in path.iterdir() if p.is_file() and _starts_with_magic(p))
        if not paths:
            raise InputError(f"{spec}: directory holds no jet event-log segment")
        return paths
    if not path.exists():
        raise InputError(f"{spec}: no such file or directory")
    return [path]


def _starts_with_magic(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return is_log(f.read(8))
    except OSError:
        return False


class LogSource:
    """Reads segments one after another; keeps run and connection bookkeeping.

    ``damaged_headers`` collects the report of every segment skipped for a damaged
    header, ``damaged_regions`` counts the damaged regions skipped inside segments.
    """

    def __init__(self) -> None:
        self.run = -1
        self.opened: set[int] = set()
        self.daemon = "jetd"
        self.damaged_headers: list[str] = []
        self.damaged_regions = 0

    def damaged_header(self, message: str) -> Note:
        """Record a segment skipped for its damaged header; returns its note."""
        self.damaged_headers.append(message)
        return Note(None, None, "log-damage", message)

    def read(self, path: Path, wait: Optional[Callable[[], bool]] = None) -> Iterator[Event]:
        """Yield one segment's events.

        A segment whose header is damaged (cut short, CRC mismatch, name not UTF-8) is
        rejected as JETLOG.md 2 requires: it yields one ``log-damage`` note, is added
        to :attr:`damaged_headers`, and nothing else of it is read.

        Raises:
            InputError: if the file cannot be opened, or its header has a version this
                reader does not know (it may be sound, and newer than this jetdump).
        """
        reader = LogReader()
        try:
            stream = open(path, "rb")  # noqa: SIM115 - closed by the with below, opened apart to report OSError
        except OSError as exc:
            raise InputError(f"{path}: {exc.strerror}") from None
        with stream:
            try:
                while True:
                    chunk = stream.read(READ_CHUNK)
                    if not chunk:
                        if wait is not None and wait():
                            continue  # following a growing segment: more may come
                        break
                    reader.feed(chunk)
                    opened = self.opened
                    frame_directions = _FRAME_DIRECTIONS
                    stride = max(self.run, 0) * RUN_STREAM_STRIDE
                    batch: list[FrameTuple] = []
                    while True:
                        # FRAME_IN / FRAME_OUT of known connections are nearly all records:
                        # read as plain tuples and gathered into one FrameBatch per chunk, as
                        # plain tuples too (the fields of a WholeFrame).
                        for ts_ns, conn_id, kind, data, offset in reader.record_tuples():
                            direction = frame_directions[kind]
                            conn_stream = stride + conn_id
                            if direction is not None and conn_stream in opened:
                                batch.append((conn_stream, direction, ts_ns / 1e9, data, offset))
                                continue
                            if batch:
                                yield FrameBatch(batch)
                                batch = []
                            yield from self._item(path, LogRecord(ts_ns, conn_id, kind, data, offset))
                            stride = max(self.run, 0) * RUN_STREAM_STRIDE
                        item = reader.next_item()  # the header, damage, or the end of the chunk
                        if item is None:
                            break
                        if batch:
                            yield FrameBatch(batch)
                            batch = []
                        yield from self._item(path, item)
                        stride = max(self.run, 0) * RUN_STREAM_STRIDE
                    if batch:
                        yield FrameBatch(batch)
                tail = reader.finish()
            except RemoteProtocolError as exc:
                if reader.header is not None or "version" in exc.message:
                    raise InputError(f"{path}: {exc.message}") from None
                yield self.damaged_header(f"{path.name}: damaged segment header: {_header_damage(stream, exc)}; segment skipped")
                return
            if tail is not None:
                yield from self._item(path, tail)

    def _stream(self, conn_id: int, *, complete: bool = False) -> tuple[int, Optional[Open]]:
        """The stream of a connection id, and its Open event the first time."""
        stream = max(self.run, 0) * RUN_STREAM_STRIDE + conn_id
        if stream in self.opened:
            return stream, None
        self.opened.add(stream)
        label = f"c{conn_id}" if self.run <= 0 else f"r{self.run}c{conn_id}"
        return stream, Open(stream, (label, self.daemon), complete)

    def _item(self, path: Path, item: object) -> Iterator[Event]:
        if isinstance(item, LogRecord):
            ts = item.ts_ns / 1e9
            kind = item.kind
            stream, opened = self._stream(item.conn_id, complete=kind == LogKind.CONN_OPEN)
            if opened is not None:
                yield opened
            if kind == LogKind.FRAME_IN or kind == LogKind.FRAME_OUT:
                yield WholeFrame(stream, 0 if kind == LogKind.FRAME_IN else 1, ts, item.data, item.offset)
                return
            about = route_to = None
            if kind == LogKind.ROUTE:
                # The note is about the routed request: the requester's frame (filters
                # keep it with that frame).
                try:
                    fields = parse_record_data(kind, item.data)
                    requester, opened = self._stream(int(str(fields["requester_conn"])))
                    if opened is not None:
                        yield opened
                    owner, opened = self._stream(int(str(fields["owner_conn"])))
                    if opened is not None:
                        yield opened
                    about = (requester, int(str(fields["requester_id"])))
                    route_to = (owner, int(str(fields["owner_id"])))
                except RemoteProtocolError:
                    pass
            yield Note(stream, ts, _note_kind(kind), _describe(kind, item.data), about, route_to)
        elif isinstance(item, LogHeader):
            if item.segment == 0 or self.run < 0:
                self.run += 1
            self.daemon = item.name or "jetd"
            run = "" if item.run_ns is None else f", run {item.run_ns}"  # JETLOG.md 2 version 2
            yield Note(None, item.created_ns / 1e9, "log-segment",
                       f"{path.name}: segment {item.segment} of {item.name!r}{run}")
        elif isinstance(item, Corruption):
            self.damaged_regions += 1
            yield Note(None, None, "log-damage",
                       f"{path.name}: damage at offset {item.offset}: {item.length} byte(s) skipped ({item.reason})")
        elif isinstance(item, Truncation):
            yield Note(None, None, "log-truncated",
                       f"{path.name}: ends inside a record at offset {item.offset}: "
                       f"{item.present} of {item.needed} bytes present")


def _header_damage(stream: IO[bytes], exc: RemoteProtocolError) -> str:
    """What is wrong with a header the reader rejected, with the sizes when it is cut."""
    stream.seek(0)
    head = stream.read(1 << 17)  # the longest header: a 65,535-byte name and change
    try:
        decode_header(head)
    except LogHeaderIncomplete as incomplete:
        return f"ends after {len(head)} of at least {incomplete.needed} bytes"
    except RemoteProtocolError as other:
        return other.message.removeprefix("jet log ")
    return exc.message.removeprefix("jet log ")


def _note_kind(kind: int) -> str:
    try:
        return LogKind(kind).name.lower().replace("_", "-")
    except ValueError:
        return "unknown-record"


def _describe(kind: int, data: bytes) -> str:
    try:
        fields = parse_record_data(kind, data)
    except RemoteProtocolError as exc:
        try:
            name = LogKind(kind).name
        except ValueError:
            return f"record of unknown kind 0x{kind:02X} ({len(data)} bytes) skipped"
        return f"{name}: malformed record data ({exc.message})"
    if kind == LogKind.CONN_OPEN:
        return f"connection opened from {fields['address']}"
    if kind == LogKind.CONN_CLOSE:
        status = fields["status"]
        name = getattr(status, "name", str(status))
        return f"connection closed: {name} {fields['reason']!r}"
    if kind == LogKind.CONN_NAME:
        return f"peer named itself {fields['name']!r}"
    if kind == LogKind.CONN_SNAPSHOT:
        return f"connection already open from {fields['address']} ({fields['name']!r})"
    if kind == LogKind.CONN_AUTH:
        how = {1: "password", 2: "client certificate"}.get(int(str(fields["method"])), f"method {fields['method']}")
        return f"authenticated as {fields['user']!r} ({how})"
    if kind == LogKind.ROUTE:
        from .render import FUNCTION_NAMES
        from .render import code_name

        return (
            f"routed {code_name(FUNCTION_NAMES, int(str(fields['function'])))} key={fields['key']!r}: "
            f"c{fields['requester_conn']} id={fields['requester_id']} -> "
            f"c{fields['owner_conn']} id={fields['owner_id']}"
        )
    return str(fields)
