"""Packets of a pcap or pcapng capture, read from any byte stream (a file or a pipe).

dpkt's readers need a seekable file to tell the two formats apart and build two header
objects per packet (several microseconds each). This reader looks at the magic number
once, then slices packet headers with precompiled ``struct`` formats out of large
chunks, so ``tcpdump -w - | jetdump -`` and ``jetdump < cap.pcapng`` work and the
per-packet cost stays under a microsecond. Formats: the classic libpcap file (both byte
orders, micro- and nanosecond) and pcapng (Section Header, Interface Description with
``if_tsresol`` and ``if_tsoffset``, Enhanced, Simple and obsolete Packet blocks; other
blocks are skipped).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO
from typing import Optional

from .events import InputError

CHUNK = 1 << 20
MAX_BLOCK = 256 * 1024 * 1024  # larger than any snaplen: a length above it is damage

_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\xa1\xb2\xc3\xd4": (">", 1e-6),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9), b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}
PCAPNG_MAGIC = b"\x0a\x0d\x0d\x0a"


class CaptureTruncated(Exception):
    """The capture ends inside a packet or block (``packets`` were read whole)."""

    def __init__(self, packets: int, why: str) -> None:
        super().__init__(why)
        self.packets = packets


class _Buffer:
    """Bytes read ahead from the stream; ``read1`` returns what a pipe has (live input
    is not held back waiting for a full chunk)."""

    __slots__ = ("data", "eof", "pos", "read")

    def __init__(self, stream: BinaryIO, head: bytes) -> None:
        self.read = getattr(stream, "read1", stream.read)
        self.data = head
        self.pos = 0
        self.eof = False

    def need(self, n: int) -> bool:
        """Make ``n`` bytes available from ``pos``; False at the end of the stream."""
        while len(self.data) - self.pos < n:
            if self.eof:
                return False
            more = self.read(max(CHUNK, n))
            if not more:
                self.eof = True
                return False
            self.data = self.data[self.pos :] + more
            self.pos = 0
        return True


def read_packets(stream: BinaryIO, head: bytes = b"") -> Iterator[Optional[tuple[float, int, bytes]]]:
    """Yield ``(timestamp, linktype, link-layer frame)`` for each packet, and None before
    each read from ``stream`` (where a pipe may block: a reader shows what it has).

    Args:
        stream: the capture, positioned after ``head``.
        head: bytes already read from its start (at most a few, to test the magic).

    Raises:
        InputError: the stream is not a pcap/pcapng capture.
        CaptureTruncated: the stream ends inside a packet (after yielding the whole ones).
    """
    buf = _Buffer(stream, head)
    if not buf.need(4):
        raise InputError("not a pcap/pcapng capture: empty or shorter than 4 bytes")
    magic = buf.data[buf.pos : buf.pos + 4]
    if magic in _PCAP_MAGICS:
        return _pcap(buf, *_PCAP_MAGICS[magic])
    if magic == PCAPNG_MAGIC:
        return _pcapng(buf)
    raise InputError(f"not a pcap/pcapng capture (magic {magic.hex()})")


def _pcap(buf: _Buffer, order: str, unit: float) -> Iterator[Optional[tuple[float, int, bytes]]]:
    if not buf.need(24):
        raise InputError("not a readable pcap capture: file header cut short")
    (linktype,) = struct.unpack_from(order + "I", buf.data, buf.pos + 20)
    linktype &= 0x0FFF_FFFF  # the upper bits hold FCS information
    buf.pos += 24
    return _pcap_records(buf, order, unit, linktype)


def _pcap_records(buf: _Buffer, order: str, unit: float, linktype: int) -> Iterator[Optional[tuple[float, int, bytes]]]:
    record = struct.Struct(order + "IIII")
    unpack = record.unpack_from
    count = 0
    while True:
        data, pos = buf.data, buf.pos
        end = len(data)
        # The common case: whole records in the chunk, sliced without a call per check.
        while pos + 16 <= end:
            sec, frac, caplen, _wire = unpack(data, pos)
            stop = pos + 16 + caplen
            if stop > end:
                break
            count += 1
            yield sec + frac * unit, linktype, data[pos + 16 : stop]
            pos = stop
        buf.pos = pos
        yield None  # the chunk is used up: more is read now
        if not buf.need(16):
            if buf.pos < len(buf.data):
                raise CaptureTruncated(count, f"capture truncated after packet {count}: record header cut short")
            return
        sec, frac, caplen, _wire = unpack(buf.data, buf.pos)
        if caplen > MAX_BLOCK:
            raise CaptureTruncated(count, f"capture damaged after packet {count}: record length {caplen}")
        if not buf.need(16 + caplen):
            raise CaptureTruncated(count, f"capture truncated inside packet {count + 1}")


_SHB_BOM = {b"\x1a\x2b\x3c\x4d": ">", b"\x4d\x3c\x2b\x1a": "<"}


def _pcapng(buf: _Buffer) -> Iterator[Optional[tuple[float, int, bytes]]]:
    if not buf.need(12) or buf.data[buf.pos + 8 : buf.pos + 12] not in _SHB_BOM:
        raise InputError("not a readable pcapng capture: bad section header")
    return _pcapng_blocks(buf)


def _idb_resolution(body: bytes, order: str) -> tuple[float, float]:
    """(seconds per timestamp unit, offset in seconds) from an IDB's options."""
    unit, offset = 1e-6, 0.0
    pos = 8
    while pos + 4 <= len(body):
        code, length = struct.unpack_from(order + "HH", body, pos)
        value = body[pos + 4 : pos + 4 + length]
        if code == 0:
            break
        if code == 9 and length >= 1:  # if_tsresol
            v = value[0]
            unit = 2.0 ** -(v & 0x7F) if v & 0x80 else 10.0 ** -(v & 0x7F)
        elif code == 14 and length >= 8:  # if_tsoffset
            offset = float(struct.unpack_from(order + "q", value)[0])
        pos += 4 + ((length + 3) & ~3)
    return unit, offset


def _pcapng_blocks(buf: _Buffer) -> Iterator[Optional[tuple[float, int, bytes]]]:
    order = ">"
    interfaces: list[tuple[int, float, float]] = []  # (linktype, unit, offset)
    header = struct.Struct(">II")
    epb = struct.Struct(">IIIII")
    count = 0
    while True:
        if len(buf.data) - buf.pos < 8:
            yield None  # the chunk is used up: more is read now
        if not buf.need(8):
            if buf.pos < len(buf.data):
                raise CaptureTruncated(count, f"capture truncated after packet {count}: block header cut short")
            return
        data, pos = buf.data, buf.pos
        if data[pos : pos + 4] == PCAPNG_MAGIC:  # a (new) section: its byte order
            if not buf.need(12):
                raise CaptureTruncated(count, f"capture truncated after packet {count}: section header cut short")
            data, pos = buf.data, buf.pos
            bom = data[pos + 8 : pos + 12]
            if bom not in _SHB_BOM:
                raise CaptureTruncated(count, f"capture damaged after packet {count}: bad section byte order")
            order = _SHB_BOM[bom]
            header = struct.Struct(order + "II")
            epb = struct.Struct(order + "IIIII")
            interfaces = []
        block_type, length = header.unpack_from(data, pos)
        if length < 12 or length > MAX_BLOCK or length % 4:
            raise CaptureTruncated(count, f"capture damaged after packet {count}: block length {length}")
        if len(buf.data) - buf.pos < length:
            yield None
        if not buf.need(length):
            raise CaptureTruncated(count, f"capture truncated inside block after packet {count}")
        data, pos = buf.data, buf.pos
        buf.pos = pos + length
        if block_type == 6:  # Enhanced Packet Block
            iface, high, low, caplen, _wire = epb.unpack_from(data, pos + 8)
            if iface < len(interfaces) and 28 + caplen <= length:
                linktype, unit, offset = interfaces[iface]
                count += 1
                yield offset + ((high << 32) | low) * unit, linktype, data[pos + 28 : pos + 28 + caplen]
        elif block_type == 1:  # Interface Description Block
            linktype = struct.unpack_from(order + "H", data, pos + 8)[0]
            unit, offset = _idb_resolution(data[pos + 8 : pos + length - 4], order)
            interfaces.append((linktype, unit, offset))
        elif block_type == 3 and interfaces:  # Simple Packet Block: no timestamp
            (wire,) = struct.unpack_from(order + "I", data, pos + 8)
            count += 1
            yield 0.0, interfaces[0][0], data[pos + 12 : pos + 12 + min(wire, length - 16)]
        elif block_type == 2:  # obsolete Packet Block
            iface, _drops, high, low, caplen, _wire = struct.unpack_from(order + "HHIIII", data, pos + 8)
            if iface < len(interfaces):
                linktype, unit, offset = interfaces[iface]
                count += 1
                yield offset + ((high << 32) | low) * unit, linktype, data[pos + 28 : pos + 28 + caplen]


def peek_head(stream: BinaryIO, n: int = 8) -> bytes:
    """Read up to ``n`` bytes from a stream that may be a pipe (short reads retried)."""
    head = b""
    while len(head) < n:
        more = stream.read(n - len(head))
        if not more:
            break
        head += more
    return head


__all__ = ["CaptureTruncated", "peek_head", "read_packets"]
