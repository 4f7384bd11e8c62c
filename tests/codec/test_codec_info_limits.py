"""PROTOCOL.md 4.4.1: the INFO limits extension (protocol 1.2) in the fast codec and the
construct schema alike."""

from __future__ import annotations

import pytest

from jetwire import Info
from jetwire import RemoteProtocolError
from jetwire import decode_frame
from jetwire import encode
from jetwire.schema import parse_frame


def _with_tail(frame: bytes, tail: bytes) -> bytes:
    body = frame[5:] + tail
    return frame[:1] + len(body).to_bytes(4, "big") + body


def test_bytes_after_the_known_fields_are_ignored():
    plain = encode(Info("jetd", 1 << 20, 0x0B))
    later = _with_tail(plain, bytes.fromhex("0400 00001388") + b"a later field")
    info = decode_frame(later)
    assert isinstance(info, Info)
    assert (info.max_key_length, info.route_timeout_ms) == (1024, 5000)
    parsed = parse_frame(later).body.limits
    assert (parsed.max_key_length, parsed.route_timeout_ms, parsed.later) == (1024, 5000, b"a later field")


@pytest.mark.parametrize("tail", [b"\x04", bytes(5)])
def test_a_short_extension_is_malformed(tail: bytes):
    frame = _with_tail(encode(Info("jetd")), tail)
    with pytest.raises(RemoteProtocolError, match="limits extension"):
        decode_frame(frame)
    with pytest.raises(RemoteProtocolError):
        parse_frame(frame)


def test_both_limits_or_neither():
    from jetwire import LocalProtocolError

    with pytest.raises(LocalProtocolError):
        encode(Info("jetd", max_key_length=10))
    assert decode_frame(encode(Info("jetd", max_key_length=10, route_timeout_ms=0))).route_timeout_ms == 0
