"""hypothesis properties of the codec (bounded: the whole file runs in a few seconds).

- encode -> decode is the identity for every message type, any chunking;
- the fast path and the construct schema agree both ways on generated messages;
- on arbitrary and on mutated bytes, the fast path and the schema accept the same
  frames with the same fields;
- random bytes through the Decoder raise nothing but RemoteProtocolError, never loop
  forever and never buffer beyond the frame they wait for.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from jetwire import EVENT_FUNCTIONS
from jetwire import FETCH_EVENT_CLASSES
from jetwire import REQUEST_CLASSES
from jetwire import Action
from jetwire import Authenticate
from jetwire import Close
from jetwire import Decoder
from jetwire import EntryKind
from jetwire import FetchMethod
from jetwire import FetchNode
from jetwire import FetchQuery
from jetwire import FetchStates
from jetwire import FetchWindow
from jetwire import FilterOp
from jetwire import Info
from jetwire import KeyRequest
from jetwire import KeyValueRequest
from jetwire import Message
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import QueryEntry
from jetwire import QueryOnce
from jetwire import RemoteProtocolError
from jetwire import Response
from jetwire import SortBy
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueFilter
from jetwire import ValueType
from jetwire import WindowEntry
from jetwire import decode_frame
from jetwire import encode
from jetwire.schema import build_frame
from jetwire.schema import parse_frame
from tools.vectors import container_to_json
from tools.vectors import json_to_container
from tools.vectors import load
from tools.vectors import message_to_json

BOUNDED = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u32 = st.integers(0, 0xFFFFFFFF)
text = st.text(max_size=40)
keys = st.text(min_size=1, max_size=40).filter(lambda k: 0 < len(k.encode("utf-8")) <= 0xFFFF)


def _value(vtype: int, data: bytes) -> Value:
    return Value(vtype, data)


values = st.one_of(
    st.just(Value(ValueType.NONE)),
    st.booleans().map(Value.of),
    st.integers(-(2**63), 2**63 - 1).map(Value.of),
    st.binary(min_size=8, max_size=8).map(lambda b: Value(ValueType.FLOAT64, b)),  # every bit pattern
    st.floats(allow_nan=True).map(Value.of),
    text.map(Value.of),
    st.builds(
        _value,
        st.sampled_from([ValueType.JSON, ValueType.BYTES, ValueType.CBOR, ValueType.MSGPACK, *range(0x80, 0x100)]),
        st.binary(max_size=64),
    ),
)
ids = u32
optional_ids = st.one_of(st.none(), u32)
non_ok = st.sampled_from([s for s in Status if s != Status.OK])

u8 = st.integers(0, 255)
short_text = st.text(max_size=12)
# PROTOCOL.md 14.1: any codes the layout allows (the daemon, not the codec, judges meaning).
matchers = st.builds(PathMatcher, st.sampled_from(list(PathOp)), st.lists(short_text, max_size=3).map(tuple), u8)
filters = st.builds(ValueFilter, st.sampled_from(list(FilterOp)), values, short_text, u8)
queries = st.builds(
    Query,
    st.lists(matchers, max_size=3).map(tuple),
    st.lists(filters, max_size=3).map(tuple),
    st.sampled_from(list(SortBy)),
    short_text,
    u8,
    u32,
    u32,
    u8,
)
window_entries = st.lists(st.builds(WindowEntry, u32, keys, values), max_size=4).map(tuple)

messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(FetchQuery, ids, queries),
    st.builds(QueryOnce, ids, queries),
    *(st.builds(cls, u32, keys, values) for cls in FETCH_EVENT_CLASSES.values()),
    st.builds(FetchMethod, u32, st.sampled_from(list(Action)), keys),
    st.builds(FetchNode, u32, st.sampled_from(list(Action)), keys),
    st.builds(FetchWindow, u32, u32, window_entries),
    st.builds(QueryEntry, u32, st.sampled_from(list(EntryKind)), keys, values),
    # One strategy per request layout, for every class of that layout.
    *(
        st.builds(cls, optional_ids if cls.function in EVENT_FUNCTIONS else ids, keys, values)
        for cls in REQUEST_CLASSES.values()
        if issubclass(cls, KeyValueRequest)
    ),
    *(st.builds(cls, ids, keys) for cls in REQUEST_CLASSES.values() if issubclass(cls, KeyRequest)),
    st.builds(FetchStates, ids, text),
    st.builds(Unfetch, ids, u32),
    st.builds(Authenticate, ids, keys, text),
    st.builds(Response, ids),
    st.builds(lambda i, v: Response(i, value=v), ids, values),
    st.builds(lambda i, f: Response(i, fetch_id=f), ids, u32),
    st.builds(lambda i, s, m: Response(i, s, message=m), ids, non_ok, text),
    st.builds(Close, st.sampled_from(list(Status)), text),
    st.builds(Info, text, u32, u32, st.just(1), st.integers(0, 255)),
)


@BOUNDED
@given(st.lists(messages, min_size=1, max_size=8), st.integers(1, 64))
def test_encode_decode_round_trip(batch: list[Message], step: int) -> None:
    stream = b"".join(encode(m) for m in batch)
    for pull_all in (True, False):
        decoder = Decoder()
        got: list[Message] = []
        for i in range(0, len(stream), step):
            decoder.receive_data(stream[i : i + step])
            if pull_all:
                got.extend(decoder.messages())
            else:
                while (m := decoder.next_message()) is not None:
                    got.append(m)
        assert got == batch
        assert decoder.buffered == 0


@BOUNDED
@given(messages)
def test_fast_path_and_schema_agree_on_messages(message: Message) -> None:
    frame = encode(message)
    assert decode_frame(frame) == message
    as_json = message_to_json(message)
    assert container_to_json(parse_frame(frame)) == as_json
    assert build_frame(json_to_container(as_json)) == frame


def _outcome_fast(frame: bytes) -> object:
    try:
        return message_to_json(decode_frame(frame))
    except RemoteProtocolError:
        return "rejected"


def _outcome_schema(frame: bytes) -> object:
    try:
        return container_to_json(parse_frame(frame))
    except RemoteProtocolError:
        return "rejected"


@BOUNDED
@given(st.binary(max_size=64))
def test_fast_path_and_schema_agree_on_random_frames(body: bytes) -> None:
    for ftype in (1, 2, 3, 4):
        frame = struct.pack(">BI", ftype, len(body)) + body
        assert _outcome_fast(frame) == _outcome_schema(frame)


VALID_FRAMES = [bytes.fromhex(v["hex"]) for v in load("frames-valid.json")["vectors"] if len(v["hex"]) < 2000]


@BOUNDED
@given(
    st.sampled_from(VALID_FRAMES),
    st.lists(st.tuples(st.integers(5, 1000), st.integers(1, 255)), min_size=1, max_size=3),
)
def test_fast_path_and_schema_agree_on_mutated_vectors(frame: bytes, flips: list[tuple[int, int]]) -> None:
    """Flip bytes of a valid body (the header is kept honest so both see one frame)."""
    mutated = bytearray(frame)
    for position, mask in flips:
        mutated[position % (len(frame) - 5) + 5 if len(frame) > 5 else 0] ^= mask
    assert _outcome_fast(bytes(mutated)) == _outcome_schema(bytes(mutated))


@BOUNDED
@given(st.binary(max_size=300), st.integers(1, 50), st.integers(0, 64))
def test_random_bytes_only_raise_protocol_errors(data: bytes, step: int, max_body: int) -> None:
    decoder = Decoder(max_body=max_body)
    calls = 0
    for i in range(0, len(data), step):
        decoder.receive_data(data[i : i + step])
        while True:
            calls += 1
            assert calls < 10_000, "decoder does not make progress"
            try:
                message = decoder.next_message()
            except RemoteProtocolError as exc:
                if exc.fatal:
                    break
                continue
            if message is None:
                break
        # Never more than one incomplete frame (header + max_body) is kept.
        assert decoder.buffered <= 5 + max_body + step


def _one_at_a_time(decoder: Decoder) -> Iterator[Message]:
    """Drain through the careful parsers: next_message() until it needs more bytes."""
    while (message := decoder.next_message()) is not None:
        yield message


def _outcomes(data: bytes, step: int, max_body: int, drain: Callable[[Decoder], Iterable[Message]]) -> list[object]:
    """The messages and errors of ``data`` fed ``step`` bytes at a time, drained by ``drain``."""
    decoder = Decoder(max_body=max_body)
    out: list[object] = []
    for i in range(0, len(data), step):
        decoder.receive_data(data[i : i + step])
        while True:
            try:
                out.extend(drain(decoder))
            except RemoteProtocolError as exc:
                out.append(("error", str(exc), exc.status, exc.fatal, exc.request_id))
                if exc.fatal:
                    return out
                continue
            break
    return out


@BOUNDED
@given(
    st.lists(st.sampled_from(VALID_FRAMES), min_size=1, max_size=6),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), max_size=4),
    st.integers(1, 40),
    st.sampled_from([16, 64, 1 << 20]),
)
def test_messages_and_next_message_agree(
    frames: list[bytes], flips: list[tuple[int, int]], step: int, max_body: int
) -> None:
    """messages() parses the common frames inline; next_message() goes through the
    careful parsers. On any (mutated) stream both give the same messages and errors."""
    stream = bytearray(b"".join(frames))
    for position, mask in flips:
        stream[position % len(stream)] ^= mask
    data = bytes(stream)
    assert _outcomes(data, step, max_body, Decoder.messages) == _outcomes(data, step, max_body, _one_at_a_time)
