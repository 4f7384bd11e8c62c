"""Every hex example printed in the spec is what the codec reads and writes.

The examples are for people writing peers in other languages: a wrong one costs them
hours. They are read straight out of the Markdown, so editing one breaks this test.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from jetwire import decode_frame, encode
from jetwire.log import LogHeader, LogRecord, encode_header, encode_record, iter_log

SPEC = Path(__file__).resolve().parent.parent / "spec"
# A code span of at least five two-digit hex bytes separated by single spaces.
HEX_SPAN = re.compile(r"`((?:[0-9a-f]{2} ){4,}[0-9a-f]{2})`")


def examples(name: str) -> list[bytes]:
    return [bytes.fromhex(match) for match in HEX_SPAN.findall((SPEC / name).read_text())]


PROTOCOL_EXAMPLES = examples("PROTOCOL.md")
JETLOG_EXAMPLES = examples("JETLOG.md")


def test_the_spec_has_its_examples() -> None:
    # One per message of sections 4.4 and 6-7 at least; the JETLOG header and two records.
    assert len(PROTOCOL_EXAMPLES) >= 20
    assert len(JETLOG_EXAMPLES) == 3


@pytest.mark.parametrize("frame", PROTOCOL_EXAMPLES, ids=lambda b: b[:12].hex())
def test_protocol_example_decodes_and_encodes_back(frame: bytes) -> None:
    assert encode(decode_frame(frame)) == frame


def test_jetlog_examples_read_and_write_back() -> None:
    header, *records = JETLOG_EXAMPLES
    items = list(iter_log(io.BytesIO(header + b"".join(records))))
    assert isinstance(items[0], LogHeader) and encode_header(items[0]) == header
    assert len(items) == 1 + len(records)
    for item, raw in zip(items[1:], records, strict=True):
        assert isinstance(item, LogRecord)
        assert encode_record(item.ts_ns, item.conn_id, item.kind, item.data) == raw
    frame_record = items[-1]
    assert isinstance(frame_record, LogRecord)
    assert encode(decode_frame(frame_record.data)) == frame_record.data
