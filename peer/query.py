"""Queries in Python (PROTOCOL.md 14): path matchers on ``key``, value filters on
``field(...)`` and ``value``, and :func:`build_query` for the peers' keyword arguments.

    >>> from peer.query import field, key, value
    >>> await peer.fetch("players/", where=[field("gender") == "female"],
    ...                  sort_by="score", descending=True, top=10)
    >>> await peer.query(match=[key.ends_with("/temp"), ~key.contains("test")])
    >>> field("score") >= 10, value.is_type("number"), key.equals_one_of("a", "b").ignore_case()

Comparisons build :class:`jetwire.ValueFilter`; a matcher is a :class:`jetwire.PathMatcher`
wrapped so that ``~`` negates it and ``.ignore_case()`` folds case.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import Optional
from typing import TypedDict
from typing import Union

from jetwire import MATCH_IGNORE_CASE
from jetwire import MATCH_NOT
from jetwire import QUERY_METHODS
from jetwire import QUERY_NODES
from jetwire import SORT_DESCENDING
from jetwire import FilterOp
from jetwire import LocalProtocolError
from jetwire import PathMatcher
from jetwire import PathOp
from jetwire import Query
from jetwire import SortBy
from jetwire import TypeCode
from jetwire import Value
from jetwire import ValueFilter

__all__ = ["Field", "Matcher", "QueryOptions", "build_query", "field", "key", "value"]


@dataclass(frozen=True)
class Matcher:
    """A path matcher: ``~m`` negates it, ``m.ignore_case()`` folds case."""

    op: PathOp
    operands: tuple[str, ...]
    flags: int = 0

    def __invert__(self) -> Matcher:
        return Matcher(self.op, self.operands, self.flags ^ MATCH_NOT)

    def ignore_case(self) -> Matcher:
        return Matcher(self.op, self.operands, self.flags | MATCH_IGNORE_CASE)

    def wire(self) -> PathMatcher:
        return PathMatcher(self.op, self.operands, self.flags)


class _Key:
    """``key``: the path matchers (PROTOCOL.md 14.1)."""

    def starts_with(self, text: str) -> Matcher:
        return Matcher(PathOp.STARTS_WITH, (text,))

    def ends_with(self, text: str) -> Matcher:
        return Matcher(PathOp.ENDS_WITH, (text,))

    def contains(self, text: str) -> Matcher:
        return Matcher(PathOp.CONTAINS, (text,))

    def equals(self, text: str) -> Matcher:
        return Matcher(PathOp.EQUALS, (text,))

    def equals_one_of(self, *texts: str) -> Matcher:
        return Matcher(PathOp.EQUALS_ONE_OF, texts)

    def contains_all_of(self, *texts: str) -> Matcher:
        return Matcher(PathOp.CONTAINS_ALL_OF, texts)


key = _Key()

_TYPE_NAMES = {code.name.lower(): code for code in TypeCode}


class Field:
    """The value at a field path (``field("address.city")``), or the value itself
    (``value``); comparing it builds a :class:`jetwire.ValueFilter`."""

    __slots__ = ("path",)

    def __init__(self, path: str = "") -> None:
        self.path = path

    def _filter(self, op: FilterOp, operand: Any) -> ValueFilter:
        return ValueFilter(op, Value.of(operand), self.path)

    def __eq__(self, operand: Any) -> ValueFilter:  # type: ignore[override]
        return self._filter(FilterOp.EQ, operand)

    def __ne__(self, operand: Any) -> ValueFilter:  # type: ignore[override]
        return self._filter(FilterOp.NE, operand)

    def __lt__(self, operand: Any) -> ValueFilter:
        return self._filter(FilterOp.LT, operand)

    def __le__(self, operand: Any) -> ValueFilter:
        return self._filter(FilterOp.LE, operand)

    def __gt__(self, operand: Any) -> ValueFilter:
        return self._filter(FilterOp.GT, operand)

    def __ge__(self, operand: Any) -> ValueFilter:
        return self._filter(FilterOp.GE, operand)

    __hash__ = None  # type: ignore[assignment]

    def is_type(self, name: Union[str, TypeCode]) -> ValueFilter:
        """``null``, ``bool``, ``number``, ``string``, ``bytes``, ``array`` or ``object``."""
        code = _TYPE_NAMES.get(name) if isinstance(name, str) else TypeCode(name)
        if code is None:
            raise LocalProtocolError(f"unknown type {name!r}; one of {', '.join(_TYPE_NAMES)}")
        return ValueFilter(FilterOp.IS_TYPE, Value.of(int(code)), self.path)


def field(path: str) -> Field:
    """The value at ``path`` inside a JSON, CBOR or MessagePack state (``tags.0``)."""
    if not path:
        raise LocalProtocolError("a field path is not empty; use `value` for the value itself")
    return Field(path)


value = Field("")


class QueryOptions(TypedDict, total=False):
    """The query keyword arguments of the peers' ``fetch`` and ``query`` (see
    :func:`build_query`)."""

    match: Iterable[Union[Matcher, PathMatcher]]
    where: Iterable[ValueFilter]
    sort_by: Optional[str]
    descending: bool
    top: Optional[int]
    window: Optional[Sequence[int]]
    methods: bool
    nodes: bool


def build_query(
    prefix: str = "",
    *,
    match: Iterable[Union[Matcher, PathMatcher]] = (),
    where: Iterable[ValueFilter] = (),
    sort_by: Optional[str] = None,
    descending: bool = False,
    top: Optional[int] = None,
    window: Optional[Sequence[int]] = None,
    methods: bool = False,
    nodes: bool = False,
) -> Query:
    """The :class:`jetwire.Query` for the peers' keyword arguments.

    ``prefix`` becomes a STARTS_WITH matcher; ``sort_by`` is ``"key"``, ``"value"`` or a
    field path; ``top=N`` is the window 1..N, ``window=(from, to)`` any other (1-based,
    inclusive). A sort without a window is the top 1000 (jetd's default ``max_window``).

    Raises:
        LocalProtocolError: for a window without a sort, or both ``top`` and ``window``.
    """
    matchers = [PathMatcher(PathOp.STARTS_WITH, (prefix,))] if prefix else []
    matchers += [m.wire() if isinstance(m, Matcher) else m for m in match]
    filters = tuple(where)
    for item in filters:
        if not isinstance(item, ValueFilter):
            raise LocalProtocolError(f"where takes comparisons such as field('a') == 1, got {item!r}")
    if top is not None and window is not None:
        raise LocalProtocolError("give top or window, not both")
    if top is not None:
        window = (1, top)
    sort = SortBy.NONE
    sort_field = ""
    if sort_by is not None:
        if sort_by == "key":
            sort = SortBy.KEY
        elif sort_by == "value":
            sort = SortBy.VALUE
        else:
            sort, sort_field = SortBy.FIELD, sort_by
        window = tuple(window) if window is not None else (1, 1000)
    elif window is not None or descending:
        raise LocalProtocolError("top, window and descending need sort_by")
    start, stop = window if window is not None else (0, 0)
    return Query(
        tuple(matchers),
        filters,
        sort,
        sort_field,
        SORT_DESCENDING if descending else 0,
        start,
        stop,
        (QUERY_METHODS if methods else 0) | (QUERY_NODES if nodes else 0),
    )


def is_plain_prefix(query: Query) -> bool:
    """True if ``query`` is a FETCH_STATES prefix in disguise (1.0 daemons answer it)."""
    return (
        not query.filters
        and query.sort_by == SortBy.NONE
        and not query.flags
        and len(query.matchers) <= 1
        and all(m.op == PathOp.STARTS_WITH and not m.flags for m in query.matchers)
    )
