"""Value and the Python mapping (PROTOCOL.md 5.3), and encoder-side API misuse."""

from __future__ import annotations

import math
import struct

import pytest

from jetwire import AddMethod
from jetwire import Close
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import LocalProtocolError
from jetwire import RemoteProtocolError
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueType
from jetwire import encode
from jetwire import from_python
from jetwire import to_python


@pytest.mark.parametrize(
    ("obj", "vtype", "data"),
    [
        (None, ValueType.NONE, b""),
        (True, ValueType.BOOL, b"\x01"),
        (False, ValueType.BOOL, b"\x00"),
        (0, ValueType.INT64, bytes(8)),
        (-1, ValueType.INT64, b"\xff" * 8),
        (2**63 - 1, ValueType.INT64, b"\x7f" + b"\xff" * 7),
        (-(2**63), ValueType.INT64, b"\x80" + bytes(7)),
        (22.5, ValueType.FLOAT64, bytes.fromhex("4036800000000000")),
        (-0.0, ValueType.FLOAT64, bytes.fromhex("8000000000000000")),
        (math.inf, ValueType.FLOAT64, bytes.fromhex("7ff0000000000000")),
        ("Größe", ValueType.STRING, "Größe".encode()),
        ("", ValueType.STRING, b""),
        (b"\x00\xff", ValueType.BYTES, b"\x00\xff"),
        (bytearray(b"ab"), ValueType.BYTES, b"ab"),
        (memoryview(b"ab"), ValueType.BYTES, b"ab"),
        ({"a": [1, 2.5, None, True], "é": "x"}, ValueType.JSON, '{"a":[1,2.5,null,true],"é":"x"}'.encode()),
        ([], ValueType.JSON, b"[]"),
    ],
)
def test_from_python(obj: object, vtype: int, data: bytes) -> None:
    value = from_python(obj)  # type: ignore[arg-type]
    assert value == Value(vtype, data)
    assert Value.of(obj) == value  # type: ignore[arg-type]
    assert type(value.data) is bytes
    back = to_python(value)
    assert back == (bytes(obj) if isinstance(obj, (bytearray, memoryview)) else obj)  # type: ignore[arg-type]


def test_bool_is_not_int64_and_int_subclasses_are() -> None:
    assert from_python(True).vtype == ValueType.BOOL
    assert from_python(Status.NOT_FOUND).vtype == ValueType.INT64  # an IntEnum is an int


@pytest.mark.parametrize("n", [2**63, -(2**63) - 1, 10**30])
def test_int_out_of_int64_range(n: int) -> None:
    with pytest.raises(LocalProtocolError, match="INT64"):
        from_python(n)


@pytest.mark.parametrize(
    "obj", [object(), (1, 2), {1, 2}, {"nan": math.nan}, [math.inf], {"x": object()}, "\ud800"]
)
def test_unmappable_objects(obj: object) -> None:
    with pytest.raises(LocalProtocolError):
        from_python(obj)  # type: ignore[arg-type]


def test_nan_float_round_trips_its_bits() -> None:
    value = from_python(math.nan)
    assert value.vtype == ValueType.FLOAT64
    assert math.isnan(to_python(value))  # type: ignore[arg-type]
    payload = Value(ValueType.FLOAT64, bytes.fromhex("7ff0000000000001"))
    assert payload.data == bytes.fromhex("7ff0000000000001")  # carried untouched


def test_value_passes_through_from_python() -> None:
    cbor = Value(ValueType.CBOR, b"\xa0")
    assert from_python(cbor) is cbor
    assert to_python(cbor) is cbor
    for vtype in (ValueType.MSGPACK, 0x80, 0xFF):
        assert to_python(Value(vtype, b"\x01")) == Value(vtype, b"\x01")


@pytest.mark.parametrize(
    ("vtype", "data"),
    [
        (ValueType.NONE, b"\x00"),
        (ValueType.BOOL, b""),
        (ValueType.BOOL, b"\x00\x01"),
        (ValueType.BOOL, b"\x02"),
        (ValueType.INT64, bytes(7)),
        (ValueType.FLOAT64, bytes(9)),
        (ValueType.STRING, b"caf\xe9"),
        (0x09, b""),
        (0x7F, b""),
        (0x100, b""),
        (-1, b""),
        ("STRING", b""),
        (ValueType.BYTES, "text"),
    ],
)
def test_invalid_values_are_local_errors(vtype: object, data: object) -> None:
    with pytest.raises(LocalProtocolError):
        Value(vtype, data)  # type: ignore[arg-type]


def test_value_is_immutable_and_hashable() -> None:
    value = Value(ValueType.BYTES, bytearray(b"ab"))
    assert type(value.data) is bytes
    assert hash(value) == hash(Value(ValueType.BYTES, b"ab"))
    with pytest.raises(AttributeError):
        value.data = b"x"  # type: ignore[misc]


@pytest.mark.parametrize("data", [b"{not json", b"NaN", b"[Infinity]", b"\xff", "[1]".encode("utf-16"), b"[" * 100000])
def test_invalid_json_is_a_remote_error(data: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        to_python(Value(ValueType.JSON, data))


def test_int64_decodes_signed() -> None:
    assert to_python(Value(ValueType.INT64, struct.pack(">q", -5))) == -5


@pytest.mark.parametrize(
    "message",
    [
        GetState(1, ""),
        GetState(1, "k" * 65536),
        GetState(1, "\ud800"),
        GetState(-1, "k"),
        GetState(2**32, "k"),
        GetState(None, "k"),
        AddMethod(None, "k"),
        Unfetch(1, 2**32),
        FetchStates(1, "p" * 65536),
        SetState(1, "k", 1.5),  # type: ignore[arg-type]
        Response(1, Status.OK, message="not allowed"),
        Response(1, Status.OK, Value.of(1), fetch_id=2),
        Response(1, Status.NOT_FOUND, Value.of(1)),
        Response(1, Status.NOT_FOUND, fetch_id=1),
        Response(1, 0x55),  # type: ignore[arg-type]
        Close(0x55, ""),  # type: ignore[arg-type]
        Info("x", max_body=2**32),
        Info("x", major=256),
        "not a message",
    ],
)
def test_encode_refuses_what_the_spec_forbids(message: object) -> None:
    with pytest.raises(LocalProtocolError):
        encode(message)  # type: ignore[arg-type]
