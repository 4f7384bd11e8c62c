"""What an input produces: the small interface between readers and the dissector.

Every reader (capture, event log, raw bytes, hex, live tap) yields these events. A
*stream* is one connection (a TCP connection, or a connection id of an event log);
``direction`` 0 is the side that opened it (client, or the peer in a log) towards the
other, 1 the other way.
"""

from __future__ import annotations

from typing import NamedTuple
from typing import Optional
from typing import Union

from jetwire import JetError


class InputError(JetError):
    """The input cannot be read at all (missing file, not a capture or log, bad hex)."""


class Open(NamedTuple):
    """A stream begins; ``labels[d]`` names the sender of direction ``d``. ``complete``:
    the input holds the stream from its start (a SYN, a CONN_OPEN record), so that a
    response to a request never seen is unsolicited, not merely out of view."""

    stream: int
    labels: tuple[str, str]
    complete: bool = True


class Data(NamedTuple):
    """In-order bytes of one direction of a stream; ``packet``: the number (from 1) of
    the capture packet that delivered them, when they come from a capture."""

    stream: int
    direction: int
    ts: Optional[float]
    data: bytes
    packet: Optional[int] = None


# The fields of a Data as a plain tuple: (stream, direction, ts, data, packet).
DataTuple = tuple[int, int, Optional[float], bytes, Optional[int]]


class DataBatch(NamedTuple):
    """Consecutive :class:`Data` events, in order, as plain tuples of the same fields (a
    capture's in-order packets): one event instead of one per packet on the hot path."""

    items: list[DataTuple]


class Gap(NamedTuple):
    """``size`` bytes of the direction are missing from the input (never seen); ``ts``
    and ``packet``: the capture packet that showed the loss (a later segment, a FIN, or
    the other side's ACK of bytes never captured)."""

    stream: int
    direction: int
    ts: Optional[float]
    size: int
    packet: Optional[int] = None


class WholeFrame(NamedTuple):
    """One frame recorded whole (an event-log FRAME_IN / FRAME_OUT record)."""

    stream: int
    direction: int
    ts: Optional[float]
    frame: bytes
    where: int  # byte offset of the record in its file


# The fields of a WholeFrame as a plain tuple: (stream, direction, ts, frame, where).
FrameTuple = tuple[int, int, Optional[float], bytes, int]


class FrameBatch(NamedTuple):
    """Consecutive :class:`WholeFrame` events, in order, as plain tuples of the same
    fields (an event log's frame records read from one chunk): one event instead of
    thousands on the hot path."""

    frames: list[FrameTuple]


class End(NamedTuple):
    """The direction ends (FIN, RST, end of input)."""

    stream: int
    direction: int
    ts: Optional[float]


class Note(NamedTuple):
    """Something worth a line that is not a frame (connection opened, log damage...).

    ``stream`` is None for notes about the input as a whole."""

    stream: Optional[int]
    ts: Optional[float]
    kind: str
    text: str
    about: Optional[tuple[int, int]] = None  # (stream, request id) of the request it is about
    route_to: Optional[tuple[int, int]] = None  # ROUTE: (owner stream, the leg's request id)


class Origin(NamedTuple):
    """Time zero of relative times: the first packet of a capture, jet or not (as in
    Wireshark's relative times)."""

    ts: float


Event = Union[Open, Data, DataBatch, Gap, WholeFrame, FrameBatch, End, Note, Origin]
