"""pcap / pcapng captures: TCP reassembly per direction, Jet stream detection.

:mod:`.packets` reads the capture files (from files or pipes); link, IP and TCP headers
are sliced with ``struct`` here because building dpkt's packet objects costs ~10 us a
packet (NOTES.md).

Reassembly follows the sequence numbers of each direction: retransmitted and overlapping
bytes are delivered once, out-of-order segments wait for the bytes before them, and
bytes that never appear become a :class:`~tools.jetdump.events.Gap`. The sequence
numbers say when bytes were sent that the capture does not hold: the other side's ACK
acknowledges them, a FIN follows them, or a packet cut by the snaplen lacks its tail;
those are gaps at once, at the packet that shows them. A hole before a later segment
may still be filled by a retransmission or a reordered segment: it becomes a gap once
an ACK covers it, or when it is still open after ``DEFAULT_HOLE_BYTES`` of later data,
``DEFAULT_HOLE_SECONDS`` of capture time, or at the end of the stream. Nothing is guessed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from collections.abc import Iterator
from typing import BinaryIO
from typing import Optional

from jetwire import RemoteProtocolError
from jetwire import decode_frame

from .events import Data
from .events import DataBatch
from .events import DataTuple
from .events import End
from .events import Event
from .events import Gap
from .events import Note
from .events import Open
from .events import Origin
from .packets import CaptureTruncated
from .packets import read_packets

DEFAULT_JET_PORT = 11124  # PROTOCOL.md 3
DEFAULT_HOLE_BYTES = 4 * 1024 * 1024  # out-of-order bytes held per direction before a hole is a gap
DEFAULT_HOLE_SECONDS = 5.0  # capture time a hole may stay open (several TCP RTOs)

PCAP_MAGICS = {b"\xa1\xb2\xc3\xd4", b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\x3c\x4d", b"\x4d\x3c\xb2\xa1"}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"

_U16 = struct.Struct(">H")
_U32_LE = struct.Struct("<I")

_SYN, _FIN, _RST, _ACK = 0x02, 0x01, 0x04, 0x10
_U32 = struct.Struct(">I")
DATA_BATCH = 1024  # in-order data packets per DataBatch event
HEURISTIC_BYTES = 64 * 1024  # first bytes of each direction looked at to decide a stream is jet
HEURISTIC_MAX_FRAME = 16 * 1024 * 1024  # a first frame announcing more is not taken as jet


def is_capture(head: bytes) -> bool:
    """True if ``head`` (the first 4 bytes of a file) starts a pcap or pcapng file."""
    return head[:4] in PCAP_MAGICS or head[:4] == PCAPNG_MAGIC


def _ip_offset(linktype: int, buf: bytes) -> int:
    """Offset of the IP packet inside a link-layer frame, or -1 for anything else."""
    if linktype == 1:  # Ethernet
        if len(buf) < 14:
            return -1
        off = 12
        (etype,) = _U16.unpack_from(buf, off)
        while etype in (0x8100, 0x88A8) and len(buf) >= off + 6:  # VLAN tags
            off += 4
            (etype,) = _U16.unpack_from(buf, off)
        return off + 2 if etype in (0x0800, 0x86DD) else -1
    if linktype in (0, 108):  # BSD loopback: 4-byte address family
        return 4
    if linktype in (101, 12, 14, 228, 229):  # raw IP
        return 0
    if linktype == 113:  # Linux cooked v1
        return 16 if len(buf) >= 16 and _U16.unpack_from(buf, 14)[0] in (0x0800, 0x86DD) else -1
    if linktype == 276:  # Linux cooked v2
        return 20 if len(buf) >= 20 and _U16.unpack_from(buf, 0)[0] in (0x0800, 0x86DD) else -1
    return -1


def _addr(ip: bytes, port: int) -> str:
    if len(ip) == 4:
        return f"{ip[0]}.{ip[1]}.{ip[2]}.{ip[3]}:{port}"
    import ipaddress

    return f"[{ipaddress.IPv6Address(ip)}]:{port}"


# A piece of a reassembled direction: (is_gap, size, data, time and packet of the
# segment that carried the data; None for a gap, which takes the time of its loss).
Piece = tuple[bool, int, bytes, Optional[float], Optional[int]]


class _Direction:
    """Reassembly state of one direction of a TCP connection."""

    __slots__ = ("base", "ended", "fin", "fin_at", "held", "held_at", "held_bytes", "hole_packet", "hole_since",
                 "last_ts", "next", "retransmitted")

    def __init__(self) -> None:
        self.base: Optional[int] = None  # absolute sequence number of relative offset 0
        self.next = 0  # relative offset of the next byte to deliver
        self.held: dict[int, bytes] = {}  # out-of-order segments by relative offset
        self.held_at: dict[int, tuple[float, int]] = {}  # their time and packet number
        self.held_bytes = 0
        self.hole_since: Optional[float] = None  # arrival of the first segment after a hole
        self.hole_packet: Optional[int] = None  # and its packet number
        self.last_ts: Optional[float] = None  # the direction's last packet
        self.fin = False
        self.fin_at: Optional[int] = None  # relative offset of the FIN: no byte is sent after it
        self.ended = False
        self.retransmitted = 0

    def relative(self, seq: int) -> int:
        assert self.base is not None
        # Unwrap the 32-bit sequence number around the next expected offset.
        diff = (seq - self.base - self.next) & 0xFFFF_FFFF
        if diff >= 0x8000_0000:
            diff -= 0x1_0000_0000
        return self.next + diff

    def accept(self, rel: int, payload: bytes, out: list[Piece], ts: float, packet: int) -> None:
        """Deliver what is in order: ``out`` gets pieces; ``ts`` and ``packet``: the
        segment's (kept with it while it waits for the bytes before it)."""
        end = rel + len(payload)
        if end <= self.next:
            self.retransmitted += len(payload)
            return
        if rel < self.next:
            self.retransmitted += self.next - rel
            payload = payload[self.next - rel :]
            rel = self.next
        if rel > self.next:
            old = self.held.get(rel)
            if old is None or len(old) < len(payload):
                self.held_bytes += len(payload) - (len(old) if old else 0)
                self.held[rel] = payload
                self.held_at[rel] = (ts, packet)
            return
        out.append((False, len(payload), payload, ts, packet))
        self.next = end
        self.drain(out, (ts, packet))

    def drain(self, out: list[Piece], filled_by: Optional[tuple[float, int]] = None) -> None:
        """Deliver the held segments that are now in order: at the segment that
        ``filled_by`` the hole before them (as Wireshark attributes a reassembled PDU to
        the packet that completes it), or, after a gap, at their own packets."""
        while self.held:
            first = min(self.held)
            if first > self.next:
                return
            payload = self.held.pop(first)
            ts, packet = self.held_at.pop(first)
            if filled_by is not None:
                ts, packet = filled_by
            self.held_bytes -= len(payload)
            if first + len(payload) <= self.next:
                self.retransmitted += len(payload)
                continue
            payload = payload[self.next - first :]
            out.append((False, len(payload), payload, ts, packet))
            self.next += len(payload)
        self.hole_since = None

    def sent_before(self, limit: int, out: list[Piece]) -> None:
        """The bytes before relative offset ``limit`` were sent (the other side
        acknowledged them, a FIN follows them, a snaplen cut them): what the capture
        does not hold of them is a gap, and the held segments they reach are delivered."""
        while self.next < limit:
            first = min(self.held) if self.held else limit
            if first > self.next:
                end = min(first, limit)
                out.append((True, end - self.next, b"", None, None))
                self.next = end
            self.drain(out)

    def skip_hole(self, out: list[Piece]) -> None:
        """Give up on the bytes before the first held segment: they are a gap."""
        first = min(self.held)
        out.append((True, first - self.next, b"", None, None))
        self.next = first
        self.drain(out)


class _Connection:
    __slots__ = ("client", "closed", "complete", "dirs", "kind", "labels", "pending", "stream")

    def __init__(self, stream: int, client: tuple[bytes, int], server: tuple[bytes, int]) -> None:
        self.stream = stream
        self.client = client
        self.labels = (_addr(*client), _addr(*server))
        self.dirs = (_Direction(), _Direction())
        self.kind: Optional[bool] = None  # True: jet, False: not jet, None: undecided
        self.pending: list[Event] = []  # events held while undecided
        self.closed = False
        self.complete = False  # its SYN is in the capture


def _looks_like_info(data: bytes) -> bool:
    """PROTOCOL.md 4.4: a stream that starts with an INFO frame of major version 1. The
    body may be longer than the 1.0 fields (later minor versions add fields after name)."""
    if len(data) < 7 or data[0] != 0x04:
        return False
    (length,) = _U32.unpack_from(data, 1)
    return 14 <= length <= HEURISTIC_MAX_FRAME and data[5] == 1


def _starts_like_jet(data: bytes, final: bool) -> Optional[bool]:
    """Whether one direction's first bytes start like a jet stream: an INFO of version 1,
    or a whole frame that decodes (PROTOCOL.md 3, 4). None: too few bytes yet."""
    if len(data) >= 7 and data[0] == 0x04:
        return _looks_like_info(data)
    if len(data) < 5:
        return False if final else None
    ftype = data[0]
    (length,) = _U32.unpack_from(data, 1)
    if not 1 <= ftype <= 3 or length > HEURISTIC_MAX_FRAME:
        return False
    end = 5 + length
    if len(data) < end:
        return False if final or len(data) >= HEURISTIC_BYTES else None
    try:
        decode_frame(data[:end])
    except RemoteProtocolError:
        return False
    return True


def read_capture(
    stream: BinaryIO,
    head: bytes = b"",
    *,
    jet_port: int = DEFAULT_JET_PORT,
    heuristic: bool = True,
    hole_bytes: int = DEFAULT_HOLE_BYTES,
    hole_seconds: float = DEFAULT_HOLE_SECONDS,
    on_wait: Callable[[], None] = lambda: None,
    stream_base: int = 0,
    streams_seen: Optional[list[int]] = None,
) -> Iterator[Event]:
    """Yield the Jet streams of a pcap or pcapng capture as events.

    A TCP connection is Jet when either port is ``jet_port`` or (with ``heuristic``)
    when the first bytes of either direction are an INFO frame. Stream numbers count
    TCP connections in order of appearance from 0, as Wireshark's ``tcp.stream`` does.

    Args:
        stream: the capture (a file or a pipe: it is read forward only).
        head: bytes already read from the start of ``stream``.
        on_wait: called before each read from ``stream`` (a live pipe may block there),
            after the events decoded so far have been yielded.
        stream_base: number of the first stream (captures read one after another).
        streams_seen: if given, the number of TCP connections is appended at the end.

    In-order data is yielded in :class:`~tools.jetdump.events.DataBatch` events (one per
    run of consecutive data packets), everything else as single events, in order.

    Raises:
        InputError: if the stream is not a pcap/pcapng capture.
    """
    packets = read_packets(stream, head)
    connections: dict[tuple[bytes, int, bytes, int], _Connection] = {}
    ordered: list[_Connection] = []
    count = 0
    fragments = 0
    last_ts: Optional[float] = None
    truncated: Optional[str] = None
    batch: list[DataTuple] = []
    # (src, sport, dst, dport) of each direction of a jet stream -> (stream, direction,
    # its reassembly state, the other direction's): the per-packet fast path for in-order data.
    in_order: dict[tuple[bytes, int, bytes, int], tuple[int, int, _Direction, _Direction]] = {}
    cut_packets = 0  # packets whose TCP payload the snaplen cut
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            break
        except CaptureTruncated as exc:
            truncated = str(exc)
            break
        if packet is None:  # the reader is about to read (and maybe block): show what we have
            if batch:
                yield DataBatch(batch)
                batch = []
            on_wait()
            continue
        ts, linktype, buf = packet
        count += 1
        if last_ts is None:
            yield Origin(ts)
        last_ts = ts
        # Headers are read in place (offsets into the packet, one copy for the payload).
        if linktype == 1 and buf[12:14] == b"\x08\x00":  # Ethernet, IPv4: the common case
            off = 14
        else:
            off = _ip_offset(linktype, buf)
            if off < 0 or off >= len(buf):
                continue
        version = buf[off] >> 4
        if version == 4:
            if len(buf) - off < 20:
                continue
            # Byte reads rather than struct calls here and for TCP below: compiled (the
            # wheel), they are native reads, several times cheaper (BENCHMARKS.md, jetdump).
            if buf[off + 9] != 6:  # protocol: TCP
                continue
            if (buf[off + 6] << 8 | buf[off + 7]) & 0x3FFF:  # more fragments, or an offset
                fragments += 1
                continue
            total = buf[off + 2] << 8 | buf[off + 3]
            src = buf[off + 12 : off + 16]
            dst = buf[off + 16 : off + 20]
            tcp = off + (buf[off] & 0x0F) * 4
            ip_end = off + total if total else len(buf)  # 0 with TCP segmentation offload
        elif version == 6:
            if len(buf) - off < 40 or buf[off + 6] != 6:
                continue
            (plen,) = _U16.unpack_from(buf, off + 4)
            src, dst = buf[off + 8 : off + 24], buf[off + 24 : off + 40]
            tcp = off + 40
            ip_end = tcp + plen
        else:
            continue
        wire_end = ip_end if ip_end <= len(buf) else len(buf)
        if wire_end - tcp < 20:
            continue
        sport = buf[tcp] << 8 | buf[tcp + 1]
        dport = buf[tcp + 2] << 8 | buf[tcp + 3]
        seq = buf[tcp + 4] << 24 | buf[tcp + 5] << 16 | buf[tcp + 6] << 8 | buf[tcp + 7]
        flags = buf[tcp + 13]
        data_off = tcp + (buf[tcp + 12] >> 4) * 4
        payload = buf[data_off:wire_end]
        key = (src, sport, dst, dport)
        known = in_order.get(key)
        if known is not None and payload and not flags & 0x07 and ip_end == wire_end:  # no SYN, FIN, RST; whole
            half = known[2]
            base = half.base  # never None here: a direction joins in_order once it has one
            other = known[3]
            other_base = other.base
            if (base is not None and not half.held and (seq - base - half.next) & 0xFFFF_FFFF == 0
                    and (other_base is None or not flags & _ACK or (
                        # The ACK acknowledges no byte of the other direction beyond what
                        # the capture holds (else those bytes were lost: the slow path).
                        (buf[tcp + 8] << 24 | buf[tcp + 9] << 16 | buf[tcp + 10] << 8 | buf[tcp + 11])
                        - other_base - other.next - 1) & 0xFFFF_FFFF >= 0x7FFF_FFFF)):
                # The common case: the next in-order bytes of a jet stream, nothing held.
                half.next += len(payload)
                half.last_ts = ts
                batch.append((known[0], known[1], ts, payload, count))
                if len(batch) >= DATA_BATCH:
                    yield DataBatch(batch)
                    batch = []
                continue
        conn = connections.get(key)
        if conn is None or (flags & _SYN and not flags & _ACK and conn.closed):
            if flags & _SYN and flags & _ACK:
                client, server = (dst, dport), (src, sport)
            elif flags & _SYN or dport == jet_port or sport != jet_port:
                client, server = (src, sport), (dst, dport)
            else:
                client, server = (dst, dport), (src, sport)
            conn = _Connection(stream_base + len(ordered), client, server)
            conn.complete = bool(flags & _SYN)
            ordered.append(conn)
            connections[key] = conn
            connections[(dst, dport, src, sport)] = conn
            in_order.pop(key, None)
            in_order.pop((dst, dport, src, sport), None)
            if jet_port in (sport, dport):
                conn.kind = True
                if batch:
                    yield DataBatch(batch)
                    batch = []
                yield Open(conn.stream, conn.labels, conn.complete)
        if conn.kind is False:
            if flags & (_FIN | _RST):
                conn.closed = True  # a later SYN on the same addresses is a new stream
            continue  # not jet: no reassembly work or memory spent on it
        direction = 0 if (src, sport) == conn.client else 1
        half = conn.dirs[direction]
        if conn.kind and half.base is not None and not conn.closed:
            in_order[key] = (conn.stream, direction, half, conn.dirs[1 - direction])
        if flags & _SYN:
            if half.base is None:
                half.base = (seq + 1) & 0xFFFF_FFFF
            payload = b""  # data on SYN (TCP Fast Open) is not followed here
        if half.base is None:
            half.base = seq
        events: list[Event] = []
        other = conn.dirs[1 - direction]
        if flags & _ACK and other.base is not None and not other.ended:
            # Bytes of the other direction that this side acknowledges were sent: what
            # the capture lacks of them is lost, and reported now, before anything this
            # packet says (a response whose request was lost is not unsolicited).
            acked = other.relative(ack_of(buf, tcp))
            if other.fin_at is not None:
                acked = min(acked, other.fin_at)  # the FIN takes a sequence number, no byte
            elif acked == other.next + 1 and not other.held:
                acked = other.next  # one more: the other side's FIN, not captured
            if acked > other.next:
                lost: list[Piece] = []
                # The loss showed at the first segment after the hole, if one came.
                lost_ts, lost_packet = (ts, count) if other.hole_since is None else (other.hole_since, other.hole_packet)
                other.sent_before(acked, lost)
                events.extend(_pieces(conn.stream, 1 - direction, lost, lost_ts, lost_packet))
                if other.fin_at is not None and other.next >= other.fin_at and not other.held:
                    events.extend(_finish(conn, 1 - direction, ts))  # its FIN waited for them
        pieces: list[Piece] = []
        gap_ts = ts
        gap_packet: Optional[int] = count
        half.last_ts = ts
        rel = half.relative(seq)
        cut = ip_end > wire_end and not flags & _SYN
        if payload or cut:
            half.accept(rel, payload, pieces, ts, count)
            if cut:
                # Cut by the snaplen: the tail of this segment was sent but not captured.
                cut_packets += 1
                if cut_packets == 1:
                    events.append(Note(conn.stream, ts, "snaplen",
                                       f"packet {count} was cut by the capture's snaplen: {len(payload)} of "
                                       f"{ip_end - data_off} TCP payload byte(s) captured; the rest is a gap"))
                if half.next >= rel + len(payload):  # in order: its tail is the next hole
                    half.sent_before(rel + ip_end - data_off, pieces)
            if half.held:
                if half.hole_since is None:
                    half.hole_since, half.hole_packet = ts, count
                elif half.held_bytes > hole_bytes or ts - half.hole_since > hole_seconds:
                    # The loss shows when the segment after it came.
                    gap_ts, gap_packet = half.hole_since, half.hole_packet
                    half.skip_hole(pieces)
        if flags & _FIN:
            half.fin_at = rel + len(payload)
            if half.next < half.fin_at and not half.held and half.hole_since is None:
                half.hole_since, half.hole_packet = ts, count  # bytes before the FIN are missing
        events.extend(_pieces(conn.stream, direction, pieces, gap_ts, gap_packet))
        if flags & (_FIN | _RST):
            conn.closed = True
            for d, h in enumerate(conn.dirs):
                if (d == direction or flags & _RST) and not h.ended:
                    if flags & _FIN and d == direction and (half.held or half.next < rel + len(payload)):
                        continue  # the FIN waits for the missing bytes before it
                    events.extend(_finish(conn, d, ts))
        if not events:
            continue
        if batch:
            yield DataBatch(batch)
            batch = []
        if conn.kind is None:
            conn.pending.extend(events)
            yield from _decide(conn, heuristic)
        elif conn.kind:
            yield from events
    if batch:
        yield DataBatch(batch)
    if streams_seen is not None:
        streams_seen.append(len(ordered))
    for conn in ordered:
        events = []
        for d in (0, 1):
            # At the end of the capture, a direction ends (and a frame left incomplete is
            # lost) at its own last packet, not at the capture's.
            end_ts = conn.dirs[d].last_ts
            events.extend(_finish(conn, d, end_ts if end_ts is not None else last_ts))
        if conn.kind is None:
            conn.pending.extend(events)
            yield from _decide(conn, heuristic, final=True)
        elif conn.kind:
            yield from events
    if fragments:
        yield Note(None, last_ts, "ip-fragments", f"{fragments} IP fragment(s) ignored (not reassembled)")
    if cut_packets > 1:
        yield Note(None, last_ts, "snaplen", f"{cut_packets} packet(s) were cut by the capture's snaplen: "
                                             "their missing bytes are reported as gaps")
    if truncated is not None:
        yield Note(None, last_ts, "capture-truncated", truncated)


def _finish(conn: _Connection, direction: int, ts: Optional[float]) -> list[Event]:
    half = conn.dirs[direction]
    if half.ended:
        return []
    half.ended = True
    pieces: list[Piece] = []
    gap_ts, gap_packet = (ts, None) if half.hole_since is None else (half.hole_since, half.hole_packet)
    while half.held:
        half.skip_hole(pieces)
    if half.fin_at is not None and half.next < half.fin_at:
        half.sent_before(half.fin_at, pieces)  # the FIN's sequence number says they were sent
    events = _pieces(conn.stream, direction, pieces, gap_ts, gap_packet)
    events.append(End(conn.stream, direction, ts))
    return events


def ack_of(buf: bytes, tcp: int) -> int:
    """The acknowledgement number of the TCP header at ``tcp``."""
    return buf[tcp + 8] << 24 | buf[tcp + 9] << 16 | buf[tcp + 10] << 8 | buf[tcp + 11]


def _pieces(stream: int, direction: int, pieces: list[Piece], gap_ts: Optional[float],
            gap_packet: Optional[int]) -> list[Event]:
    """Reassembled pieces of one direction as events: data at the time and packet of the
    segment that carried it, gaps at ``gap_ts`` and ``gap_packet`` (where the loss showed)."""
    return [
        Gap(stream, direction, gap_ts, size, gap_packet) if is_gap else Data(stream, direction, ts, data, packet)
        for is_gap, size, data, ts, packet in pieces
    ]


def _decide(conn: _Connection, heuristic: bool, *, final: bool = False) -> Iterator[Event]:
    """Settle whether an undecided connection is Jet from its first in-order bytes: it
    is when either direction starts with an INFO or a plausible frame. A stream with
    data that is not taken is said so in a note."""
    firsts: dict[int, bytes] = {}
    for event in conn.pending:
        if isinstance(event, Data) and len(firsts.get(event.direction, b"")) < HEURISTIC_BYTES:
            firsts[event.direction] = firsts.get(event.direction, b"") + event.data
    if not heuristic:
        conn.kind = False
        conn.pending = []
        return
    verdicts = [_starts_like_jet(head, final) for head in firsts.values()]
    verdict: Optional[bool] = None
    if any(verdicts):
        verdict = True
    elif final or (len(verdicts) == 2 and not any(v is None for v in verdicts)) or sum(len(head) for head in firsts.values()) >= 2 * HEURISTIC_BYTES:
        verdict = False
    if verdict is None:
        return
    conn.kind = verdict
    pending, conn.pending = conn.pending, []
    if verdict:
        yield Open(conn.stream, conn.labels, conn.complete)
        yield from pending
    elif firsts:
        ts = next((e.ts for e in pending if isinstance(e, Data)), None)
        heads = ", ".join(f"{conn.labels[d]} sent {firsts[d][:8].hex(' ')}" for d in sorted(firsts))
        yield Note(conn.stream, ts, "not-jet",
                   f"stream {conn.stream} {conn.labels[0]} ↔ {conn.labels[1]} skipped: neither direction "
                   f"starts with an INFO or a plausible jet frame ({heads}); --port selects a port as jet")
