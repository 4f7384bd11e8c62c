"""Decoder behaviour beyond the vectors: limits, bookkeeping, input ownership, dissect."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from jetwire import Decoder
from jetwire import GetState
from jetwire import LocalProtocolError
from jetwire import RemoteProtocolError
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire import frame_size
from jetwire.schema import dissect
from tools.vectors import load

VALID = load("frames-valid.json")["vectors"]
INVALID = load("frames-invalid.json")["vectors"]


def test_header_announcing_u32_max_is_refused_before_buffering() -> None:
    decoder = Decoder()
    decoder.receive_data(b"\x01\xff\xff\xff\xff")
    with pytest.raises(RemoteProtocolError) as info:
        decoder.next_message()
    assert info.value.status == Status.TOO_LARGE and info.value.fatal
    # The peer keeps sending: nothing is kept.
    for _ in range(100):
        decoder.receive_data(b"\x00" * 65536)
    assert decoder.buffered <= 5
    with pytest.raises(RemoteProtocolError):
        list(decoder.messages())


def test_body_at_the_limit_is_buffered_until_complete() -> None:
    frame = encode(SetState(1, "k", Value.of(b"x" * 1000)))
    decoder = Decoder(max_body=len(frame) - 5)
    for i in range(len(frame) - 1):
        decoder.receive_data(frame[i : i + 1])
        assert decoder.next_message() is None
        assert decoder.buffered == i + 1
    decoder.receive_data(frame[-1:])
    assert decoder.next_message() == SetState(1, "k", Value.of(b"x" * 1000))
    with pytest.raises(RemoteProtocolError):
        tight = Decoder(max_body=len(frame) - 6)
        tight.receive_data(frame[:5])
        tight.next_message()


@pytest.mark.parametrize("max_body", [-1, 2**32, 10**12])
def test_max_body_must_fit_u32(max_body: int) -> None:
    with pytest.raises(LocalProtocolError):
        Decoder(max_body=max_body)


def test_input_buffers_are_copied() -> None:
    """A caller may reuse its receive buffer right after feeding it."""
    frame = bytearray(encode(GetState(9, "plant/temp")))
    decoder = Decoder()
    decoder.receive_data(frame[:7])
    decoder.receive_data(memoryview(frame)[7:])
    frame[:] = b"\xff" * len(frame)
    assert decoder.next_message() == GetState(9, "plant/temp")


def test_consumed_and_buffered_track_the_stream() -> None:
    frames = [encode(GetState(i, f"k{i}")) for i in range(10)]
    stream = b"".join(frames)
    decoder = Decoder()
    decoder.receive_data(stream[:25])
    decoder.receive_data(stream[25:])
    total = 0
    for frame in frames:
        assert decoder.consumed == total
        assert decoder.buffered == len(stream) - total
        assert decoder.next_message() is not None
        total += len(frame)
    assert decoder.next_message() is None
    assert (decoder.consumed, decoder.buffered) == (len(stream), 0)


def test_next_frame_returns_raw_bodies() -> None:
    frame = encode(SetState(3, "temp", Value.of(22.5)))
    decoder = Decoder()
    decoder.receive_data(frame * 2)
    assert decoder.next_frame() == (1, frame[5:])
    assert decoder.next_frame() == (1, frame[5:])
    assert decoder.next_frame() is None


def test_non_fatal_error_inside_messages_can_be_resumed() -> None:
    good = encode(GetState(1, "a"))
    bad = bytes.fromhex(next(v["hex"] for v in INVALID if v["name"] == "request_empty_key_get"))
    decoder = Decoder()
    decoder.receive_data(good + bad + good)
    got = []
    with pytest.raises(RemoteProtocolError) as info:
        for message in decoder.messages():
            got.append(message)
    assert info.value.request_id == 4 and not info.value.fatal
    got.extend(decoder.messages())
    assert got == [GetState(1, "a"), GetState(1, "a")]


BAD_EVENT = bytes.fromhex("030000000d0300016b010000000107000000")  # SET_STATE event, BOOL 0x07


def _drain(decoder: Decoder, *, via_messages: bool) -> tuple[list[object], list[RemoteProtocolError]]:
    """Everything a tool would see: messages and errors, going on after each error
    until the decoder needs more bytes or raises the same latched error again."""
    got: list[object] = []
    errors: list[RemoteProtocolError] = []
    while True:
        try:
            if via_messages:
                got.extend(decoder.messages())
                return got, errors
            message = decoder.next_message()
            if message is None:
                return got, errors
            got.append(message)
        except RemoteProtocolError as exc:
            if errors and exc is errors[-1]:
                return got, errors  # latched: the same error again
            errors.append(exc)


@pytest.mark.parametrize("via_messages", [True, False])
def test_fatal_body_error_latches_by_default(via_messages: bool) -> None:
    decoder = Decoder()
    decoder.receive_data(BAD_EVENT + encode(GetState(1, "a")))
    got, errors = _drain(decoder, via_messages=via_messages)
    assert got == []
    assert len(errors) == 1
    exc = errors[0]
    # PROTOCOL.md 9.3: fatal for the connection, but its frame boundary held.
    assert exc.fatal and exc.resumable and exc.frame_type == 3
    assert decoder.consumed == len(BAD_EVENT)
    decoder.receive_data(encode(GetState(2, "b")))  # dropped: the stream is closed
    with pytest.raises(RemoteProtocolError) as again:
        decoder.next_message()
    assert again.value is exc


@pytest.mark.parametrize("via_messages", [True, False])
def test_fatal_body_error_can_be_passed_without_latch(via_messages: bool) -> None:
    short_request = bytes.fromhex("0100000002aaaa")  # no readable id: fatal, boundary intact
    bad_info = bytes.fromhex("040000000c020000001000000000000000")  # major version 2
    bad_code = bytes.fromhex("030000000177")  # unknown event code
    stream = b"".join(
        (BAD_EVENT, encode(GetState(1, "a")), short_request, bad_info, bad_code, encode(GetState(2, "b")))
    )
    decoder = Decoder(latch_fatal=False)
    assert decoder.latch_fatal is False
    decoder.receive_data(stream)
    got, errors = _drain(decoder, via_messages=via_messages)
    assert got == [GetState(1, "a"), GetState(2, "b")]
    assert [e.fatal and e.resumable for e in errors] == [True, True, True, True]
    assert [e.status for e in errors] == [Status.MALFORMED] * 3 + [Status.UNKNOWN_FUNCTION]
    assert decoder.consumed == len(stream) and decoder.buffered == 0


@pytest.mark.parametrize("header", ["09000000010000", "01ffffffff"])
def test_lost_frame_boundary_latches_even_without_latch_fatal(header: str) -> None:
    decoder = Decoder(latch_fatal=False)
    decoder.receive_data(encode(GetState(1, "a")) + bytes.fromhex(header) + encode(GetState(2, "b")))
    got, errors = _drain(decoder, via_messages=True)
    assert got == [GetState(1, "a")]
    assert len(errors) == 1 and errors[0].fatal and not errors[0].resumable


def test_every_invalid_vector_says_whether_the_boundary_held() -> None:
    for vector in INVALID:
        data = bytes.fromhex(vector["hex"])
        if len(data) < 5 or struct.unpack_from(">I", data, 1)[0] != len(data) - 5:
            continue  # a lying length: the next frame's bytes would be read as this body
        decoder = Decoder(max_body=vector.get("max_body", 1 << 20), latch_fatal=False)
        decoder.receive_data(data + encode(GetState(9, "z")))
        try:
            list(decoder.messages())
        except RemoteProtocolError as exc:
            if exc.resumable:
                # The bad frame was consumed whole: the next frame decodes.
                assert list(decoder.messages()) == [GetState(9, "z")], vector["name"]
            else:
                assert exc.fatal, vector["name"]


def test_error_resumable_defaults() -> None:
    assert RemoteProtocolError("x").resumable
    assert not RemoteProtocolError("x", fatal=True).resumable
    assert RemoteProtocolError("x", fatal=True, resumable=True).resumable


def test_frame_size() -> None:
    frame = encode(GetState(1, "abc"))
    assert frame_size(frame[:4]) is None
    assert frame_size(frame) == len(frame)
    assert frame_size(b"xx" + frame, 2) == len(frame)


@pytest.mark.parametrize("vector", VALID + INVALID, ids=[v["name"] for v in VALID + INVALID])
def test_dissect_reports_fields_or_the_fault(vector: dict[str, object]) -> None:
    frame = bytes.fromhex(str(vector["hex"]))
    fields, error = dissect(frame)
    if "message" in vector:
        assert error is None
        # Fields tile the frame: each starts where the previous one ended.
        position = 0
        for field in fields:
            assert field.offset == position, field
            position += field.length
        assert position == len(frame)
    elif vector["name"] != "frame_body_over_small_max":  # dissect has no max_body: fine there
        # Either the fault is named, or the frame is followed by bytes of the next one.
        assert error is not None or len(frame) > 5 + struct.unpack_from(">I", frame, 1)[0]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_dissect_never_raises(frame: bytes) -> None:
    fields, error = dissect(frame)
    assert error is None or isinstance(error, RemoteProtocolError)
    position = 0
    for field in fields:
        assert field.offset >= position and field.offset + field.length <= len(frame)
        position = field.offset + field.length


@pytest.mark.parametrize("data", [5, "text", None, [1, 2]])
def test_receive_data_refuses_non_bytes(data: object) -> None:
    decoder = Decoder()
    with pytest.raises(LocalProtocolError):
        decoder.receive_data(data)  # type: ignore[arg-type]
    assert decoder.buffered == 0


def test_authenticate_repr_masks_the_password() -> None:
    """PROTOCOL.md 6.12: a message's repr (what logs print) never shows the password."""
    from jetwire import Authenticate
    from jetwire import decode_frame
    from jetwire import encode

    message = decode_frame(encode(Authenticate(3, "alice", "s3cr3t")))
    assert message == Authenticate(3, "alice", "s3cr3t")
    assert "s3cr3t" not in repr(message) and "alice" in repr(message)


def test_authenticate_refuses_an_empty_user() -> None:
    from jetwire import Authenticate
    from jetwire import LocalProtocolError
    from jetwire import encode

    with pytest.raises(LocalProtocolError, match="user"):
        encode(Authenticate(3, "", "pw"))
