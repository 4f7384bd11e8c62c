"""Every hex example printed in the spec is what the codec reads and writes.

The examples are for people writing peers in other languages: a wrong one costs them
hours. They are read straight out of the Markdown, so editing one breaks this test.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from jetwire import decode_frame
from jetwire import encode
from jetwire.log import LogHeader
from jetwire.log import LogRecord
from jetwire.log import encode_header
from jetwire.log import encode_record
from jetwire.log import iter_log

SPEC = Path(__file__).resolve().parent.parent / "spec"
# A code span of at least five two-digit hex bytes separated by single spaces.
HEX_SPAN = re.compile(r"`((?:[0-9a-f]{2} ){4,}[0-9a-f]{2})`")


def examples(name: str) -> list[bytes]:
    return [bytes.fromhex(match) for match in HEX_SPAN.findall((SPEC / name).read_text())]


PROTOCOL_EXAMPLES = examples("PROTOCOL.md")
JETLOG_EXAMPLES = examples("JETLOG.md")


def test_the_spec_has_its_examples() -> None:
    # One per message of sections 4.4 and 6-7 at least; the JETLOG headers (versions 2
    # and 1) and two records.
    assert len(PROTOCOL_EXAMPLES) >= 20
    assert len(JETLOG_EXAMPLES) == 4


@pytest.mark.parametrize("frame", PROTOCOL_EXAMPLES, ids=lambda b: b[:12].hex())
def test_protocol_example_decodes_and_encodes_back(frame: bytes) -> None:
    assert encode(decode_frame(frame)) == frame


def test_jetlog_examples_read_and_write_back() -> None:
    header, header_v1, *records = JETLOG_EXAMPLES
    v1 = next(iter_log(io.BytesIO(header_v1)))
    assert isinstance(v1, LogHeader) and v1.version == 1 and v1.run_ns is None and encode_header(v1) == header_v1
    items = list(iter_log(io.BytesIO(header + b"".join(records))))
    assert isinstance(items[0], LogHeader) and encode_header(items[0]) == header
    assert (items[0].version, items[0].segment, items[0].created_ns - items[0].run_ns) == (2, 3, 180 * 10**9)
    assert len(items) == 1 + len(records)
    for item, raw in zip(items[1:], records, strict=True):
        assert isinstance(item, LogRecord)
        assert encode_record(item.ts_ns, item.conn_id, item.kind, item.data) == raw
    frame_record = items[-1]
    assert isinstance(frame_record, LogRecord)
    assert encode(decode_frame(frame_record.data)) == frame_record.data
