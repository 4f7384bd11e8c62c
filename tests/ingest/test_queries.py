"""Every answer of the ``jetlog`` source equals a fresh DataFrame's, whatever ran before
on the same DataFrame or temporary view (issue 27 item 1).

PySpark 4.3 plans a DataFrame's scan once and reuses the planned reader and partitions
for later queries of it; it plans again only for a query with a filter it can hand to
the reader, and keeps that plan for the queries after it. A reader that took one
query's filters therefore answered the next query with them. The reader now takes no
filters from queries (tools/ingest/source.py, ``JetlogReader``).

Checked the way users work: ``register(spark)`` as the README says, then queries on one
DataFrame and on one temporary view, each compared with a fresh DataFrame and, for the
columns a record's header carries (file, offset, ts_ns, conn_id, kind), with a strict
whole-file read by :func:`jetwire.log.iter_log`.
"""

from __future__ import annotations

import datetime
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Optional

import pytest
from hypothesis import HealthCheck
from hypothesis import Phase
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from jetwire.log import LogKind
from jetwire.log import LogRecord
from jetwire.log import iter_log
from jetwire.log import parse_record_data
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import write_synthetic_log

pytestmark = pytest.mark.spark

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclass(frozen=True)
class Row:
    """What the strict reader knows of a record: its header, and a ROUTE's key."""

    file: str
    offset: int
    ts_ns: int
    conn_id: int
    kind: str
    key: Optional[str]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Row]]:
    where = tmp_path_factory.mktemp("query-logs")
    for seg in range(2):
        write_synthetic_log(str(where / f"jet-{seg}.jetlog"), 120, segment=seg, start_ns=BASE_NS + seg * 10**9)
    rows = []
    for path in sorted(where.iterdir()):
        with open(path, "rb") as fh:
            for item in iter_log(fh):
                if isinstance(item, LogRecord):
                    key = None
                    if item.kind == LogKind.ROUTE:
                        key = str(parse_record_data(item.kind, item.data)["key"])
                    rows.append(Row(str(path), item.offset, item.ts_ns, item.conn_id, LogKind(item.kind).name, key))
    return where, rows


# --- queries: a filter list and what to ask --------------------------------------------------

Filter = tuple[str, str, Any]  # column, op, value


def _sql_literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return str(value)


def _sql(flt: Filter) -> str:
    col, op, value = flt
    if col == "ts":
        return f"ts {op} timestamp_micros({value})"
    if op == "in":
        return f"{col} IN ({', '.join(_sql_literal(v) for v in value)})"
    if op == "startswith":
        return f"startswith({col}, {_sql_literal(value)})"
    if op == "isnotnull":
        return f"{col} IS NOT NULL"
    return f"{col} {op} {_sql_literal(value)}"


def _column(flt: Filter) -> Any:
    from pyspark.sql import functions as F

    col, op, value = flt
    c = F.col(col)
    if col == "ts":
        value = _EPOCH + datetime.timedelta(microseconds=value)  # an aware datetime: Spark's timestamp literal
    if op == "in":
        return c.isin(*value)
    if op == "startswith":
        return c.startswith(value)
    if op == "isnotnull":
        return c.isNotNull()
    lit = F.lit(value)
    return {"=": c == lit, ">=": c >= lit, ">": c > lit, "<": c < lit, "<=": c <= lit}[op]


_STRICT = {"file", "offset", "ts_ns", "ts", "conn_id", "kind"}


def _strict_match(row: Row, flt: Filter) -> bool:
    col, op, value = flt
    have = row.ts_ns // 1000 if col == "ts" else getattr(row, col)
    if op == "in":
        return have in value
    return bool({"=": have == value, ">=": have >= value, ">": have > value, "<": have < value,
                 "<=": have <= value}[op])


@dataclass(frozen=True)
class Query:
    filters: tuple[Filter, ...]
    ask: str  # count, kinds (groupBy kind), rows (file, offset), limit
    limit: int = 0

    def strict(self) -> bool:
        return all(f[0] in _STRICT and f[1] not in ("startswith", "isnotnull") for f in self.filters)


def _answer_df(df: Any, q: Query) -> Any:
    for flt in q.filters:
        df = df.filter(_column(flt))
    if q.ask == "count":
        return df.count()
    if q.ask == "kinds":
        return {r["kind"]: r["count"] for r in df.groupBy("kind").count().collect()}
    if q.ask == "rows":
        return sorted((r["file"], r["offset"]) for r in df.select("file", "offset").collect())
    return df.limit(q.limit).count()


def _answer_sql(spark: Any, view: str, q: Query) -> Any:
    where = (" WHERE " + " AND ".join(_sql(f) for f in q.filters)) if q.filters else ""
    if q.ask == "count":
        return spark.sql(f"SELECT count(*) AS n FROM {view}{where}").collect()[0]["n"]
    if q.ask == "kinds":
        return {r["kind"]: r["n"] for r in spark.sql(f"SELECT kind, count(*) AS n FROM {view}{where} GROUP BY kind")
                .collect()}
    if q.ask == "rows":
        return sorted((r["file"], r["offset"]) for r in spark.sql(f"SELECT file, offset FROM {view}{where}").collect())
    return spark.sql(f"SELECT count(*) AS n FROM (SELECT * FROM {view}{where} LIMIT {q.limit})").collect()[0]["n"]


def _answer_strict(rows: list[Row], q: Query) -> Any:
    kept = [r for r in rows if all(_strict_match(r, f) for f in q.filters)]
    if q.ask == "count":
        return len(kept)
    if q.ask == "kinds":
        return dict(Counter(r.kind for r in kept))
    if q.ask == "rows":
        return sorted((r.file, r.offset) for r in kept)
    return min(q.limit, len(kept))


def _filters(rows: list[Row]) -> st.SearchStrategy[Filter]:
    times = sorted({r.ts_ns for r in rows})
    kinds = sorted({r.kind for r in rows})
    conns = sorted({r.conn_id for r in rows})
    keys = sorted({r.key for r in rows if r.key})
    ops = st.sampled_from(["=", ">=", ">", "<", "<="])
    return st.one_of(
        st.tuples(st.just("ts_ns"), ops, st.sampled_from(times)),
        st.tuples(st.just("ts"), ops, st.sampled_from(times).map(lambda t: t // 1000)),
        st.tuples(st.just("kind"), st.just("="), st.sampled_from(kinds)),
        st.tuples(st.just("kind"), st.just("in"), st.lists(st.sampled_from(kinds), min_size=1, max_size=3, unique=True)
                  .map(tuple)),
        st.tuples(st.just("conn_id"), st.sampled_from(["=", ">="]), st.sampled_from(conns)),
        st.tuples(st.just("conn_id"), st.just("in"), st.lists(st.sampled_from(conns), min_size=1, max_size=2,
                                                              unique=True).map(tuple)),
        st.tuples(st.just("key"), st.just("="), st.sampled_from(keys)),
        st.tuples(st.just("key"), st.just("startswith"), st.sampled_from(["plant/line1", "plant/", "plant/reset"])),
        st.tuples(st.just("key"), st.just("isnotnull"), st.none()),
        # columns the reader never skipped by
        st.tuples(st.just("size"), st.sampled_from([">", "<="]), st.sampled_from([10, 40, 80])),
        st.tuples(st.just("msg_type"), st.just("="), st.sampled_from(["REQUEST", "RESPONSE", "EVENT"])),
        st.tuples(st.just("peer_name"), st.just("="), st.sampled_from(["owner", "client"])),
    )


def _queries(rows: list[Row]) -> st.SearchStrategy[Query]:
    return st.builds(Query, st.lists(_filters(rows), max_size=3).map(tuple),
                     st.sampled_from(["count", "kinds", "rows", "limit"]), st.integers(0, 400))


_views = itertools.count()


def _check_sequence(spark: Any, logs: Path, rows: list[Row], steps: list[tuple[str, Query]]) -> Iterator[str]:
    """Run ``steps`` on one DataFrame and one view; yield a line for every answer that
    differs from a fresh DataFrame's or the strict reader's."""
    from tools.ingest import register

    register(spark)  # as the README says
    df = spark.read.format("jetlog").load(str(logs))
    view = f"jetlog_q{next(_views)}"
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {view} USING jetlog OPTIONS (path '{logs}')")
    try:
        for i, (on, q) in enumerate(steps):
            got = _answer_df(df, q) if on == "df" else _answer_sql(spark, view, q)
            fresh = _answer_df(spark.read.format("jetlog").load(str(logs)), q)
            if got != fresh:
                yield f"step {i} on the {on}: {q} gave {got!r}, a fresh DataFrame {fresh!r}"
            if q.strict():
                want = _answer_strict(rows, q)
                if fresh != want:
                    yield f"step {i}: {q}: a fresh DataFrame gave {fresh!r}, the strict reader {want!r}"
    finally:
        spark.catalog.dropTempView(view)


def test_a_filter_of_one_query_does_not_change_the_next(spark: Any, logs: tuple[Path, list[Row]]) -> None:
    """The report's two sequences: count, a pushable filter, count again, groupBy."""
    where, rows = logs
    total = len(rows)
    routes = sum(1 for r in rows if r.kind == "ROUTE")
    conn2 = sum(1 for r in rows if r.conn_id == 2)
    kinds = dict(Counter(r.kind for r in rows))
    steps = [("df", Query((), "count")), ("df", Query((("kind", "=", "ROUTE"),), "count")),
             ("df", Query((), "count")), ("df", Query((), "kinds")),
             ("sql", Query((), "count")), ("sql", Query((("conn_id", "=", 2),), "count")),
             ("sql", Query((), "count")),
             ("df", Query((("ts_ns", ">=", rows[len(rows) // 2].ts_ns),), "count")), ("df", Query((), "count"))]
    assert list(_check_sequence(spark, where, rows, steps)) == []
    # and the answers themselves, against the strict reader
    from tools.ingest import register

    register(spark)
    df = spark.read.format("jetlog").load(str(where))
    assert [df.count(), df.where("kind = 'ROUTE'").count(), df.count()] == [total, routes, total]
    assert {r["kind"]: r["count"] for r in df.groupBy("kind").count().collect()} == kinds
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW jetlog_readme USING jetlog OPTIONS (path '{where}')")
    answers = [spark.sql(q).collect()[0][0] for q in ("SELECT count(*) FROM jetlog_readme",
                                                      "SELECT count(*) FROM jetlog_readme WHERE conn_id = 2",
                                                      "SELECT count(*) FROM jetlog_readme")]
    spark.catalog.dropTempView("jetlog_readme")
    assert answers == [total, conn2, total]


# No shrinking: each step is two Spark queries, and a failing sequence says which step
# differed (shrinking one took over 5 minutes with the old reader put back).
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_query_sequences_equal_fresh_dataframes_and_a_strict_reader(
        spark: Any, logs: tuple[Path, list[Row]], data: st.DataObject) -> None:
    where, rows = logs
    steps = data.draw(st.lists(st.tuples(st.sampled_from(["df", "sql"]), _queries(rows)), min_size=2, max_size=5))
    assert list(_check_sequence(spark, where, rows, steps)) == []


def test_since_until_options_read_that_time_only(spark: Any, logs: tuple[Path, list[Row]]) -> None:
    """Skipping by time is the DataFrame's own option, the same for every query of it:
    only the byte ranges of that time are planned, and the rows are exactly that time's."""
    from tools.ingest.source import JetlogReader

    where, rows = logs
    lo, hi = rows[len(rows) // 4].ts_ns, rows[len(rows) // 4 + 50].ts_ns
    want = sorted((r.file, r.offset) for r in rows if lo <= r.ts_ns < hi)
    iso = (_EPOCH + datetime.timedelta(microseconds=lo // 1000)).isoformat()
    for since in (str(lo), iso if lo % 1000 == 0 else str(lo)):
        df = spark.read.format("jetlog").option("since", since).option("until", str(hi)).load(str(where))
        assert sorted((r["file"], r["offset"]) for r in df.select("file", "offset").collect()) == want
        assert df.where("kind = 'ROUTE'").count() == sum(1 for r in rows if lo <= r.ts_ns < hi and r.kind == "ROUTE")
        assert df.count() == len(want)  # the filter of the query before stays in it
    reader = JetlogReader({"path": str(where), "since": str(lo), "until": str(hi)})
    planned = [rng for p in reader.partitions() for rng in p.ranges]  # type: ignore[attr-defined]
    # The other segment holds none of that time: it is never opened by a task.
    assert {f for f, *_ in planned} == {f for f, _ in want}
    with pytest.raises(ValueError, match="zone"):
        JetlogReader({"path": str(where), "since": "2026-01-01T00:00:00"})
    with pytest.raises(ValueError, match="after since"):
        JetlogReader({"path": str(where), "since": "5", "until": "5"})
