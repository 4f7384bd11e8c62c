"""The golden vectors (spec/vectors/) through every way of decoding and encoding.

Each vector is fed whole, split in two at every offset, and one byte at a time through
the stream Decoder (pulled with ``next_message()``, ``messages()`` and ``next_frame()``),
through ``decode_frame``, and through the construct schema, both directions.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterable
from typing import Any

import pytest

from jetwire import Decoder
from jetwire import Message
from jetwire import RemoteProtocolError
from jetwire import decode_body
from jetwire import decode_frame
from jetwire import encode
from jetwire.schema import build_frame
from jetwire.schema import parse_frame
from tools.vectors import container_to_json
from tools.vectors import error_to_json
from tools.vectors import generate
from tools.vectors import json_to_container
from tools.vectors import load
from tools.vectors import message_from_json
from tools.vectors import message_to_json

VALID = load("frames-valid.json")
INVALID = load("frames-invalid.json")
DEFAULT_MAX = VALID["default_max_body"]
# Splitting a frame at every offset is quadratic in its size; the two vectors of
# ~65 KiB keys are split at every offset near both ends and every 997th in between.
SPLIT_EVERY_OFFSET_UP_TO = 4096


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


def _split_points(size: int) -> Iterable[int]:
    if size <= SPLIT_EVERY_OFFSET_UP_TO:
        return range(size + 1)
    return sorted({*range(64), *range(size - 64, size + 1), *range(0, size, 997)})


Pull = Callable[[Decoder], list[Message]]


def pull_next_message(decoder: Decoder) -> list[Message]:
    out = []
    while (message := decoder.next_message()) is not None:
        out.append(message)
    return out


def pull_messages(decoder: Decoder) -> list[Message]:
    return list(decoder.messages())


def pull_frames(decoder: Decoder) -> list[Message]:
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(decode_body(*frame))
    return out


PULLS = [pull_next_message, pull_messages, pull_frames]


def feed(chunks: Iterable[bytes], pull: Pull, max_body: int) -> tuple[list[Message], Decoder]:
    decoder = Decoder(max_body=max_body)
    got: list[Message] = []
    for chunk in chunks:
        decoder.receive_data(chunk)
        got.extend(pull(decoder))
    return got, decoder


def chunkings(data: bytes) -> Iterable[list[bytes]]:
    yield [data]
    for cut in _split_points(len(data)):
        yield [data[:cut], data[cut:]]
    yield [data[i : i + 1] for i in range(len(data))]


# --- valid vectors ------------------------------------------------------------------------


@pytest.mark.parametrize("vector", VALID["vectors"], ids=_ids(VALID["vectors"]))
def test_valid_vector_decodes_in_any_chunking(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    max_body = vector.get("max_body", DEFAULT_MAX)
    for pull in PULLS:
        for chunks in chunkings(data):
            got, decoder = feed(chunks, pull, max_body)
            assert len(got) == 1, (pull.__name__, [len(c) for c in chunks])
            assert message_to_json(got[0]) == vector["message"]
            assert decoder.buffered == 0
            assert decoder.consumed == len(data)


@pytest.mark.parametrize("vector", VALID["vectors"], ids=_ids(VALID["vectors"]))
def test_valid_vector_encodes_and_matches_schema(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    message = message_from_json(vector["message"])
    assert encode(message) == data
    assert decode_frame(data, max_body=vector.get("max_body", DEFAULT_MAX)) == message
    # The construct schema agrees with the fast path in both directions.
    parsed = parse_frame(data, max_body=vector.get("max_body", DEFAULT_MAX))
    assert container_to_json(parsed) == vector["message"]
    assert build_frame(json_to_container(vector["message"])) == data
    assert build_frame(parsed) == data


def test_valid_vectors_back_to_back() -> None:
    """All valid vectors (within the default maximum) in one stream, any pull style."""
    vectors = [v for v in VALID["vectors"] if "max_body" not in v]
    stream = b"".join(bytes.fromhex(v["hex"]) for v in vectors)
    expected = [v["message"] for v in vectors]
    for pull in PULLS:
        for step in (len(stream), 4093, 7):
            chunks = [stream[i : i + step] for i in range(0, len(stream), step)]
            got, decoder = feed(chunks, pull, DEFAULT_MAX)
            assert [message_to_json(m) for m in got] == expected
            assert decoder.buffered == 0


# --- invalid vectors ----------------------------------------------------------------------


def _expect_error(chunks: list[bytes], pull: Pull, max_body: int) -> RemoteProtocolError:
    decoder = Decoder(max_body=max_body)
    for chunk in chunks:
        decoder.receive_data(chunk)
        try:
            got = pull(decoder)
        except RemoteProtocolError as exc:
            return exc
        assert got == [], "a message was produced from an invalid vector"
    raise AssertionError("no error was raised")


@pytest.mark.parametrize("vector", INVALID["vectors"], ids=_ids(INVALID["vectors"]))
def test_invalid_vector_raises_the_named_error(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    max_body = vector.get("max_body", DEFAULT_MAX)
    for pull in (pull_next_message, pull_messages):
        for chunks in chunkings(data):
            exc = _expect_error(chunks, pull, max_body)
            assert error_to_json(exc) == vector["error"], (str(exc), [len(c) for c in chunks])
    with pytest.raises(RemoteProtocolError):
        decode_frame(data, max_body=max_body)
    with pytest.raises(RemoteProtocolError):
        parse_frame(data, max_body=max_body)


@pytest.mark.parametrize("vector", INVALID["vectors"], ids=_ids(INVALID["vectors"]))
def test_after_invalid_vector_decoder_goes_on_or_stops(vector: dict[str, Any]) -> None:
    """Non-fatal: the bad frame is skipped whole and the next frame decodes (PROTOCOL.md
    9.1). Fatal: every later call raises the same error and later bytes are dropped."""
    data = bytes.fromhex(vector["hex"])
    good = VALID["vectors"][0]
    for pull in (pull_next_message, pull_messages):
        decoder = Decoder(max_body=vector.get("max_body", DEFAULT_MAX))
        decoder.receive_data(data)
        with pytest.raises(RemoteProtocolError) as first:
            pull(decoder)
        if vector["error"]["fatal"]:
            decoder.receive_data(bytes.fromhex(good["hex"]) * 100)
            assert decoder.buffered <= len(data)
            for again in (pull_next_message, pull_messages, pull_frames):
                with pytest.raises(RemoteProtocolError) as second:
                    again(decoder)
                assert second.value is first.value
        elif vector["name"] != "frame_length_shorter_than_body":
            assert decoder.consumed == len(data)
            decoder.receive_data(bytes.fromhex(good["hex"]))
            assert [message_to_json(m) for m in pull(decoder)] == [good["message"]]


@pytest.mark.parametrize("vector", INVALID["incomplete"], ids=_ids(INVALID["incomplete"]))
def test_incomplete_vector_waits(vector: dict[str, Any]) -> None:
    data = bytes.fromhex(vector["hex"])
    for pull in PULLS:
        for chunks in chunkings(data):
            got, decoder = feed(chunks, pull, DEFAULT_MAX)
            assert got == []
            assert decoder.buffered == len(data)
            assert decoder.consumed == 0
    with pytest.raises(RemoteProtocolError):
        decode_frame(data)
    with pytest.raises(RemoteProtocolError):
        parse_frame(data)


# --- the vector files themselves --------------------------------------------------------------


def test_vector_files_are_current() -> None:
    """The checked-in JSON is exactly what ``python -m tools.vectors`` writes."""
    for name, text in generate().items():
        assert (load(name)) == __import__("json").loads(text), f"{name} is stale: run python -m tools.vectors"


def test_vector_coverage() -> None:
    """Every frame type, function, event code, status and value type has a valid vector,
    and the invalid ones cover every status the decoder can produce."""
    messages = [v["message"] for v in VALID["vectors"]]
    assert {m["type"] for m in messages} == {"REQUEST", "RESPONSE", "EVENT", "INFO"}
    from jetwire import EventCode
    from jetwire import Function
    from jetwire import Status
    from jetwire import ValueType

    assert {m["function"] for m in messages if m["type"] == "REQUEST"} == {f.name for f in Function}
    assert {m["code"] for m in messages if m["type"] == "EVENT"} == {c.name for c in EventCode}
    statuses = {m["status"] for m in messages if m["type"] == "RESPONSE"}
    closes = {m["status"] for m in messages if m.get("code") == "CLOSE"}
    assert statuses == closes == {s.name for s in Status}
    payloads = {m["payload"] for m in messages if m["type"] == "RESPONSE" and m["status"] == "OK"}
    assert payloads == {"empty", "fetch_id", "value"}
    vtypes = {m["value"]["vtype"] for m in messages if "value" in m}
    assert {int(t) for t in ValueType} | {0x80, 0xFF} <= vtypes
    assert len(VALID["vectors"]) + len(INVALID["vectors"]) >= 120
    errors = {(v["error"]["status"], v["error"]["fatal"]) for v in INVALID["vectors"]}
    assert errors == {
        ("MALFORMED", False),
        ("MALFORMED", True),
        ("UNKNOWN_FUNCTION", False),
        ("UNKNOWN_FUNCTION", True),
        ("TOO_LARGE", True),
    }


def test_mixing_messages_and_next_message_keeps_order() -> None:
    """Pulling with next_message() while a messages() iterator is open neither repeats
    nor skips a frame."""
    vectors = [v for v in VALID["vectors"] if "max_body" not in v][:40]
    stream = b"".join(bytes.fromhex(v["hex"]) for v in vectors)
    decoder = Decoder()
    decoder.receive_data(stream)
    iterator = decoder.messages()
    got = []
    for index, message in enumerate(iterator):
        got.append(message)
        if index % 3 == 0 and (extra := decoder.next_message()) is not None:
            got.append(extra)
    assert [message_to_json(m) for m in got] == [v["message"] for v in vectors]
