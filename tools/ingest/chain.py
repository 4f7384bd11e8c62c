"""The walk along a segment's chain of valid records (JETLOG.md 3): the per-record loop of
:func:`tools.ingest.parse.scan_records`, the one part of reading an event log that runs
once per record in Python (issue 13). Everything else the reader does is vectorised.

It is compiled with mypyc in the wheel (``jetwire._pure.COMPILED_MODULES``), which turns
its byte reads into native loads. The interpreted build walks with numpy instead
(:func:`tools.ingest.parse._walk_vectorised`, chosen by :data:`NATIVE`), which is faster
there; run interpreted, :func:`walk` is what the tests hold that walk to.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

from jetwire.codec import NATIVE  # compiled with this module, or not, as one
from jetwire.log import RECORD_MARKER

__all__ = ["CRC_TABLE", "FIXED_SIZE", "HEAD", "HEAD_SIZE", "NATIVE", "walk"]

HEAD: Final = struct.Struct(">HII")  # JETLOG.md 3: marker | length | crc
HEAD_SIZE: Final = 10
FIXED_SIZE: Final = 13  # JETLOG.md 3: ts_ns u64 | conn_id u32 | kind u8
_MARKER_HI: Final = RECORD_MARKER >> 8
_MARKER_LO: Final = RECORD_MARKER & 0xFF


def _crc_table() -> list[int]:
    """zlib's CRC-32 one byte at a time (reflected polynomial 0xEDB88320)."""
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
        table.append(crc)
    return table


CRC_TABLE: Final = _crc_table()


def walk(buf: bytes, pos: int, until: int, max_record: int, verify_crc: bool, starts: list[int]) -> int:
    """Append to ``starts`` the offsets of the valid records chained from ``pos`` (a
    marker, a length in ``[FIXED_SIZE, max_record]``, all of it inside ``buf``, and its
    CRC when ``verify_crc``), while they start before ``until``. Returns where the walk
    stopped: ``until`` or later, or the first record that is not valid, which the caller
    examines (JETLOG.md 5)."""
    have = len(buf)
    crc32 = zlib.crc32
    table = CRC_TABLE
    while pos < until and have - pos >= HEAD_SIZE:
        if buf[pos] != _MARKER_HI or buf[pos + 1] != _MARKER_LO:
            break
        length = buf[pos + 2] << 24 | buf[pos + 3] << 16 | buf[pos + 4] << 8 | buf[pos + 5]
        end = pos + HEAD_SIZE + length
        if length < FIXED_SIZE or length > max_record or end > have:
            break
        if verify_crc:
            # The CRC of the 4 length bytes by table (native), then zlib over the body.
            head = 0xFFFFFFFF
            for i in range(pos + 2, pos + 6):
                head = table[(head ^ buf[i]) & 0xFF] ^ (head >> 8)
            crc = buf[pos + 6] << 24 | buf[pos + 7] << 16 | buf[pos + 8] << 8 | buf[pos + 9]
            if crc32(buf[pos + HEAD_SIZE : end], head ^ 0xFFFFFFFF) != crc:
                break
        starts.append(pos)
        pos = end
    return pos
