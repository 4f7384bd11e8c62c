"""The query engine (PROTOCOL.md 14): compiled path matchers and value filters, query
groups with their sorted order, and the window arithmetic. Pure: no I/O, no clock.

A query is compiled once into plain Python closures over bytes and parsed values.
Field paths are data: tuples of segments walked over dicts and lists, never code.

Fetches whose queries differ only in their window share one :class:`QueryGroup`: the
group evaluates a change once (one parse of a structured value, one filter pass, one
update of its ``SortedList``) and each fetch only compares positions against its
window, so ten fetchers of the same top ten cost about what one does.

The daemon glue (:mod:`jetd.querying`) turns what the groups report into frames.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import struct
from collections.abc import Callable
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Iterator
from heapq import heapify
from heapq import heappop
from heapq import heappush
from typing import Any
from typing import Optional

import cbor2
import msgpack
import orjson
from sortedcontainers import SortedList

from jetwire import MATCH_IGNORE_CASE
from jetwire import MATCH_NOT
from jetwire import QUERY_METHODS
from jetwire import QUERY_NODES
from jetwire import SORT_DESCENDING
from jetwire import FilterOp
from jetwire import PathOp
from jetwire import Query
from jetwire import SortBy
from jetwire import Status
from jetwire import TypeCode
from jetwire import Value
from jetwire import ValueType
from jetwire.codes import SINGLE_OPERAND_OPS

__all__ = [
    "MISSING",
    "CompiledQuery",
    "NodeIndex",
    "QueryError",
    "QueryGroup",
    "QueryIndex",
    "QueryLimits",
    "compile_query",
    "nodes_of",
    "query_terms",
    "restrict",
    "select",
    "window_update",
]

DEFAULT_MAX_QUERY_SIZE = 16 * 1024  # PROTOCOL.md 10.7, 14.5
DEFAULT_MAX_QUERY_TERMS = 64
DEFAULT_MAX_WINDOW = 1000
DEFAULT_MAX_FIELD_DEPTH = 16


class _Missing:
    """A selected value that does not exist (PROTOCOL.md 14.1: no filter holds on it)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class QueryError(Exception):
    """A query the daemon will not run: ``status`` (INVALID_QUERY, LIMIT_EXCEEDED or
    TOO_LARGE) and a message naming the fault (PROTOCOL.md 14.5, 14.6)."""

    def __init__(self, message: str, status: Status = Status.INVALID_QUERY) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclasses.dataclass(frozen=True)
class QueryLimits:
    """The query limits of PROTOCOL.md 10.7."""

    max_query_terms: int = DEFAULT_MAX_QUERY_TERMS
    max_window: int = DEFAULT_MAX_WINDOW
    max_field_depth: int = DEFAULT_MAX_FIELD_DEPTH


# --- values: selection and the order across types (PROTOCOL.md 14.1) --------------------

_I64 = struct.Struct(">q").unpack
_F64 = struct.Struct(">d").unpack
_RANKS: dict[type, int] = {type(None): 0, bool: 1, int: 2, float: 2, str: 3, bytes: 4, list: 5, dict: 6}
_RANK_TYPES: dict[int, tuple[type, ...]] = {0: (type(None),), 1: (bool,), 2: (int, float), 3: (str,), 4: (bytes,)}
_COMPARE: dict[int, Callable[[Any, Any], bool]] = {
    FilterOp.EQ: operator.eq,
    FilterOp.LT: operator.lt,
    FilterOp.LE: operator.le,
    FilterOp.GT: operator.gt,
    FilterOp.GE: operator.ge,
}


def rank(value: Any) -> int:
    """The type code of a selected value (TypeCode), or -1 if it does not exist or has
    no type of PROTOCOL.md 14.1 (a CBOR tag, a MessagePack extension)."""
    return _RANKS.get(type(value), -1)


def _parse_json(data: bytes) -> Any:
    return orjson.loads(data)


def _parse_cbor(data: bytes) -> Any:
    return cbor2.loads(data)


def _parse_msgpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


_PARSERS: dict[int, Callable[[bytes], Any]] = {
    ValueType.JSON: _parse_json,
    ValueType.CBOR: _parse_cbor,
    ValueType.MSGPACK: _parse_msgpack,
}


def parse_document(vtype: int, data: bytes) -> Any:
    """The document a JSON, CBOR or MSGPACK value holds; MISSING if it does not parse
    (never an error: PROTOCOL.md 14.1) or for any other type."""
    parser = _PARSERS.get(vtype)
    if parser is None:
        return MISSING
    try:
        return parser(data)
    except Exception:  # any library's parse failure means: no document (never an error)
        return MISSING


def plain_value(vtype: int, data: bytes) -> Any:
    """The value itself for the non-structured types (PROTOCOL.md 14.1), MISSING for
    application types; JSON, CBOR and MSGPACK go through :func:`parse_document`."""
    if vtype == ValueType.NONE:
        return None
    if vtype == ValueType.BOOL:
        return data == b"\x01"
    if vtype == ValueType.INT64:
        return _I64(data)[0]
    if vtype == ValueType.FLOAT64:
        return _F64(data)[0]
    if vtype == ValueType.STRING:
        return data.decode("utf-8")
    if vtype == ValueType.BYTES:
        return data
    if vtype in _PARSERS:
        return parse_document(vtype, data)
    return MISSING


Segment = tuple[str, Optional[int]]


def select(document: Any, path: tuple[Segment, ...]) -> Any:
    """Walk ``path`` (map keys and array indexes) through ``document``; MISSING if a
    step does not exist. Data only: nothing is evaluated."""
    for name, index in path:
        kind = type(document)
        if kind is dict:
            document = document.get(name, MISSING)
        elif kind is list and index is not None and index < len(document):
            document = document[index]
        else:
            return MISSING
    return document


def _parse_path(text: str, limits: QueryLimits, what: str) -> tuple[Segment, ...]:
    if not text:
        return ()
    names = text.split(".")
    if len(names) > limits.max_field_depth:
        raise QueryError(
            f"{what} {text!r} has {len(names)} segments, more than {limits.max_field_depth}", Status.LIMIT_EXCEEDED
        )
    if any(not name for name in names):
        raise QueryError(f"{what} {text!r} has an empty segment")
    return tuple((name, int(name) if name.isascii() and name.isdigit() else None) for name in names)


class Extractor:
    """Reads one value of a state for a query, parsing a structured value at most once
    per change however many groups and filters look at it."""

    __slots__ = ("_document", "data", "vtype")

    def __init__(self, vtype: int, data: bytes) -> None:
        self.vtype = vtype
        self.data = data
        self._document: Any = _UNPARSED

    @classmethod
    def of_kv(cls, key_length: int, kv: bytes) -> Extractor:
        """From the ``Key, Value`` payload the registry caches (PROTOCOL.md 10.4)."""
        return cls(kv[2 + key_length], kv[7 + key_length :])

    def get(self, path: tuple[Segment, ...]) -> Any:
        if not path:
            if self.vtype in _PARSERS:
                return self.document()
            return plain_value(self.vtype, self.data)
        document = self._document
        if document is _UNPARSED:
            document = self.document()
        if len(path) == 1 and type(document) is dict:
            return document.get(path[0][0], MISSING)  # the common case: one map key
        return select(document, path)

    def document(self) -> Any:
        document = self._document
        if document is _UNPARSED:
            parser = _PARSERS.get(self.vtype)
            if parser is None:
                document = MISSING
            else:
                try:
                    document = parser(self.data)
                except Exception:  # as parse_document: no document, never an error
                    document = MISSING
            self._document = document
        return document


_UNPARSED: Any = object()
BEYOND = -1  # QueryGroup.update: the change moved no position of any window


def _operand(value: Value, op: FilterOp) -> Any:
    if op == FilterOp.IS_TYPE:
        if value.vtype != ValueType.INT64:
            raise QueryError("the operand of IS_TYPE is an INT64 type code")
        code = _I64(value.data)[0]
        if not 0 <= code <= max(TypeCode):
            raise QueryError(f"unknown type code {code}")
        return code
    if value.vtype not in (ValueType.NONE, ValueType.BOOL, ValueType.INT64, ValueType.FLOAT64, ValueType.STRING, ValueType.BYTES):
        raise QueryError(f"a comparison operand is NONE, BOOL, INT64, FLOAT64, STRING or BYTES, not type 0x{value.vtype:02X}")
    operand = plain_value(value.vtype, value.data)
    if isinstance(operand, float) and math.isnan(operand):
        raise QueryError("a comparison operand may not be NaN")
    return operand


def _filter_test(op: FilterOp, operand: Any) -> Callable[[Any], bool]:
    """PROTOCOL.md 14.1: same rank for EQ and the order comparisons; NE on anything that
    exists and is not EQ; NaN is a NUMBER that is never equal nor ordered."""
    # Written per operand type: the type test is one identity check (the hot path of
    # every filtered change). NaN needs no test of its own: it is neither ==, <, nor >.
    ranks = _RANKS
    if op == FilterOp.IS_TYPE:
        return lambda v: ranks.get(type(v), -1) == operand
    want = ranks[type(operand)]
    if op == FilterOp.NE:
        kinds = _RANK_TYPES[want]
        return lambda v: type(v) in ranks and not (type(v) in kinds and v == operand)
    if want == TypeCode.NULL:
        if op in (FilterOp.EQ, FilterOp.LE, FilterOp.GE):
            return lambda v: v is None
        return lambda v: False
    compare = _COMPARE[op]
    if want == TypeCode.NUMBER:
        return lambda v: (type(v) is int or type(v) is float) and compare(v, operand)
    kind = type(operand)
    if op == FilterOp.EQ:
        return lambda v: type(v) is kind and v == operand
    return lambda v: type(v) is kind and compare(v, operand)


def _path_test(op: PathOp, operands: tuple[str, ...], flags: int) -> Callable[[bytes], bool]:
    if flags & ~(MATCH_NOT | MATCH_IGNORE_CASE):
        raise QueryError(f"reserved path matcher flags 0x{flags:02X}")
    if op in SINGLE_OPERAND_OPS and len(operands) != 1:
        raise QueryError(f"{PathOp(op).name} takes exactly one operand, got {len(operands)}")
    if not operands:
        raise QueryError(f"{PathOp(op).name} takes one or more operands")
    test: Callable[[Any], bool]
    base: Callable[[bytes], bool]
    if flags & MATCH_IGNORE_CASE:
        folded = tuple(text.casefold() for text in operands)
        test = _text_test(op, folded)

        def folded_test(key: bytes) -> bool:
            return test(key.decode("utf-8", "replace").casefold())

        base = folded_test
    else:
        raw = tuple(text.encode("utf-8") for text in operands)
        base = _text_test(op, raw)
    if flags & MATCH_NOT:
        return lambda key: not base(key)
    return base


def _text_test(op: PathOp, operands: tuple[Any, ...]) -> Callable[[Any], bool]:
    first = operands[0]
    if op == PathOp.STARTS_WITH:
        return lambda key: key.startswith(first)
    if op == PathOp.ENDS_WITH:
        return lambda key: key.endswith(first)
    if op == PathOp.CONTAINS:
        return lambda key: first in key
    if op == PathOp.EQUALS:
        return lambda key: key == first
    if op == PathOp.EQUALS_ONE_OF:
        allowed = frozenset(operands)
        return lambda key: key in allowed
    return lambda key: all(operand in key for operand in operands)


def query_terms(query: Query) -> int:
    """PROTOCOL.md 14.5: each matcher counts one plus one per operand, each filter one,
    the sort one."""
    return sum(1 + len(m.operands) for m in query.matchers) + len(query.filters) + (query.sort_by != SortBy.NONE)


class CompiledQuery:
    """A query ready to run: ``match_key`` on key bytes; ``evaluate`` on a state's value
    returns its sort key (a tuple ending with the key), True for an unsorted match, or
    None when the state does not match; ``prefix`` is what every matching key starts
    with (for the index)."""

    __slots__ = (
        "_base",
        "descending",
        "filters",
        "limits",
        "match_key",
        "methods",
        "needs_value",
        "nodes",
        "prefix",
        "query",
        "readable",
        "signature",
        "sort_by",
        "sort_path",
        "sorted",
    )

    @property
    def base(self) -> CompiledQuery:
        """The query without a connection's read restriction (this one if unrestricted)."""
        base = self._base
        return self if base is None else base

    def __init__(self, query: Query, limits: QueryLimits) -> None:
        self.query = query
        self.limits = limits
        # The query without a connection's read restriction (restrict()); None: this one
        # (not ``self``: a cycle per query, kept forever by jetd.gcpolicy's frozen heap).
        self._base: Optional[CompiledQuery] = None
        self.readable: Optional[tuple[bytes, ...]] = None
        terms = query_terms(query)
        if terms > limits.max_query_terms:
            raise QueryError(f"the query has {terms} terms, more than {limits.max_query_terms}", Status.LIMIT_EXCEEDED)
        if query.flags & ~(QUERY_METHODS | QUERY_NODES):
            raise QueryError(f"reserved query flags 0x{query.flags:02X}")
        tests = [_path_test(m.op, m.operands, m.flags) for m in query.matchers]
        if not tests:
            self.match_key: Callable[[bytes], bool] = lambda key: True
        elif len(tests) == 1:
            self.match_key = tests[0]
        else:
            self.match_key = lambda key: all(test(key) for test in tests)
        prefixes = [
            m.operands[0].encode("utf-8")
            for m in query.matchers
            if m.op in (PathOp.STARTS_WITH, PathOp.EQUALS) and not m.flags
        ]
        self.prefix = max(prefixes, key=len) if prefixes else b""
        filters = []
        for value_filter in query.filters:
            if value_filter.flags:
                raise QueryError(f"reserved value filter flags 0x{value_filter.flags:02X}")
            path = _parse_path(value_filter.field, limits, "field")
            filters.append((path, _filter_test(value_filter.op, _operand(value_filter.operand, value_filter.op))))
        self.filters = tuple(filters)
        self.sort_by = query.sort_by
        if query.sort_flags & ~SORT_DESCENDING:
            raise QueryError(f"reserved sort flags 0x{query.sort_flags:02X}")
        if (query.sort_by == SortBy.FIELD) != bool(query.sort_field):
            raise QueryError("sort_field is given with sort_by FIELD, and only then")
        self.sort_path = _parse_path(query.sort_field, limits, "sort field")
        self.sorted = query.sort_by != SortBy.NONE
        self.descending = query.descending
        if self.sorted:
            if not 1 <= query.window_from <= query.window_to:
                raise QueryError(f"a sorted query needs 1 <= from <= to, got {query.window_from}..{query.window_to}")
            if query.window_to - query.window_from + 1 > limits.max_window:
                raise QueryError(f"the window is longer than {limits.max_window}", Status.LIMIT_EXCEEDED)
        elif query.window_from or query.window_to or query.sort_flags:
            raise QueryError("an unsorted query has no window nor sort flags (0, 0)")
        self.methods = query.methods
        self.nodes = query.nodes
        if (self.methods or self.nodes) and (self.filters or self.sorted):
            raise QueryError("METHODS and NODES go with path matchers only (no filters, no sort)")
        self.needs_value = bool(self.filters) or self.sort_by in (SortBy.VALUE, SortBy.FIELD)
        # Fetches that differ only in their window share one group.
        self.signature: Hashable = dataclasses.replace(query, window_from=0, window_to=0)

    def evaluate(self, key: bytes, extractor: Optional[Extractor]) -> Any:
        """The state's entry in this query: its sort key, True (unsorted), or None.
        ``extractor`` may be None only when ``needs_value`` is False."""
        for path, test in self.filters:
            assert extractor is not None
            if not test(extractor.get(path)):
                return None
        sort_by = self.sort_by
        if sort_by == SortBy.NONE:
            return True
        if sort_by == SortBy.KEY:
            return (key,)
        assert extractor is not None
        value = extractor.get(self.sort_path)
        code = _RANKS.get(type(value), 5)
        if code > 4 or value != value:  # arrays, objects, other types, NaN: cannot be ordered
            return None
        return (code, value, key)


def _common_prefix(prefixes: tuple[bytes, ...]) -> bytes:
    first, last = min(prefixes), max(prefixes)
    n = 0
    while n < len(first) and first[n] == last[n]:
        n += 1
    return first[:n]


def restrict(compiled: CompiledQuery, readable: tuple[bytes, ...]) -> CompiledQuery:
    """``compiled`` as a connection that may read only the keys starting with one of
    ``readable`` runs it (PROTOCOL.md 15.4): every key outside them fails ``match_key``,
    for states, methods and nodes alike, and the signature differs, so that only
    connections that may read the same keys share a group. ``readable`` is what
    :meth:`jetd.access.PrefixSet.narrow` gives for ``compiled.prefix`` (possibly ())."""
    base = compiled.base
    restricted = CompiledQuery(base.query, base.limits)  # compiled again: a copy, cheaply
    restricted._base = base
    inner = base.match_key
    restricted.match_key = lambda key: key.startswith(readable) and inner(key)
    restricted.readable = readable
    restricted.signature = (base.signature, readable)
    if readable:
        # The index and the seeding scan the longest prefix every readable key has.
        restricted.prefix = max(base.prefix, _common_prefix(readable), key=len)
    return restricted


def compile_query(query: Query, limits: QueryLimits = QueryLimits()) -> CompiledQuery:
    """Compile ``query``; raises :class:`QueryError` for what PROTOCOL.md 14.5 and 14.6
    refuse."""
    return CompiledQuery(query, limits)


# --- groups: the entries of one query, kept up to date ---------------------------------------


def window_update(
    old: Optional[int], new: Optional[int], count: int, low: int, high: int, size_before: int
) -> Optional[tuple[int, int, int]]:
    """What one change means for a window (PROTOCOL.md 14.2).

    ``old``/``new`` are the entry's 0-based positions before and after (None: absent),
    ``count`` the number of entries after, ``low``..``high`` the window's 0-based
    positions, ``size_before`` its size before. Returns (first, last, size): the
    positions to send (first > last: none) and the new size; None if nothing changed.
    """
    if old is None and new is None:
        return None
    if old is None:
        assert new is not None
        first, last = new, count - 1
    elif new is None:
        first, last = old, count - 1
    else:
        first, last = (old, new) if old <= new else (new, old)
    size = max(0, min(high, count - 1) - low + 1)
    first = max(first, low)
    last = min(last, high, count - 1)
    if first > last and size == size_before:
        return None
    return first, last, size


class _Reversed:
    """A heap item that orders its entry the other way (heapq is a min-heap; the tail
    of a descending order needs its largest entry first)."""

    __slots__ = ("entry",)

    def __init__(self, entry: Any) -> None:
        self.entry = entry

    def __lt__(self, other: _Reversed) -> bool:
        return bool(other.entry < self.entry)


class QueryGroup:
    """The entries of one query signature and the fetches that share it.

    ``matched`` maps each matching state key to its entry (sort key or True). A sorted
    group splits its order in two (PROTOCOL.md 14.5: a change costs O(log n) plus the
    window events it causes):

    - ``order``, a SortedList of the *head*: the best entries, at least as many as the
      farthest window reaches (``reach`` + 1) whenever there are that many, at most
      about twice that; positions in the head are exact;
    - the *tail*: every other entry, in a heap (``heapq``, in C) whose best entry comes
      first, with lazy deletion: an entry that changed or left stays in the heap until
      it surfaces, and is skipped then (it no longer equals ``matched[key]``).

    Every head entry is better than every tail entry, so a change whose old and new
    entries both belong to the tail moves no position of any window: it costs one dict
    store and one heap push. Tail entries report the head's length as their position (a
    lower bound, beyond every window either way).
    """

    __slots__ = (
        "_cap",
        "_floor",
        "_tail",
        "_tail_count",
        "compiled",
        "fetches",
        "matched",
        "once_reach",
        "onces",
        "order",
        "reach",
        "seed_cursor",
        "seeding",
    )

    def __init__(self, compiled: CompiledQuery) -> None:
        self.compiled = compiled
        self.matched: dict[bytes, Any] = {}
        self.order: Optional[SortedList] = SortedList() if compiled.sorted else None
        self.fetches: dict[int, Any] = {}  # fetch id -> the glue's fetch object
        self.reach = -1  # the last 0-based position any fetch's window reaches (-1: none)
        self._tail: list[Any] = []
        self._tail_count = 0  # live entries in the tail (the heap also holds stale ones)
        self._floor = 0  # the head holds at least this many entries while there are as many
        self._cap = 1 << 62  # ... and at most this many: everything until a fetch says how far it reads
        # Seeding in slices (PROTOCOL.md 14.5): the states up to ``seed_cursor`` (None:
        # none yet) are in; a change of a key above it is left to the slices.
        self.seeding = False
        self.seed_cursor: Optional[bytes] = None
        self.onces = 0  # QUERY_ONCE answers under way on this group
        self.once_reach = -1  # the farthest 0-based position they read

    def set_reach(self, reach: int) -> None:
        """The largest 0-based window end of the group's fetches (-1: none)."""
        self.reach = reach
        if reach < 0:
            return
        self._floor = reach + 1
        self._cap = 2 * (reach + 1) + 16
        self._rebalance()

    # the order as the query sees it: better = earlier
    def _better(self, a: Any, b: Any) -> bool:
        return bool(a > b) if self.compiled.descending else bool(a < b)

    def _worst(self) -> Any:
        order = self.order
        assert order is not None
        return order[0] if self.compiled.descending else order[-1]

    def _in_head(self, entry: Any) -> bool:
        order = self.order
        assert order is not None
        if not order:
            return False
        worst = order[0] if self.compiled.descending else order[-1]
        return bool(entry >= worst) if self.compiled.descending else bool(entry <= worst)

    def _push(self, entry: Any) -> None:
        heappush(self._tail, _Reversed(entry) if self.compiled.descending else entry)
        self._tail_count += 1

    def _pop_best(self) -> Any:
        """The best live tail entry, out of the tail; None if there is none."""
        tail = self._tail
        matched = self.matched
        descending = self.compiled.descending
        while tail:
            item = heappop(tail)
            entry = item.entry if descending else item
            if matched.get(entry[-1]) == entry and not self._in_head(entry):
                self._tail_count -= 1
                return entry
        return None

    def _rebalance(self) -> None:
        order = self.order
        assert order is not None
        while len(order) < self._floor and self._tail_count:
            entry = self._pop_best()
            if entry is None:
                break
            order.add(entry)
        extra = len(order) - self._cap
        if extra > 0:
            if self.compiled.descending:
                moved = list(order.islice(0, extra))
                del order[:extra]
            else:
                moved = list(order.islice(len(order) - extra, len(order)))
                del order[len(order) - extra :]
            for entry in moved:
                self._push(entry)
        if len(self._tail) > 2 * self._tail_count + 1024:
            self._compact()

    def _compact(self) -> None:
        """Drop the stale items of the tail heap (rebuilt from ``matched``)."""
        in_head = set(self.order or ())
        live = [entry for entry in self.matched.values() if entry not in in_head]
        self._tail = [_Reversed(entry) for entry in live] if self.compiled.descending else live
        heapify(self._tail)
        self._tail_count = len(live)

    def seed(self, states: Iterable[tuple[bytes, bytes]], limit: int = 1 << 62,
             spend: Optional[Callable[[int], bool]] = None) -> bool:
        """Take up to ``limit`` more states from (key, Key-Value payload) pairs in byte
        order of key, those above ``seed_cursor`` (what
        :meth:`jetd.registry.StateRegistry.matching_after` yields), and stop earlier
        once ``spend(16)``, called every 16 states, says the slice is over
        (:meth:`jetd.scheduler.Scheduler.spend`); True once there are no more, and the
        group is seeded."""
        compiled = self.compiled
        match_key = compiled.match_key
        evaluate = compiled.evaluate
        needs_value = compiled.needs_value
        update = self.update
        for taken, (key, kv) in enumerate(states):
            if taken == limit or (taken and not taken & 15 and spend is not None and spend(16)):
                return False
            self.seed_cursor = key
            if match_key(key):
                entry = evaluate(key, Extractor.of_kv(len(key), kv) if needs_value else None)
                if entry is not None:
                    update(key, entry)
        self.seeding = False
        self.seed_cursor = None
        return True

    def at(self, position: int) -> bytes:
        """The key at 0-based ``position`` (within the head) as the query sees it."""
        order = self.order
        assert order is not None
        entry = order[-1 - position if self.compiled.descending else position]
        key: bytes = entry[-1]
        return key

    def __len__(self) -> int:
        return len(self.matched)

    def _head_position(self, entry: Any) -> int:
        order = self.order
        assert order is not None
        index: int = order.bisect_left(entry)
        return len(order) - 1 - index if self.compiled.descending else index

    def update(self, key: bytes, entry: Any) -> tuple[Any, Optional[int], Optional[int]]:
        """Set ``key``'s entry (None: it does not match now). Returns (the previous entry
        or None, old position, new position); positions are None for an unsorted group
        or where the key is absent, and both BEYOND when the change moved no position
        of any window."""
        matched = self.matched
        previous = matched.get(key)
        order = self.order
        if order is None:
            if entry is None:
                if previous is not None:
                    del matched[key]
            else:
                matched[key] = entry
            return previous, None, None
        if previous is None and entry is None:
            return None, BEYOND, BEYOND  # neither matched before nor matches now
        full = len(order) >= self._floor
        previous_in_head = previous is not None and self._in_head(previous)
        if full and not previous_in_head and (entry is None or not self._in_head(entry)):
            # The tail only: no position of any window moves (the head is full).
            if previous is not None:
                self._tail_count -= 1  # its heap item goes stale
            if entry is None:
                del matched[key]
            else:
                matched[key] = entry
                self._push(entry)
            if len(self._tail) > 2 * self._tail_count + 1024:
                self._compact()
            return previous, BEYOND, BEYOND
        old_position = new_position = None
        if previous is not None:
            if previous_in_head:
                old_position = self._head_position(previous)
                order.remove(previous)
            else:
                old_position = len(order)  # a lower bound: beyond every window
                self._tail_count -= 1
        if entry is None:
            if previous is not None:
                del matched[key]
        else:
            matched[key] = entry
            if order and not self._better(self._worst(), entry):
                order.add(entry)
            else:
                self._push(entry)  # _rebalance takes it into the head if it belongs there
        self._rebalance()
        if entry is not None:
            new_position = self._head_position(entry) if self._in_head(entry) else len(order)
        return previous, old_position, new_position


class QueryIndex:
    """Every group, by signature, and which groups a key can concern: groups are indexed
    by the prefix their query implies (as FetchRegistry indexes prefixes), and the groups
    of a key are cached per key until the set of groups changes."""

    __slots__ = ("_length_counts", "by_prefix", "by_signature", "cache", "generation", "lengths", "method_groups", "node_groups")

    def __init__(self) -> None:
        self.by_signature: dict[Hashable, QueryGroup] = {}
        self.by_prefix: dict[bytes, list[QueryGroup]] = {}
        self.lengths: list[int] = []
        self._length_counts: dict[int, int] = {}
        self.generation = 0
        self.cache: dict[bytes, tuple[int, list[QueryGroup]]] = {}
        self.method_groups: list[QueryGroup] = []
        self.node_groups: list[QueryGroup] = []

    def __bool__(self) -> bool:
        return bool(self.by_signature)

    def group_for(self, compiled: CompiledQuery) -> tuple[QueryGroup, bool]:
        """The group of ``compiled``'s signature, and whether it is new (to be seeded)."""
        group = self.by_signature.get(compiled.signature)
        if group is not None:
            return group, False
        group = QueryGroup(compiled)
        group.seeding = True
        self.by_signature[compiled.signature] = group
        self.by_prefix.setdefault(compiled.prefix, []).append(group)
        n = len(compiled.prefix)
        count = self._length_counts.get(n, 0)
        self._length_counts[n] = count + 1
        if not count:
            self.lengths = sorted(self._length_counts)
        if compiled.methods:
            self.method_groups.append(group)
        if compiled.nodes:
            self.node_groups.append(group)
        self.generation += 1
        return group, True

    def drop(self, group: QueryGroup) -> None:
        """Forget a group whose last fetch ended."""
        compiled = group.compiled
        del self.by_signature[compiled.signature]
        groups = self.by_prefix[compiled.prefix]
        groups.remove(group)
        if not groups:
            del self.by_prefix[compiled.prefix]
        n = len(compiled.prefix)
        count = self._length_counts[n] - 1
        if count:
            self._length_counts[n] = count
        else:
            del self._length_counts[n]
            self.lengths = sorted(self._length_counts)
        if group in self.method_groups:
            self.method_groups.remove(group)
        if group in self.node_groups:
            self.node_groups.remove(group)
        self.generation += 1
        self.cache.clear()

    def targets(self, key: bytes) -> list[QueryGroup]:
        """The groups whose path matchers match ``key`` (cached per key)."""
        cached = self.cache.get(key)
        if cached is not None and cached[0] == self.generation:
            return cached[1]
        found = []
        by_prefix = self.by_prefix
        for n in self.lengths:
            if n > len(key):
                break
            for group in by_prefix.get(key[:n], ()):
                if group.compiled.match_key(key):
                    found.append(group)
        if found:
            self.cache[key] = (self.generation, found)
        elif cached is not None:
            del self.cache[key]
        return found

    def forget(self, key: bytes) -> None:
        self.cache.pop(key, None)


# --- nodes: the hierarchy levels (PROTOCOL.md 14) ----------------------------------------------


def nodes_of(key: bytes) -> Iterator[bytes]:
    """The nodes of ``key``, outermost first: every proper prefix that ends before a ``/``."""
    start = 0
    while True:
        cut = key.find(b"/", start)
        if cut < 0:
            return
        yield key[:cut]
        start = cut + 1


class NodeIndex:
    """How many state and method keys lie under each node; kept only while some fetch
    asks for nodes (built from the registry when the first one starts)."""

    __slots__ = ("counts",)

    def __init__(self, keys: Iterable[bytes] = ()) -> None:
        self.counts: dict[bytes, int] = {}
        for key in keys:
            self.add(key)

    def add(self, key: bytes) -> list[bytes]:
        """Count ``key``; returns the nodes it created, outermost first."""
        created = []
        counts = self.counts
        for node in nodes_of(key):
            count = counts.get(node, 0)
            counts[node] = count + 1
            if not count:
                created.append(node)
        return created

    def remove(self, key: bytes) -> list[bytes]:
        """Uncount ``key``; returns the nodes that no longer exist, innermost first."""
        deleted = []
        counts = self.counts
        for node in nodes_of(key):
            count = counts[node] - 1
            if count:
                counts[node] = count
            else:
                del counts[node]
                deleted.append(node)
        deleted.reverse()
        return deleted
