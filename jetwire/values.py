"""Typed values (PROTOCOL.md 5.3) and their Python mapping."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any
from typing import Union

from .codes import FIXED_VALUE_WIDTHS
from .codes import ValueType
from .codes import is_known_value_type
from .errors import LocalProtocolError
from .errors import RemoteProtocolError

__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "PythonValue",
    "Value",
    "check_value",
    "from_python",
    "to_python",
]


INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_INT64 = struct.Struct(">q")
_FLOAT64 = struct.Struct(">d")
_BOOL_FALSE = b"\x00"
_BOOL_TRUE = b"\x01"

PythonValue = Union[None, bool, int, float, str, bytes, dict[str, Any], list[Any], "Value"]


@dataclass(frozen=True, slots=True)
class Value:
    """A value as it travels: its type byte and its data bytes, exactly.

    ``Value`` is also the typed wrapper for the types that have no natural Python
    form (CBOR, MSGPACK, application types 0x80..0xFF): ``Value(ValueType.CBOR, raw)``.

    Raises:
        LocalProtocolError: on a reserved type or a wrong fixed width.
    """

    vtype: int
    data: bytes = b""

    def __post_init__(self) -> None:
        if type(self.vtype) is not int:
            if not isinstance(self.vtype, int) or isinstance(self.vtype, bool):
                raise LocalProtocolError(f"value type must be an int, got {type(self.vtype).__name__}")
            object.__setattr__(self, "vtype", int(self.vtype))  # a ValueType member: keep the plain int
        if type(self.data) is not bytes:
            if not isinstance(self.data, (bytes, bytearray, memoryview)):
                raise LocalProtocolError(f"value data must be bytes, got {type(self.data).__name__}")
            # Immutable like the message that carries it, and hashable.
            object.__setattr__(self, "data", bytes(self.data))
        check_value(self.vtype, self.data, LocalProtocolError)

    @classmethod
    def of(cls, obj: PythonValue) -> Value:
        """Map a Python object to a Value (see :func:`from_python`)."""
        return from_python(obj)

    def to_python(self) -> PythonValue:
        """Map this value to Python (see :func:`to_python`)."""
        return to_python(self)

    def __repr__(self) -> str:
        name = _type_name(self.vtype)
        if self.vtype in (ValueType.CBOR, ValueType.MSGPACK, ValueType.BYTES) or self.vtype >= 0x80:
            return f"Value({name}, {self.data!r})"
        try:
            return f"Value({name}, {to_python(self)!r})"
        except RemoteProtocolError:
            return f"Value({name}, {self.data!r})"


def _type_name(vtype: int) -> str:
    try:
        return ValueType(vtype).name
    except ValueError:
        return f"0x{vtype:02X}"


def check_value(vtype: int, data: bytes, error: type[Exception] = RemoteProtocolError) -> None:
    """Raise ``error`` unless (vtype, data) is a well-formed value (PROTOCOL.md 5.3)."""
    if not 0 <= vtype <= 0xFF or not is_known_value_type(vtype):
        raise error(f"reserved value type 0x{vtype:02X}")
    width = FIXED_VALUE_WIDTHS.get(vtype)
    if width is not None and len(data) != width:
        raise error(f"{ValueType(vtype).name} value must be {width} bytes, got {len(data)}")
    if vtype == ValueType.BOOL and data not in (_BOOL_FALSE, _BOOL_TRUE):
        raise error(f"BOOL value must be 0x00 or 0x01, got 0x{data[0]:02X}")
    if vtype == ValueType.STRING:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"STRING value is not valid UTF-8: {exc.reason} at byte {exc.start}") from None
    if len(data) > 0xFFFF_FFFF:
        raise error("value longer than 2**32 - 1 bytes")


_SET_VTYPE = vars(Value)["vtype"].__set__
_SET_DATA = vars(Value)["data"].__set__


def _trusted(vtype: int, data: bytes) -> Value:
    """Build a Value whose bytes are already known valid (produced here, or checked by
    the decoder): no re-validation.

    The frozen-dataclass constructor plus its checks costs microseconds; this is the
    path every Python value sent takes.
    """
    value = object.__new__(Value)
    _SET_VTYPE(value, vtype)
    _SET_DATA(value, data)
    return value


_NONE = Value(ValueType.NONE, b"")
_TRUE = Value(ValueType.BOOL, _BOOL_TRUE)
_FALSE = Value(ValueType.BOOL, _BOOL_FALSE)


def from_python(obj: PythonValue) -> Value:
    """Map a Python object to a :class:`Value`.

    None -> NONE, bool -> BOOL, int -> INT64 (range-checked), float -> FLOAT64,
    str -> STRING, bytes/bytearray/memoryview -> BYTES, dict/list -> JSON (compact,
    UTF-8, NaN refused). A :class:`Value` is returned unchanged.

    Raises:
        LocalProtocolError: for an int outside INT64, a JSON document that cannot be
            encoded, or an object of any other type.
    """
    if isinstance(obj, Value):
        return obj
    if obj is None:
        return _NONE
    if obj is True:
        return _TRUE
    if obj is False:
        return _FALSE
    if isinstance(obj, int):
        if not INT64_MIN <= obj <= INT64_MAX:
            raise LocalProtocolError(f"int {obj} does not fit INT64; send it as a STRING or JSON")
        return _trusted(2, _INT64.pack(obj))
    if isinstance(obj, float):
        return _trusted(3, _FLOAT64.pack(obj))
    if isinstance(obj, str):
        try:
            return _trusted(4, obj.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(f"str is not encodable as UTF-8: {exc.reason}") from None
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return _trusted(6, bytes(obj))
    if isinstance(obj, (dict, list)):
        try:
            text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise LocalProtocolError(f"cannot encode as JSON: {exc}") from None
        return _trusted(5, text.encode("utf-8"))
    raise LocalProtocolError(
        f"no jet value type for {type(obj).__name__}; wrap it in Value(vtype, data)"
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def to_python(value: Value) -> PythonValue:
    """Map a :class:`Value` to Python; the inverse of :func:`from_python`.

    CBOR, MSGPACK and application types come back as the :class:`Value` itself.

    Raises:
        RemoteProtocolError: for a JSON value that is not valid JSON.
    """
    vtype = value.vtype
    data = value.data
    if vtype == ValueType.NONE:
        return None
    if vtype == ValueType.BOOL:
        return data == _BOOL_TRUE
    if vtype == ValueType.INT64:
        return int(_INT64.unpack(data)[0])
    if vtype == ValueType.FLOAT64:
        return float(_FLOAT64.unpack(data)[0])
    if vtype == ValueType.STRING:
        return data.decode("utf-8")
    if vtype == ValueType.BYTES:
        return data
    if vtype == ValueType.JSON:
        # PROTOCOL.md 5.3: JSON is UTF-8 (json.loads would also guess UTF-16/32 from
        # bytes), and NaN/Infinity are not JSON (from_python refuses to send them).
        try:
            result: Any = json.loads(data.decode("utf-8"), parse_constant=_refuse_constant)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise RemoteProtocolError(f"JSON value is not valid JSON: {exc}") from None
        return result  # type: ignore[no-any-return]
    return value
