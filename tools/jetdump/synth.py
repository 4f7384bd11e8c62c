"""Write synthetic TCP captures (pcap or pcapng, with dpkt) for tests and benchmarks.

:class:`TcpSession` keeps the sequence numbers of both directions of one connection so
that a test can write exactly the segmentation it wants: frames split across segments,
several frames in one segment, retransmissions, overlaps, out-of-order segments, holes.
"""

from __future__ import annotations

import socket
from typing import BinaryIO
from typing import Optional

import dpkt

SYN, FIN, RST, PSH, ACK = dpkt.tcp.TH_SYN, dpkt.tcp.TH_FIN, dpkt.tcp.TH_RST, dpkt.tcp.TH_PUSH, dpkt.tcp.TH_ACK


class CaptureWriter:
    """Ethernet/IPv4/TCP packets into a pcap (or pcapng) file."""

    def __init__(self, fileobj: BinaryIO, *, pcapng: bool = False, snaplen: int = 65535) -> None:
        writer_cls = dpkt.pcapng.Writer if pcapng else dpkt.pcap.Writer
        self.writer = writer_cls(fileobj, snaplen=snaplen, linktype=dpkt.pcap.DLT_EN10MB)
        self.snaplen = snaplen

    def tcp(
        self, ts: float, src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: int,
        payload: bytes = b"",
    ) -> None:
        segment = dpkt.tcp.TCP(
            sport=src[1], dport=dst[1], seq=seq & 0xFFFF_FFFF, ack=ack & 0xFFFF_FFFF, flags=flags,
            win=65535, data=payload,
        )
        ip = dpkt.ip.IP(src=socket.inet_aton(src[0]), dst=socket.inet_aton(dst[0]), p=dpkt.ip.IP_PROTO_TCP, data=segment)
        ip.len = 20 + len(bytes(segment))
        eth = dpkt.ethernet.Ethernet(src=b"\x02" * 6, dst=b"\x04" * 6, type=dpkt.ethernet.ETH_TYPE_IP, data=ip)
        self.writer.writepkt(bytes(eth)[: self.snaplen], ts=ts)


class TcpSession:
    """One TCP connection: ``send(direction, payload)`` writes a segment and advances
    that direction's sequence number (unless told otherwise)."""

    def __init__(
        self, writer: CaptureWriter, client: tuple[str, int], server: tuple[str, int], *,
        isn: tuple[int, int] = (1000, 5000), ts: float = 1_700_000_000.0,
    ) -> None:
        self.writer = writer
        self.ends = (client, server)
        self.isn = isn
        self.next = [isn[0] + 1, isn[1] + 1]
        self.ts = ts

    def tick(self, dt: float = 0.0001) -> float:
        self.ts += dt
        return self.ts

    def handshake(self) -> None:
        (c, s) = self.ends
        self.writer.tcp(self.tick(), c, s, self.isn[0], 0, SYN)
        self.writer.tcp(self.tick(), s, c, self.isn[1], self.isn[0] + 1, SYN | ACK)
        self.writer.tcp(self.tick(), c, s, self.isn[0] + 1, self.isn[1] + 1, ACK)

    def send(self, direction: int, payload: bytes, *, at: Optional[int] = None, advance: bool = True,
             dt: float = 0.0001, ack: Optional[int] = None) -> int:
        """Write one segment; ``at`` is a byte offset relative to the direction's start
        (for retransmissions, overlaps and out-of-order segments). ``ack``: the byte
        offset of the other direction it acknowledges (default: all sent so far; an ACK
        of bytes the capture lacks tells a reader they were lost). Returns ``at``."""
        src, dst = self.ends[direction], self.ends[1 - direction]
        offset = self.next[direction] - self.isn[direction] - 1 if at is None else at
        seq = self.isn[direction] + 1 + offset
        acked = self.next[1 - direction] if ack is None else self.isn[1 - direction] + 1 + ack
        self.writer.tcp(self.tick(dt), src, dst, seq, acked, PSH | ACK, payload)
        if advance:
            self.next[direction] = max(self.next[direction], seq + len(payload))
        return offset

    def skip(self, direction: int, size: int) -> None:
        """Advance a direction's sequence number without writing: a hole in the capture."""
        self.next[direction] += size

    def close(self) -> None:
        for direction in (0, 1):
            src, dst = self.ends[direction], self.ends[1 - direction]
            self.writer.tcp(self.tick(), src, dst, self.next[direction], self.next[1 - direction], FIN | ACK)
            self.next[direction] += 1
