"""Conformance cases as data: loading, the JSON message form, patterns and expressions.

The case language is documented in ``spec/conformance/README.md``; this module is its
reference implementation. Nothing here does I/O on sockets: :mod:`.runner` does that.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import re
import struct
import sys
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any
from typing import Optional
from typing import Union

from jetwire import FETCH_EVENT_CLASSES
from jetwire import REQUEST_CLASSES
from jetwire import Authenticate
from jetwire import Close
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
from jetwire import Response
from jetwire import SortBy
from jetwire import Status
from jetwire import Unfetch
from jetwire import Value
from jetwire import ValueFilter
from jetwire import ValueType
from jetwire.errors import JetError

__all__ = [
    "REQUIREMENTS",
    "Case",
    "CaseError",
    "Env",
    "Pattern",
    "build_message",
    "build_raw",
    "describe_message",
    "evaluate",
    "load_cases",
    "match_message",
    "message_fields",
    "select_cases",
    "value_from_json",
    "value_to_json",
]

# A case's requirement level: MUST cases FAIL when unmet, SHOULD cases are NON-STRICT,
# INFORMATIONAL cases only record what the daemon did (PROTOCOL.md 1: RFC 2119 words).
REQUIREMENTS = ("MUST", "SHOULD", "INFORMATIONAL")

OPS = frozenset(
    {"connect", "send", "expect", "expect_silence", "expect_close", "expect_disconnect",
     "disconnect", "sleep", "repeat", "assert_distinct", "assert", "http"}
)

_NAME = r"[A-Za-z_][A-Za-z0-9_.]*"
_CAPTURE_RE = re.compile(rf"^\?({_NAME})$")
_VAR_RE = re.compile(rf"^\$({_NAME})$")
_TEMPLATE_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
ANY = "*"

Env = dict[str, Any]


class CaseError(Exception):
    """A case file is not valid in the case language (an authoring error, not a daemon fault)."""


# --- expressions ----------------------------------------------------------------------

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}
_FUNCS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "int": int}


def evaluate(expr: Union[int, float, str], env: Mapping[str, Any]) -> Union[int, float]:
    """Evaluate a numeric expression of the case language.

    A number is returned as is; a string is an arithmetic expression over numbers and
    run variables (``route_timeout * 1.5 + 0.2``, ``$max_body + 1``; the ``$`` is
    optional), with ``+ - * / // %``, unary minus, parentheses, ``min``/``max``/``int``,
    and (for ``requires``) one comparison per operand pair joined by ``and``/``or``/``not``.

    Raises:
        CaseError: for anything else, or an unknown variable.
    """
    if isinstance(expr, bool) or not isinstance(expr, (int, float, str)):
        raise CaseError(f"expected a number or an expression, got {expr!r}")
    if not isinstance(expr, str):
        return expr
    text = expr.replace("$", "").strip()
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CaseError(f"bad expression {expr!r}: {exc.msg}") from None

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise CaseError(f"unknown variable {node.id!r} in {expr!r}")
            value = env[node.id]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CaseError(f"variable {node.id!r} is not a number: {value!r}")
            return value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not walk(node.operand)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return _COMPARE[type(node.ops[0])](walk(node.left), walk(node.comparators[0]))
        if isinstance(node, ast.BoolOp):
            values = [walk(item) for item in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCS
            and not node.keywords
        ):
            return _FUNCS[node.func.id](*(walk(arg) for arg in node.args))
        raise CaseError(f"unsupported expression {expr!r}")

    result = walk(tree)
    if isinstance(result, float) and result.is_integer() and "/" not in text:
        return int(result)
    return result  # type: ignore[no-any-return]


def evaluate_int(expr: Any, env: Mapping[str, Any], what: str) -> int:
    """Evaluate ``expr`` and require a whole number."""
    result = evaluate(expr, env)
    if isinstance(result, float):
        if not result.is_integer():
            raise CaseError(f"{what} must be a whole number, got {result}")
        result = int(result)
    return result


# --- values -----------------------------------------------------------------------------

_INT64 = struct.Struct(">q")
_FLOAT64 = struct.Struct(">d")
_HEX_TYPES = {"BYTES": ValueType.BYTES, "CBOR": ValueType.CBOR, "MSGPACK": ValueType.MSGPACK}


def _hex(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise CaseError(f"{what}: expected a hex string, got {text!r}")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise CaseError(f"{what}: not hex: {text!r}") from None


def _bytes_spec(spec: Any, env: Mapping[str, Any], what: str) -> bytes:
    """Hex text, or ``{"fill": HEX, "len": EXPR}`` for long generated data."""
    if isinstance(spec, dict):
        unknown = set(spec) - {"fill", "len"}
        if unknown or "len" not in spec:
            raise CaseError(f"{what}: a generated byte string is {{'fill': HEX, 'len': EXPR}}")
        fill = _hex(spec.get("fill", "00"), what) or b"\x00"
        length = evaluate_int(spec["len"], env, what)
        if length < 0:
            raise CaseError(f"{what}: negative length {length}")
        return (fill * (length // len(fill) + 1))[:length]
    return _hex(spec, what)


def value_from_json(obj: Any, env: Mapping[str, Any]) -> Value:
    """Build a :class:`Value` from its JSON form (one key naming the type).

    ``{"NONE": null}``, ``{"BOOL": true}``, ``{"INT64": 21}``, ``{"FLOAT64": 22.5}`` (or
    ``"nan"``, ``"inf"``, ``"-inf"``), ``{"STRING": "text"}``, ``{"JSON": "[1,2]"}`` (the
    document text), ``{"BYTES": HEX}``, ``{"CBOR": HEX}``, ``{"MSGPACK": HEX}``,
    ``{"0x80": HEX}`` (application types); ``"$name"`` is a captured value. The value
    form of ``spec/vectors/`` (``{"type": "INT64", "vtype": 2, "hex": "..."}``) is
    accepted too.

    Raises:
        CaseError: if ``obj`` is not a valid value form.
    """
    if isinstance(obj, str):
        var = _VAR_RE.match(obj)
        if var:
            bound = env.get(var.group(1))
            if not isinstance(bound, Value):
                raise CaseError(f"{obj} is not a captured value")
            return bound
    if isinstance(obj, dict) and "hex" in obj and ("vtype" in obj or "type" in obj):
        # The form of spec/vectors/*.json: {"type": "INT64", "vtype": 2, "hex": "..."}.
        vtype = obj.get("vtype", obj.get("type"))
        if isinstance(vtype, str):
            vtype = int(vtype, 16) if vtype.startswith("0x") else getattr(ValueType, vtype, None)
        if not isinstance(vtype, int):
            raise CaseError(f"bad vtype in {obj!r}")
        try:
            return Value(vtype, _hex(obj["hex"], "value hex"))
        except JetError as exc:
            raise CaseError(f"bad value {obj!r}: {exc}") from None
    if not isinstance(obj, dict) or len(obj) != 1:
        raise CaseError(f"a value is a one-key object like {{'INT64': 21}}, got {obj!r}")
    ((tname, data),) = obj.items()
    try:
        if tname == "NONE":
            return Value(ValueType.NONE, b"")
        if tname == "BOOL":
            if not isinstance(data, bool):
                raise CaseError(f"BOOL takes true or false, got {data!r}")
            return Value(ValueType.BOOL, b"\x01" if data else b"\x00")
        if tname == "INT64":
            return Value(ValueType.INT64, _INT64.pack(evaluate_int(data, env, "INT64")))
        if tname == "FLOAT64":
            number = float(data) if data in ("nan", "inf", "-inf") else float(evaluate(data, env))
            return Value(ValueType.FLOAT64, _FLOAT64.pack(number))
        if tname == "STRING":
            if not isinstance(data, str):
                raise CaseError(f"STRING takes a string, got {data!r}")
            return Value(ValueType.STRING, data.encode("utf-8"))
        if tname == "JSON":
            text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
            return Value(ValueType.JSON, text.encode("utf-8"))
        if tname in _HEX_TYPES:
            return Value(_HEX_TYPES[tname], _bytes_spec(data, env, tname))
        if re.fullmatch(r"0x[89a-fA-F][0-9a-fA-F]", tname):
            return Value(int(tname, 16), _bytes_spec(data, env, tname))
    except (struct.error, OverflowError, JetError) as exc:
        raise CaseError(f"bad {tname} value {data!r}: {exc}") from None
    raise CaseError(f"unknown value type {tname!r}")


def value_to_json(value: Value) -> dict[str, Any]:
    """The JSON form of a received :class:`Value` (the inverse of :func:`value_from_json`)."""
    vtype, data = value.vtype, value.data
    if vtype == ValueType.NONE:
        return {"NONE": None}
    if vtype == ValueType.BOOL:
        return {"BOOL": data == b"\x01"}
    if vtype == ValueType.INT64:
        return {"INT64": _INT64.unpack(data)[0]}
    if vtype == ValueType.FLOAT64:
        number = _FLOAT64.unpack(data)[0]
        return {"FLOAT64": number if math.isfinite(number) else str(number)}
    if vtype == ValueType.STRING:
        return {"STRING": data.decode("utf-8", errors="replace")}
    if vtype == ValueType.JSON:
        return {"JSON": data.decode("utf-8", errors="replace")}
    for name, code in _HEX_TYPES.items():
        if vtype == code:
            return {name: data.hex()}
    return {f"0x{vtype:02X}": data.hex()}


# --- keys -----------------------------------------------------------------------------


def _template(text: str, env: Mapping[str, Any]) -> str:
    """Substitute ``{name}`` with run variables (e.g. a ``repeat`` counter) in keys."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise CaseError(f"unknown variable {{{name}}} in {text!r}")
        return str(env[name])

    return _TEMPLATE_RE.sub(sub, text)


def resolve_key(spec: Any, env: Mapping[str, Any], namespace: str, what: str = "key") -> str:
    """The key actually sent for a case key.

    A plain string is prefixed with the case's namespace (so concurrent cases never
    share keys); ``{"raw": "k"}`` is sent unprefixed; ``{"pad_to": N, "key": "k"}`` is the
    namespaced key padded with ``x`` to exactly N UTF-8 bytes (key-length limits).
    """
    if isinstance(spec, str):
        return namespace + _template(spec, env)
    if isinstance(spec, dict):
        if set(spec) == {"raw"} and isinstance(spec["raw"], str):
            return _template(spec["raw"], env)
        if set(spec) <= {"pad_to", "key"} and "pad_to" in spec:
            base = (namespace + _template(str(spec.get("key", "")), env)).encode("utf-8")
            length = evaluate_int(spec["pad_to"], env, "pad_to")
            if length < len(base):
                raise CaseError(f"pad_to {length} is shorter than the namespaced key {base!r}")
            return (base + b"x" * (length - len(base))).decode("utf-8")
    raise CaseError(f"bad {what}: {spec!r}")


# --- messages ---------------------------------------------------------------------------

# PROTOCOL.md 14.1: operands of these path matchers are keys or key prefixes, and are
# namespaced like keys; the others (ENDS_WITH, CONTAINS, CONTAINS_ALL_OF) are sent as they
# are, so a case using them adds a STARTS_WITH "" to stay inside its namespace.
_NAMESPACED_OPS = frozenset({"STARTS_WITH", "EQUALS", "EQUALS_ONE_OF"})


def _query(obj: Mapping[str, Any], env: Mapping[str, Any], namespace: str) -> Query:
    """A query from the case form: ``{"match": [[OP, [operands], flags]], "where": [[OP,
    field, value]], "sort": [BY, field, descending, from, to], "flags": n}``."""
    matchers = []
    for op, operands, *flags in obj.get("match", []):
        if op not in PathOp.__members__:
            raise CaseError(f"unknown path matcher {op!r}")
        texts = tuple(resolve_key(o, env, namespace) if op in _NAMESPACED_OPS else str(o) for o in operands)
        matchers.append(PathMatcher(PathOp[op], texts, int(flags[0]) if flags else 0))
    filters = []
    for op, field_path, operand in obj.get("where", []):
        if op not in FilterOp.__members__:
            raise CaseError(f"unknown value filter {op!r}")
        filters.append(ValueFilter(FilterOp[op], value_from_json(operand, env), str(field_path)))
    by, field_path, descending, start, stop = obj.get("sort", ["NONE", "", False, 0, 0])
    if by not in SortBy.__members__:
        raise CaseError(f"unknown sort {by!r}")
    return Query(
        tuple(matchers), tuple(filters), SortBy[by], str(field_path), 1 if descending else 0,
        int(start), int(stop), int(obj.get("flags", 0)),
    )


_KEY_VALUE = {cls.function.name: cls for cls in REQUEST_CLASSES.values() if issubclass(cls, KeyValueRequest)}
_KEY_ONLY = {cls.function.name: cls for cls in REQUEST_CLASSES.values() if issubclass(cls, KeyRequest)}
_FETCH_EVENTS = {cls.code.name: cls for cls in FETCH_EVENT_CLASSES.values()}
# PROTOCOL.md 14 (protocol 1.1): queries, and the events only they cause.
_QUERIES = {"FETCH_QUERY": FetchQuery, "QUERY_ONCE": QueryOnce}
_KEY_EVENTS = {"FETCH_METHOD": FetchMethod, "FETCH_NODE": FetchNode}
KINDS = frozenset(
    {*_KEY_VALUE, *_KEY_ONLY, *_FETCH_EVENTS, *_QUERIES, *_KEY_EVENTS, "FETCH_STATES", "UNFETCH", "RESPONSE",
     "INFO", "CLOSE", "FETCH_WINDOW", "QUERY_ENTRY", "AUTHENTICATE"}
)
_KIND_OF: dict[type, str] = {
    **{cls: name for name, cls in {**_KEY_VALUE, **_KEY_ONLY, **_FETCH_EVENTS, **_QUERIES, **_KEY_EVENTS}.items()},
    FetchWindow: "FETCH_WINDOW",
    QueryEntry: "QUERY_ENTRY",
    FetchStates: "FETCH_STATES",
    Unfetch: "UNFETCH",
    Authenticate: "AUTHENTICATE",
    Response: "RESPONSE",
    Info: "INFO",
    Close: "CLOSE",
}
_FIELDS: dict[str, tuple[str, ...]] = {
    **{name: ("id", "key", "value") for name in _KEY_VALUE},
    **{name: ("id", "key") for name in _KEY_ONLY},
    **{name: ("fetch_id", "key", "value") for name in _FETCH_EVENTS},
    "FETCH_STATES": ("id", "prefix"),
    **{name: ("id", "query") for name in _QUERIES},
    **{name: ("fetch_id", "action", "key") for name in _KEY_EVENTS},
    "FETCH_WINDOW": ("fetch_id", "size", "entries"),
    "QUERY_ENTRY": ("id", "kind", "key", "value"),
    "UNFETCH": ("id", "fetch_id"),
    "AUTHENTICATE": ("id", "user", "password"),
    "RESPONSE": ("id", "status", "value", "fetch_id", "message"),
    "INFO": ("major", "minor", "max_body", "features", "name", "max_key_length", "route_timeout_ms"),
    "CLOSE": ("status", "message"),
}


def _status(spec: Any) -> Status:
    try:
        if isinstance(spec, str):
            return Status[spec]
        if isinstance(spec, int) and not isinstance(spec, bool):
            return Status(spec)
    except (KeyError, ValueError):
        pass
    raise CaseError(f"unknown status {spec!r}")


def _lookup(spec: Any, env: Mapping[str, Any]) -> Any:
    if isinstance(spec, str):
        var = _VAR_RE.match(spec)
        if var:
            if var.group(1) not in env:
                raise CaseError(f"{spec} is not bound")
            return env[var.group(1)]
    return spec


def _check_fields(obj: Mapping[str, Any]) -> str:
    kind = obj.get("msg")
    if kind not in KINDS:
        raise CaseError(f"unknown message kind {kind!r} (one of {sorted(KINDS)})")
    extra = set(obj) - {"msg", *_FIELDS[kind]}
    if extra:
        raise CaseError(f"{kind} has no field(s) {sorted(extra)}")
    return str(kind)


def build_message(obj: Mapping[str, Any], env: Mapping[str, Any], namespace: str) -> Message:
    """Build the jetwire message a ``send`` step describes (see the README's message form).

    A SET_STATE, NOTIFY_STATE or CALL_METHOD without ``id`` (or with ``"id": null``) is
    the fire-and-forget EVENT form (PROTOCOL.md 7.1).

    Raises:
        CaseError: for an invalid form or a message jetwire refuses to encode.
    """
    kind = _check_fields(obj)

    def num(name: str, default: Any = None) -> Any:
        spec = _lookup(obj.get(name, default), env)
        return None if spec is None else evaluate_int(spec, env, name)

    def key() -> str:
        if "key" not in obj:
            raise CaseError(f"{kind} needs a key")
        return resolve_key(_lookup(obj["key"], env), env, namespace)

    def value() -> Value:
        return value_from_json(obj.get("value", {"NONE": None}), env)

    try:
        if kind in _KEY_VALUE:
            return _KEY_VALUE[kind](num("id"), key(), value())
        if kind in _KEY_ONLY:
            return _KEY_ONLY[kind](num("id"), key())
        if kind in _FETCH_EVENTS:
            return _FETCH_EVENTS[kind](num("fetch_id", 0), key(), value())
        if kind in _QUERIES:
            return _QUERIES[kind](num("id"), _query(obj.get("query", {}), env, namespace))
        if kind == "FETCH_STATES":
            prefix = resolve_key(_lookup(obj.get("prefix", ""), env), env, namespace, "prefix")
            return FetchStates(num("id"), prefix)
        if kind == "UNFETCH":
            return Unfetch(num("id"), num("fetch_id", 0))
        if kind == "AUTHENTICATE":
            # PROTOCOL.md 6.12: user and password as given (never namespaced).
            return Authenticate(num("id"), str(obj.get("user", "")), str(obj.get("password", "")))
        if kind == "RESPONSE":
            status = _status(obj.get("status", "OK"))
            val = value_from_json(obj["value"], env) if obj.get("value") is not None else None
            return Response(num("id"), status, val, num("fetch_id"), str(obj.get("message", "")))
        if kind == "INFO":
            return Info(
                str(obj.get("name", "jet-conformance")),
                num("max_body", 1 << 20),
                num("features", 0),
                num("major", 1),
                num("minor", 0),
                num("max_key_length"),
                num("route_timeout_ms"),
            )
        return Close(_status(obj.get("status", "OK")), str(obj.get("message", "")))
    except (JetError, TypeError) as exc:
        raise CaseError(f"cannot build {kind}: {exc}") from None


def message_fields(message: Message) -> dict[str, Any]:
    """A received message as ``{"msg": KIND, field: value}`` with jetwire Values kept."""
    kind = _KIND_OF[type(message)]
    fields: dict[str, Any] = {"msg": kind}
    for name in _FIELDS[kind]:
        item = getattr(message, name)
        if name == "status":
            item = Status(item).name
        elif name in ("action", "kind"):
            item = item.name
        elif name == "query":  # only ever sent: shown in reports
            item = repr(item)
        elif name == "entries":  # FETCH_WINDOW: [[index, key], ...] (values are not compared)
            item = [[entry.index, entry.key] for entry in item]
        fields[name] = item
    if kind == "RESPONSE" and message.status != Status.OK:  # type: ignore[attr-defined]
        fields.pop("value")
        fields.pop("fetch_id")
    return fields


def describe_message(message: Message) -> dict[str, Any]:
    """A received message in the JSON form of the case language (for reports)."""
    fields = message_fields(message)
    return {
        name: value_to_json(item) if isinstance(item, Value) else item for name, item in fields.items()
    }


# --- raw frames -----------------------------------------------------------------------

_FRAME_TYPES = {"REQUEST": 1, "RESPONSE": 2, "EVENT": 3, "INFO": 4}


def _raw_part(part: Any, env: Mapping[str, Any], namespace: str) -> bytes:
    if isinstance(part, str):
        return _hex(part, "raw part")
    if not isinstance(part, dict) or len(part) != 1:
        raise CaseError(f"a raw part is hex or a one-key object, got {part!r}")
    ((kind, spec),) = part.items()
    if kind in ("u8", "u16", "u32"):
        number = evaluate_int(_lookup(spec, env), env, kind)
        size = {"u8": 1, "u16": 2, "u32": 4}[kind]
        if not 0 <= number < 1 << (8 * size):
            raise CaseError(f"{kind} out of range: {number}")
        return number.to_bytes(size, "big")
    if kind == "key":  # str16 of a namespaced key
        raw = resolve_key(spec, env, namespace).encode("utf-8")
        return len(raw).to_bytes(2, "big") + raw
    if kind == "utf8":
        return str(spec).encode("utf-8")
    if kind == "value":
        value = value_from_json(spec, env)
        return bytes([value.vtype]) + len(value.data).to_bytes(4, "big") + value.data
    if kind == "fill":
        return _bytes_spec(spec, env, "fill")
    raise CaseError(f"unknown raw part {kind!r}")


def build_raw(step: Mapping[str, Any], env: Mapping[str, Any], namespace: str) -> bytes:
    """The bytes of a raw ``send``: ``hex`` text, or a ``frame`` assembled from parts.

    ``{"frame": {"type": "REQUEST", "body": [parts...], "length": EXPR}}`` computes the
    length field from the body unless ``length`` overrides it (to lie on purpose).
    """
    if "hex" in step:
        return _hex(step["hex"], "hex")
    frame = step["frame"]
    if not isinstance(frame, dict) or set(frame) - {"type", "body", "length"}:
        raise CaseError(f"bad frame {frame!r}")
    ftype = frame.get("type", "REQUEST")
    type_byte = _FRAME_TYPES.get(ftype) if isinstance(ftype, str) else evaluate_int(ftype, env, "type")
    if type_byte is None or not 0 <= type_byte <= 0xFF:
        raise CaseError(f"bad frame type {ftype!r}")
    body = b"".join(_raw_part(part, env, namespace) for part in frame.get("body", []))
    length = evaluate_int(frame["length"], env, "length") if "length" in frame else len(body)
    if not 0 <= length <= 0xFFFF_FFFF:
        raise CaseError(f"length out of range: {length}")
    return bytes([type_byte]) + length.to_bytes(4, "big") + body


# --- patterns ---------------------------------------------------------------------------


@dataclass
class Pattern:
    """An expected message: its JSON form, where any omitted field matches anything,
    ``"*"`` matches anything, ``"?name"`` captures and ``"$name"`` must equal a variable."""

    spec: dict[str, Any]

    def __post_init__(self) -> None:
        _check_fields(self.spec)

    @property
    def kind(self) -> str:
        return str(self.spec["msg"])


def match_message(
    pattern: Pattern, message: Message, env: Mapping[str, Any], namespace: str
) -> tuple[Optional[str], dict[str, Any]]:
    """Match ``message`` against ``pattern``.

    Returns ``(None, captures)`` on a match, or ``(reason, {})`` where ``reason`` names
    the first field that differs. Nothing is bound unless everything matches.
    """
    got = message_fields(message)
    if got["msg"] != pattern.kind:
        return f"expected {pattern.kind}, received {got['msg']}", {}
    captures: dict[str, Any] = {}
    for name, spec in pattern.spec.items():
        if name == "msg" or spec == ANY:
            continue
        actual = got.get(name)
        if isinstance(spec, str):
            cap = _CAPTURE_RE.match(spec)
            if cap:
                var = cap.group(1)
                bound = captures.get(var, env.get(var))
                if var in captures or var in env:
                    if bound != actual:
                        return f"{name}: expected {var} = {_show(bound)}, received {_show(actual)}", {}
                else:
                    captures[var] = actual
                continue
        try:
            expected = _expected_field(name, spec, {**env, **captures}, namespace)
        except CaseError as exc:
            return f"{name}: {exc}", {}
        if expected != actual:
            return f"{name}: expected {_show(expected)}, received {_show(actual)}", {}
    return None, captures


def _expected_field(name: str, spec: Any, env: Mapping[str, Any], namespace: str) -> Any:
    spec = _lookup(spec, env)
    if spec is None or isinstance(spec, Value):
        return spec
    if name == "value":
        return value_from_json(spec, env)
    if name in ("key", "prefix"):
        return resolve_key(spec, env, namespace)
    if name == "status":
        return _status(spec).name
    if name in ("message", "name", "action", "kind"):
        return str(spec)
    if name == "entries":
        return [[evaluate_int(index, env, "index"), resolve_key(key, env, namespace)] for index, key in spec]
    return evaluate_int(spec, env, name)


def _show(item: Any) -> str:
    if isinstance(item, Value):
        return json.dumps(value_to_json(item))
    return json.dumps(item) if isinstance(item, (str, int, float, type(None))) else repr(item)


# --- cases ------------------------------------------------------------------------------


@dataclass
class Case:
    """One conformance case: metadata plus its steps (validated at load time)."""

    id: str
    title: str
    section: str
    requirement: str
    quote: str
    steps: list[dict[str, Any]]
    group: str
    source: str
    exclusive: bool = False
    requires: list[str] = field(default_factory=list)
    notes: str = ""

    def section_key(self) -> tuple[int, ...]:
        """Sort key for the section number (``10.3`` after ``9.2``)."""
        return tuple(int(part) for part in self.section.split(".") if part.isdigit())


_CASE_FIELDS = {"id", "title", "section", "requirement", "quote", "steps", "exclusive", "requires", "notes"}


def _check_http_step(step: Mapping[str, Any]) -> None:
    """An ``http`` step (PROTOCOL.md 13): ``request`` {method, path, host, headers,
    upgrade} and ``expect`` {status, headers, body_contains}."""
    request, expect = step.get("request"), step.get("expect")
    if not isinstance(request, dict) or not isinstance(expect, dict):
        raise CaseError("http needs request and expect objects")
    if set(request) - {"method", "path", "host", "headers", "upgrade"}:
        raise CaseError(f"http request: unknown field(s) {sorted(set(request) - {'method', 'path', 'host', 'headers', 'upgrade'})}")
    if not isinstance(request.get("path", "/"), str) or not str(request.get("path", "/")).startswith("/"):
        raise CaseError("http request: path is a string starting with /")
    headers = request.get("headers", [])
    if not isinstance(headers, list) or not all(
        isinstance(h, list) and len(h) == 2 and all(isinstance(x, str) for x in h) for h in headers
    ):
        raise CaseError("http request: headers is a list of [name, value] pairs")
    if set(expect) - {"status", "headers", "body_contains"}:
        raise CaseError(f"http expect: unknown field(s) {sorted(set(expect) - {'status', 'headers', 'body_contains'})}")
    status = expect.get("status")
    statuses = status if isinstance(status, list) else [status]
    if not statuses or not all(isinstance(code, int) and 100 <= code <= 599 for code in statuses):
        raise CaseError("http expect: status is an HTTP status or a list of them")
    for name, pattern in dict(expect.get("headers", {})).items():
        if not (pattern is None or isinstance(pattern, str)
                or (isinstance(pattern, dict) and set(pattern) == {"contains"}
                    and isinstance(pattern["contains"], list))):
            raise CaseError(f"http expect: header {name!r} is matched by a string, null (absent) or "
                            "{\"contains\": [parts]}")


def _validate_steps(steps: Any, where: str) -> None:
    if not isinstance(steps, list) or not steps:
        raise CaseError(f"{where}: steps must be a non-empty list")
    for index, step in enumerate(steps):
        here = f"{where} step {index + 1}"
        if not isinstance(step, dict) or step.get("op") not in OPS:
            raise CaseError(f"{here}: each step is an object with an op in {sorted(OPS)}")
        op = step["op"]
        try:
            if op == "send":
                kinds = [k for k in ("message", "messages", "hex", "frame") if k in step]
                if len(kinds) != 1:
                    raise CaseError("send takes exactly one of message, messages, hex, frame")
                for item in step.get("messages", [step["message"]] if "message" in step else []):
                    _check_fields(item)
            elif op == "expect":
                messages = step.get("messages", [step["message"]] if "message" in step else None)
                if not messages:
                    raise CaseError("expect takes message or messages")
                for item in messages:
                    Pattern(item)
            elif op == "expect_close" and "status" in step:
                _status(step["status"])
            elif op == "repeat":
                if "count" not in step:
                    raise CaseError("repeat needs a count")
                _validate_steps(step.get("steps"), here)
            elif op == "http":
                _check_http_step(step)
            elif op == "assert" and not isinstance(step.get("expr"), str):
                raise CaseError("assert needs expr: an expression over run variables")
            elif op == "assert_distinct" and not isinstance(step.get("vars"), list):
                raise CaseError("assert_distinct needs vars: a list of captured names")
        except CaseError as exc:
            raise CaseError(f"{here} ({op}): {exc}") from None


def load_file(path: Path) -> list[Case]:
    """Load and validate one case file.

    Raises:
        CaseError: naming the file and case for any violation of the case language.
    """
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CaseError(f"{path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise CaseError(f"{path}: a case file is an object with a 'cases' list")
    group = str(doc.get("group", path.stem))
    cases = []
    for raw in doc["cases"]:
        where = f"{path.name}: case {raw.get('id', '?') if isinstance(raw, dict) else raw!r}"
        if not isinstance(raw, dict):
            raise CaseError(f"{where}: a case is an object")
        missing = {"id", "title", "section", "requirement", "quote", "steps"} - set(raw)
        if missing:
            raise CaseError(f"{where}: missing {sorted(missing)}")
        if set(raw) - _CASE_FIELDS:
            raise CaseError(f"{where}: unknown field(s) {sorted(set(raw) - _CASE_FIELDS)}")
        if raw["requirement"] not in REQUIREMENTS:
            raise CaseError(f"{where}: requirement must be one of {REQUIREMENTS}")
        if not re.fullmatch(r"\d+(\.\d+)*", str(raw["section"])):
            raise CaseError(f"{where}: section must look like 10.3")
        _validate_steps(raw["steps"], where)
        cases.append(
            Case(
                id=str(raw["id"]),
                title=str(raw["title"]),
                section=str(raw["section"]),
                requirement=str(raw["requirement"]),
                quote=str(raw["quote"]),
                steps=raw["steps"],
                group=group,
                source=path.name,
                exclusive=bool(raw.get("exclusive", False)),
                requires=list(raw.get("requires", [])),
                notes=str(raw.get("notes", "")),
            )
        )
    return cases


def default_case_dir() -> Path:
    """``spec/conformance/`` of this checkout, or, for an installed jet, the copy that
    ``pip install`` puts in ``<prefix>/share/jet/conformance`` (pyproject data-files)."""
    checkout = Path(__file__).resolve().parents[2] / "spec" / "conformance"
    if checkout.is_dir():
        return checkout
    return Path(sys.prefix) / "share" / "jet" / "conformance"


def load_cases(paths: Iterable[Path]) -> list[Case]:
    """Load every case file; case ids must be unique across files.

    Raises:
        CaseError: for an invalid file or a duplicate id.
    """
    cases: list[Case] = []
    seen: dict[str, str] = {}
    for path in sorted(paths):
        for case in load_file(path):
            if case.id in seen:
                raise CaseError(f"duplicate case id {case.id!r} in {path.name} and {seen[case.id]}")
            seen[case.id] = path.name
            cases.append(case)
    return cases


def select_cases(cases: list[Case], pattern: Optional[str], section: Optional[str]) -> list[Case]:
    """Filter by case-id glob and by section (``4.2`` selects 4.2 and 4.2.x)."""
    chosen = []
    for case in cases:
        if pattern and not any(fnmatch(name, pattern) for name in (case.id, case.group, case.source)):
            continue
        if section and not (case.section == section or case.section.startswith(section + ".")):
            continue
        chosen.append(case)
    return chosen
