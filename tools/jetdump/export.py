"""``jetdump LOGDIR --write-pcapng FILE``: a daemon's event log as a pcapng capture.

Each connection of the log becomes a synthesised TCP stream between the peer's address
(from its CONN_OPEN or CONN_SNAPSHOT record when it is an IPv4 address, otherwise a
made-up 10.x address) and the daemon's (``--port`` on 127.0.0.1): a handshake at the
connection's first record, every FRAME_IN / FRAME_OUT as segments stamped with the
daemon's own time of the record (JETLOG.md 4), and a FIN both ways at CONN_CLOSE. The
file opens in Wireshark and tshark, with ``tools/wireshark/jet.lua`` decoding the frames,
so the daemon-side timing and routing can be looked at there. Frames are written as
recorded, damaged ones included.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from typing import BinaryIO
from typing import Optional

from .events import Data
from .events import DataBatch
from .events import Event
from .events import FrameBatch
from .events import FrameTuple
from .events import InputError
from .events import Note
from .events import WholeFrame
from .synth import ACK
from .synth import FIN
from .synth import SYN
from .synth import CaptureWriter
from .synth import TcpSession

SEGMENT = 16 * 1024  # payload bytes per synthesised segment (an IPv4 packet holds < 64 KiB)
TICK = 0.000001  # between synthesised packets that have no record of their own (handshake, FIN)

_ADDRESS = re.compile(r"(?:opened|open) from (\d+\.\d+\.\d+\.\d+):(\d+)")


class PcapngExport:
    """Writes log events to a pcapng file as TCP streams (one per log connection)."""

    def __init__(self, fileobj: BinaryIO, *, server_port: int) -> None:
        self.writer = CaptureWriter(fileobj, pcapng=True)
        self.server = ("127.0.0.1", server_port)
        self.addresses: dict[int, tuple[str, int]] = {}
        self.sessions: dict[int, TcpSession] = {}
        self.streams = 0
        self.frames = 0

    def event(self, event: Event) -> None:
        if type(event) is FrameBatch:
            for item in event.frames:
                self.frame(item)
        elif isinstance(event, WholeFrame):
            self.frame((event.stream, event.direction, event.ts, event.frame, event.where))
        elif isinstance(event, Note) and event.stream is not None:
            if event.kind in ("conn-open", "conn-snapshot"):
                match = _ADDRESS.search(event.text)
                if match is not None and event.stream not in self.sessions:
                    self.addresses[event.stream] = (match.group(1), int(match.group(2)))
            elif event.kind == "conn-close":
                session = self.sessions.pop(event.stream, None)
                if session is not None:
                    self._close(session, event.ts)
        elif isinstance(event, (Data, DataBatch)):
            raise InputError("--write-pcapng converts event logs; this input is a capture or raw bytes")

    def _session(self, stream: int, ts: float) -> TcpSession:
        session = self.sessions.get(stream)
        if session is None:
            client = self.addresses.get(stream) or self._made_up(stream)
            session = TcpSession(self.writer, client, self.server, isn=(1000, 5000), ts=ts)
            # The handshake just before the first record (TcpSession.handshake() would
            # step 0.1 ms per packet and shift the record's time).
            isn_client, isn_server = session.isn
            self.writer.tcp(ts - 3 * TICK, client, self.server, isn_client, 0, SYN)
            self.writer.tcp(ts - 2 * TICK, self.server, client, isn_server, isn_client + 1, SYN | ACK)
            self.writer.tcp(ts - TICK, client, self.server, isn_client + 1, isn_server + 1, ACK)
            self.sessions[stream] = session
            self.streams += 1
        return session

    def _made_up(self, stream: int) -> tuple[str, int]:
        host = ipaddress.IPv4Address(0x0A00_0000 + (stream // 20000) % 0xFF_FFFF)
        return str(host), 40000 + stream % 20000

    def frame(self, item: FrameTuple) -> None:
        stream, direction, ts, frame, _where = item
        if ts is None:
            ts = 0.0
        session = self._session(stream, ts)
        session.ts = max(session.ts, ts)
        for start in range(0, len(frame), SEGMENT):
            session.send(direction, frame[start : start + SEGMENT], dt=0.0)
        self.frames += 1

    def _close(self, session: TcpSession, ts: Optional[float]) -> None:
        at = max(session.ts, ts if ts is not None else session.ts)
        for direction in (0, 1):
            src, dst = session.ends[direction], session.ends[1 - direction]
            at += TICK
            self.writer.tcp(at, src, dst, session.next[direction], session.next[1 - direction], FIN | ACK)
            session.next[direction] += 1

    def close(self) -> None:
        """Ends the connections still open at the end of the log (no CONN_CLOSE seen)."""
        for session in self.sessions.values():
            self._close(session, None)
        self.sessions.clear()


def export_pcapng(events: Iterator[Event], fileobj: BinaryIO, *, server_port: int,
                  notes: Optional[list[str]] = None) -> tuple[int, int]:
    """Write ``events`` (of an event log) to ``fileobj`` as pcapng; returns (streams, frames).

    Raises:
        InputError: if the events come from a capture or raw bytes.
    """
    export = PcapngExport(fileobj, server_port=server_port)
    for event in events:
        export.event(event)
        if notes is not None and isinstance(event, Note) and event.kind in ("log-damage", "log-truncated"):
            notes.append(event.text)
    export.close()
    return export.streams, export.frames
