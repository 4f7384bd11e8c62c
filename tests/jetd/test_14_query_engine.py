"""The query engine alone (jetd.query, PROTOCOL.md 14.1): path matchers, value filters,
field paths, the order across types, window arithmetic and nodes."""

from __future__ import annotations

import struct

import cbor2
import msgpack
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from jetd.query import MISSING
from jetd.query import Extractor
from jetd.query import NodeIndex
from jetd.query import QueryError
from jetd.query import QueryLimits
from jetd.query import compile_query
from jetd.query import nodes_of
from jetd.query import window_update
from jetwire import MATCH_IGNORE_CASE
from jetwire import MATCH_NOT
from jetwire import QUERY_METHODS
from jetwire import FilterOp
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import SortBy
from jetwire import Status
from jetwire import TypeCode
from jetwire import Value
from jetwire import ValueFilter
from jetwire import ValueType


def matches(matchers: list[PathMatcher], key: str) -> bool:
    return compile_query(Query(tuple(matchers))).match_key(key.encode())


@pytest.mark.parametrize(
    ("op", "operands", "flags", "key", "expected"),
    [
        (PathOp.STARTS_WITH, ("players/",), 0, "players/ann", True),
        (PathOp.STARTS_WITH, ("players/",), 0, "Players/ann", False),
        (PathOp.STARTS_WITH, ("PLAYERS/",), MATCH_IGNORE_CASE, "players/ann", True),
        (PathOp.STARTS_WITH, ("players/",), MATCH_NOT, "players/ann", False),
        (PathOp.ENDS_WITH, ("/temp",), 0, "plant/temp", True),
        (PathOp.ENDS_WITH, ("/TEMP",), MATCH_IGNORE_CASE | MATCH_NOT, "plant/temp", False),
        (PathOp.CONTAINS, ("line3",), 0, "plant/line3/temp", True),
        (PathOp.CONTAINS, ("Straße",), MATCH_IGNORE_CASE, "STRASSE", True),  # casefold, not lower
        (PathOp.EQUALS, ("a",), 0, "a", True),
        (PathOp.EQUALS, ("a",), 0, "ab", False),
        (PathOp.EQUALS_ONE_OF, ("a", "b"), 0, "b", True),
        (PathOp.EQUALS_ONE_OF, ("a", "b"), MATCH_NOT, "c", True),
        (PathOp.CONTAINS_ALL_OF, ("x", "y"), 0, "axbyc", True),
        (PathOp.CONTAINS_ALL_OF, ("x", "y"), 0, "axb", False),
        (PathOp.CONTAINS, ("é",), 0, "café", True),
    ],
)
def test_path_matchers(op: PathOp, operands: tuple[str, ...], flags: int, key: str, expected: bool) -> None:
    assert matches([PathMatcher(op, operands, flags)], key) is expected


def test_matchers_are_anded_and_none_matches_all() -> None:
    both = [PathMatcher(PathOp.STARTS_WITH, ("a/",)), PathMatcher(PathOp.ENDS_WITH, ("/z",))]
    assert matches(both, "a/b/z") and not matches(both, "a/b") and not matches(both, "b/z")
    assert matches([], "anything")


def extract(vtype: int, data: bytes, field: str = "") -> object:
    path = compile_query(Query(filters=(ValueFilter(FilterOp.NE, Value.of(None), field),))).filters[0][0]
    return Extractor(vtype, data).get(path)


def test_field_paths_in_json_cbor_msgpack() -> None:
    doc = {"score": 7, "address": {"city": "Köln"}, "tags": ["a", "b"], "x.y": 1}
    for vtype, data in (
        (ValueType.JSON, b'{"score":7,"address":{"city":"K\\u00f6ln"},"tags":["a","b"],"x.y":1}'),
        (ValueType.CBOR, cbor2.dumps(doc)),
        (ValueType.MSGPACK, msgpack.packb(doc)),
    ):
        assert extract(vtype, data, "score") == 7
        assert extract(vtype, data, "address.city") == "Köln"
        assert extract(vtype, data, "tags.1") == "b"
        assert extract(vtype, data, "tags.2") is MISSING
        assert extract(vtype, data, "tags.x") is MISSING
        assert extract(vtype, data, "score.deeper") is MISSING
        assert extract(vtype, data, "x.y") is MISSING  # a key with a dot cannot be selected
        assert extract(vtype, data) == doc


def test_values_that_do_not_parse_or_are_opaque_are_missing() -> None:
    assert extract(ValueType.JSON, b"{not json", "a") is MISSING
    assert extract(ValueType.CBOR, b"\xff\xff", "a") is MISSING
    assert extract(ValueType.BYTES, b"{}", "a") is MISSING
    assert extract(0x80, b"x") is MISSING
    assert extract(ValueType.STRING, "héllo".encode()) == "héllo"
    assert extract(ValueType.INT64, struct.pack(">q", -5)) == -5


def holds(op: FilterOp, operand: object, value: Value, field: str = "") -> bool:
    compiled = compile_query(Query(filters=(ValueFilter(op, Value.of(operand), field),)))  # type: ignore[arg-type]
    return compiled.evaluate(b"k", Extractor(value.vtype, value.data)) is not None


@pytest.mark.parametrize(
    ("op", "operand", "value", "expected"),
    [
        (FilterOp.EQ, 1, Value.of(1.0), True),  # int and float compare numerically
        (FilterOp.EQ, 1, Value.of(True), False),  # a BOOL is not a NUMBER
        (FilterOp.EQ, "1", Value.of(1), False),
        (FilterOp.NE, "1", Value.of(1), True),  # exists, not equal
        (FilterOp.NE, 1, Value(ValueType.JSON, b"[1]"), True),
        (FilterOp.LT, 10, Value.of(9.5), True),
        (FilterOp.LT, 10, Value.of("9"), False),  # another rank never orders
        (FilterOp.GE, "b", Value.of("b"), True),
        (FilterOp.GT, b"\x01", Value.of(b"\x02"), True),
        (FilterOp.EQ, None, Value.of(None), True),
        (FilterOp.GT, 0.0, Value.of(float("nan")), False),
        (FilterOp.NE, 0.0, Value.of(float("nan")), True),
        (FilterOp.EQ, 2**62, Value(ValueType.CBOR, cbor2.dumps(2**62)), True),
    ],
)
def test_filter_semantics(op: FilterOp, operand: object, value: Value, expected: bool) -> None:
    assert holds(op, operand, value) is expected


def test_a_missing_field_matches_no_filter() -> None:
    player = Value(ValueType.JSON, b'{"gender":"female"}')
    for op in FilterOp:
        operand = int(TypeCode.NULL) if op == FilterOp.IS_TYPE else 1
        assert not holds(op, operand, player, "score")


@pytest.mark.parametrize(
    ("document", "code"),
    [(b"null", TypeCode.NULL), (b"true", TypeCode.BOOL), (b"1.5", TypeCode.NUMBER), (b'"s"', TypeCode.STRING),
     (b"[]", TypeCode.ARRAY), (b"{}", TypeCode.OBJECT)],
)
def test_is_type(document: bytes, code: TypeCode) -> None:
    value = Value(ValueType.JSON, document)
    assert [holds(FilterOp.IS_TYPE, int(c), value) for c in TypeCode] == [c == code for c in TypeCode]


def test_sort_keys_follow_the_order_across_types() -> None:
    compiled = compile_query(Query(sort_by=SortBy.VALUE, window_from=1, window_to=10))
    values = [Value.of("a"), Value.of(2), Value.of(None), Value.of(b"z"), Value.of(True), Value.of(1.5), Value.of(False)]
    keys = sorted(compiled.evaluate(b"k%d" % i, Extractor(v.vtype, v.data)) for i, v in enumerate(values))
    assert [k[1] for k in keys] == [None, False, True, 1.5, 2, "a", b"z"]
    for unorderable in (Value(ValueType.JSON, b"[1]"), Value.of(float("nan")), Value(0x80, b"")):
        assert compiled.evaluate(b"k", Extractor(unorderable.vtype, unorderable.data)) is None


@pytest.mark.parametrize(
    ("query", "status"),
    [
        (Query((PathMatcher(PathOp.STARTS_WITH, ("a", "b")),)), Status.INVALID_QUERY),
        (Query((PathMatcher(PathOp.EQUALS_ONE_OF, ()),)), Status.INVALID_QUERY),
        (Query((PathMatcher(PathOp.EQUALS, ("a",), 0x04),)), Status.INVALID_QUERY),
        (Query(filters=(ValueFilter(FilterOp.EQ, Value(ValueType.JSON, b"1")),)), Status.INVALID_QUERY),
        (Query(filters=(ValueFilter(FilterOp.EQ, Value.of(float("nan"))),)), Status.INVALID_QUERY),
        (Query(filters=(ValueFilter(FilterOp.IS_TYPE, Value.of(7)),)), Status.INVALID_QUERY),
        (Query(filters=(ValueFilter(FilterOp.EQ, Value.of(1), "a..b"),)), Status.INVALID_QUERY),
        (Query(filters=(ValueFilter(FilterOp.EQ, Value.of(1), ".".join("a" * 17)),)), Status.LIMIT_EXCEEDED),
        (Query(sort_by=SortBy.FIELD, window_from=1, window_to=1), Status.INVALID_QUERY),
        (Query(sort_by=SortBy.KEY, sort_field="a", window_from=1, window_to=1), Status.INVALID_QUERY),
        (Query(sort_by=SortBy.KEY, window_from=0, window_to=1), Status.INVALID_QUERY),
        (Query(sort_by=SortBy.KEY, window_from=5, window_to=4), Status.INVALID_QUERY),
        (Query(sort_by=SortBy.KEY, window_from=1, window_to=1001), Status.LIMIT_EXCEEDED),
        (Query(window_from=1, window_to=1), Status.INVALID_QUERY),
        (Query(flags=0x04), Status.INVALID_QUERY),
        (Query(sort_by=SortBy.KEY, window_from=1, window_to=2, flags=QUERY_METHODS), Status.INVALID_QUERY),
        (Query((PathMatcher(PathOp.EQUALS_ONE_OF, tuple("x" * 64)),)), Status.LIMIT_EXCEEDED),
    ],
)
def test_bad_queries_are_refused_with_a_status(query: Query, status: Status) -> None:
    with pytest.raises(QueryError) as info:
        compile_query(query, QueryLimits())
    assert info.value.status == status and info.value.message


def test_window_update_lists_only_changed_positions() -> None:
    # A move from 7 to 2 inside the window 0..9 of 100 entries: positions 2..7.
    assert window_update(7, 2, 100, 0, 9, 10) == (2, 7, 10)
    # Below the window both times: nothing.
    assert window_update(50, 60, 100, 0, 9, 10) is None
    # Enters from below at 3: 3..9 shift.
    assert window_update(50, 3, 100, 0, 9, 10) == (3, 9, 10)
    # Removed from a window that held everything: size shrinks, the tail is cut.
    assert window_update(4, None, 4, 0, 9, 5) == (4, 3, 4)
    # Same position, new value: that position only.
    assert window_update(5, 5, 100, 0, 9, 10) == (5, 5, 10)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text("ab/", max_size=6), max_size=30))
def test_node_index_counts_levels(keys: list[str]) -> None:
    index = NodeIndex()
    live: list[bytes] = []
    for text in keys:
        key = text.encode()
        if key in live:
            live.remove(key)
            index.remove(key)
        else:
            live.append(key)
            index.add(key)
        expected = {node for k in live for node in nodes_of(k)}
        assert set(index.counts) == expected
    assert list(nodes_of(b"a//b/c")) == [b"a", b"a/", b"a//b"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32), st.booleans(), st.integers(1, 5), st.integers(1, 4))
def test_group_windows_with_many_sublists(seed: int, descending: bool, start: int, length: int) -> None:
    """A sorted group keeps the head of its order in a SortedList (tiny sublists here,
    load 4) and the rest in a heap; the window kept from window_update equals a sorted
    slice after every change, and the head is the best entries."""
    import random

    from jetd.query import BEYOND
    from jetd.query import QueryGroup

    rng = random.Random(seed)
    query = Query(sort_by=SortBy.VALUE, sort_flags=1 if descending else 0, window_from=start, window_to=start + length - 1)
    group = QueryGroup(compile_query(query))
    assert group.order is not None
    group.order._reset(4)
    low, high = start - 1, start + length - 2
    group.set_reach(high)
    values: dict[bytes, int] = {}
    window: list[bytes] = []
    size = 0
    for _ in range(300):
        key = b"k%d" % rng.randrange(60)
        if key in values and rng.random() < 0.2:
            del values[key]
            entry = None
        else:
            values[key] = rng.randrange(40)
            entry = (2, values[key], key)
        _, old, new = group.update(key, entry)
        count = len(group.order)
        if old == BEYOND:
            continue
        update = window_update(old, new, count, low, high, size)
        if update is None:
            continue
        first, last, size = update
        window = (window + [b""] * size)[:size]
        for position in range(first, last + 1):
            window[position - low] = group.at(position)
        ranked = sorted(values, key=lambda k: (values[k], k), reverse=descending)
        assert window == ranked[low : high + 1]
    ranked = sorted(values, key=lambda k: (values[k], k), reverse=descending)
    assert window == ranked[low : high + 1]
    # The head is the best entries, at least as many as the windows reach; the rest is
    # in the tail heap.
    head = [entry[-1] for entry in (reversed(group.order) if descending else group.order)]
    assert head == ranked[: len(head)] and len(head) >= min(len(ranked), high + 1)
    assert len(group) == len(values)
