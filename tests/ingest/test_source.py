"""The ``jetlog`` source's options, schema and failure modes (issue 13 items 1, 5, 7).

The reader's worker path is called directly where Spark cannot be made to hit it on
one machine (a file listed by the driver that a task cannot read); everything else
runs through the shared local[2] session.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import conn_open_data
from jetwire.log import encode_header
from jetwire.log import encode_record
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import write_synthetic_log


def _segment(path: Path, created: int, segment: int, n: int, *, version: int = 2, run_ns: int | None = None,
             first: int = 0) -> bytes:
    records = [encode_record(created + i, 1, LogKind.CONN_OPEN, conn_open_data(f"127.0.0.1:{first + i}"))
               for i in range(n)]
    data = encode_header(LogHeader("jetd", created, segment, version=version, run_ns=run_ns)) + b"".join(records)
    path.write_bytes(data)
    return data


# --- JVM-free: the worker side -------------------------------------------------------------


def test_a_listed_file_a_task_cannot_read_is_an_error(tmp_path: Path) -> None:
    from tools.ingest.source import JetlogReader

    path = tmp_path / "jet-0.jetlog"
    _segment(path, BASE_NS, 0, 5)
    reader = JetlogReader({"path": str(tmp_path)})
    (part,) = reader.partitions()
    path.unlink()  # gone between planning and reading (or never visible to the executor)
    with pytest.raises(FileNotFoundError, match=r"which the driver listed.*same path.*ignoreMissingFiles"):
        list(reader.read(part))
    # ignoreMissingFiles: skipped, but said: one row naming the file (and a log line).
    rows = [r for b in JetlogReader({"path": str(tmp_path), "ignoremissingfiles": "true"}).read(part)
            for r in b.to_pylist()]
    assert [(r["file"], r["kind"]) for r in rows] == [(str(path), "CORRUPT")]
    assert rows[0]["corrupt"].startswith("missing file")


def test_empty_directory_plans_one_empty_partition(tmp_path: Path) -> None:
    from tools.ingest.source import JetlogReader

    reader = JetlogReader({"path": str(tmp_path)})
    parts = reader.partitions()
    assert len(parts) == 1 and list(reader.read(parts[0])) == []
    with pytest.raises(FileNotFoundError, match="matches"):
        JetlogReader({"path": str(tmp_path / "*.jetlog")}).partitions()


def test_path_glob_filter_and_recursive_lookup(tmp_path: Path) -> None:
    from tools.ingest.source import expand_paths

    _segment(tmp_path / "a.jetlog", BASE_NS, 0, 1)
    (tmp_path / "sub").mkdir()
    _segment(tmp_path / "sub" / "b.jetlog", BASE_NS + 1, 1, 1)
    _segment(tmp_path / "c.log", BASE_NS + 2, 2, 1)
    (tmp_path / "notes.jetlog").write_text("not a log")
    names = lambda opts: [Path(f).name for f in expand_paths(opts)]  # noqa: E731
    assert names({"path": str(tmp_path)}) == ["a.jetlog", "c.log"]
    assert names({"path": str(tmp_path), "pathglobfilter": "*.jetlog"}) == ["a.jetlog"]
    assert names({"path": str(tmp_path), "recursivefilelookup": "true"}) == ["a.jetlog", "c.log", "b.jetlog"]
    assert names({"path": str(tmp_path), "recursivefilelookup": "true", "pathglobfilter": "*.jetlog"}) == [
        "a.jetlog", "b.jetlog"]


def test_since_until_plan_only_the_byte_ranges_of_that_time(tmp_path: Path) -> None:
    """The DataFrame's own time window (options, not a query's filters: those are never
    pushed, tests/ingest/test_queries.py) is found by bisection: a small part of the log
    is planned, and every record of the window is in it."""
    import pyarrow as pa

    from tools.ingest.source import JetlogReader

    logs = tmp_path / "logs"
    logs.mkdir()
    for seg in range(3):
        write_synthetic_log(str(logs / f"jet-{seg}.jetlog"), 1500, segment=seg, start_ns=BASE_NS + seg * 10**10)
    lo = BASE_NS + 10**10 + 2 * 10**6
    opts = {"path": str(logs), "since": str(lo), "until": str(lo + 10**6)}
    reader = JetlogReader(opts)
    parts = reader.partitions()
    planned = sum((stop if stop is not None else lim) - start
                  for p in parts for _, start, stop, lim in p.ranges)  # type: ignore[attr-defined]
    total = sum(f.stat().st_size for f in logs.iterdir())
    assert 0 < planned < total / 10
    got = pa.Table.from_batches([b for p in parts for b in reader.read(p)])
    everything = pa.Table.from_batches([b for p in JetlogReader({"path": str(logs)}).partitions()
                                        for b in JetlogReader({"path": str(logs)}).read(p)])
    want = [o for o, t in zip(everything.column("offset").to_pylist(), everything.column("ts_ns").to_pylist(),
                              strict=True) if lo <= t < lo + 10**6]
    assert sorted(got.column("offset").to_pylist()) == sorted(want) and len(want) > 100


# --- Spark -------------------------------------------------------------------------------


@pytest.mark.spark
def test_schema_run_ns_gzip_and_catalog_table(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    # Run 1 (version 1 headers: run inferred), run 2 (version 2: run from the header).
    _segment(logs / "jet-a-000000.jetlog", BASE_NS, 0, 3, version=1)
    (logs / "jet-a-000001.jetlog.gz").write_bytes(
        gzip.compress(_segment(tmp_path / "x", BASE_NS + 10, 1, 4, version=1, first=3)))
    _segment(logs / "jet-b-000000.jetlog", BASE_NS + 100, 0, 2, first=7)
    _segment(logs / "jet-b-000001.jetlog", BASE_NS + 200, 1, 2, run_ns=BASE_NS + 100, first=9)
    df = spark.read.format("jetlog").load(str(logs))
    fields = {f.name: f.nullable for f in df.schema.fields}
    assert not any(fields[c] for c in ("file", "offset", "kind", "size")) and fields["ts_ns"]
    got = sorted((r["run_ns"], int(r["address"].split(":")[1])) for r in df.collect())
    assert got == [(BASE_NS, i) for i in range(7)] + [(BASE_NS + 100, i) for i in range(7, 11)]
    spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW jetlog_v USING jetlog OPTIONS (path '{logs}')")
    assert spark.sql("SELECT count(*) AS n FROM jetlog_v").collect()[0]["n"] == 11
    # Spark 4.3 hands a catalog table's reader no OPTIONS: the error says what works.
    spark.sql("DROP TABLE IF EXISTS jetlog_t")
    spark.sql(f"CREATE TABLE jetlog_t USING jetlog OPTIONS (path '{logs}')")
    try:
        with pytest.raises(Exception, match="CREATE TEMPORARY VIEW name USING jetlog"):
            spark.sql("SELECT count(*) AS n FROM jetlog_t").collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS jetlog_t")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert spark.read.format("jetlog").load(str(empty)).count() == 0


def _run_stream(spark: Any, logs: Path, out: Path, ckpt: Path, **options: str) -> int:
    """Run a stream to the end of what is there; returns the micro-batches it took."""
    reader = spark.readStream.format("jetlog")
    for k, v in options.items():
        reader = reader.option(k, v)
    query = (reader.load(str(logs)).select("file", "offset", "address").writeStream.format("parquet")
             .option("path", str(out)).option("checkpointLocation", str(ckpt)).start())
    try:
        query.processAllAvailable()
        return sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
    finally:
        query.stop()


@pytest.mark.spark
def test_streaming_offsets_and_read_limits(spark: Any, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(3):
        _segment(logs / f"jet-{i}.jetlog", BASE_NS + i * 100, i, 10, first=10 * i)

    def addresses(out: Path) -> list[int]:
        return sorted(int(r["address"].split(":")[1]) for r in spark.read.parquet(str(out)).collect())

    out, ckpt = tmp_path / "o1", tmp_path / "c1"
    assert _run_stream(spark, logs, out, ckpt, maxFilesPerTrigger="1") == 3
    assert addresses(out) == list(range(30))
    out, ckpt = tmp_path / "o2", tmp_path / "c2"
    record = len(encode_record(BASE_NS, 1, LogKind.CONN_OPEN, conn_open_data("127.0.0.1:10")))
    assert _run_stream(spark, logs, out, ckpt, maxBytesPerTrigger=str(12 * record)) >= 3
    assert addresses(out) == list(range(30))
    # latest: only what is written after the query starts.
    out, ckpt = tmp_path / "o3", tmp_path / "c3"
    _run_stream(spark, logs, out, ckpt, startingOffsets="latest")
    _segment(logs / "jet-3.jetlog", BASE_NS + 300, 3, 5, first=30)
    _run_stream(spark, logs, out, ckpt, startingOffsets="latest")
    assert addresses(out) == list(range(30, 35))
    # (JSON startingOffsets: jet-ingest --follow's tests in test_spark.py.)
    with pytest.raises(Exception, match="startingOffsets"):
        _run_stream(spark, logs, tmp_path / "o5", tmp_path / "c5", startingOffsets="yesterday")
    with pytest.raises(Exception, match="cannot both be set"):
        _run_stream(spark, logs, tmp_path / "o6", tmp_path / "c6", maxFilesPerTrigger="1", maxBytesPerTrigger="9")


@pytest.mark.spark
def test_failfast_and_damage_rows_through_spark(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "a.jetlog"
    n = write_synthetic_log(str(path), 60)
    data = bytearray(path.read_bytes())
    data[-7:] = b""  # a truncated last record
    path.write_bytes(bytes(data))
    df = spark.read.format("jetlog").option("chunkSize", "997").load(str(path))
    kinds = {r["kind"]: r["n"] for r in df.groupBy("kind").count().withColumnRenamed("count", "n").collect()}
    assert kinds["TRUNCATED"] == 1 and sum(kinds.values()) == n
    with pytest.raises(Exception, match="truncated record"):
        spark.read.format("jetlog").option("mode", "FAILFAST").load(str(path)).count()


@pytest.mark.spark
def test_filters_keep_every_match(spark: Any, tmp_path: Path) -> None:
    """Filters on time, kind, connection and key give what a full scan holds (the time
    window that skips bytes is the since/until options: tests/ingest/test_queries.py)."""
    import datetime

    from pyspark.sql import functions as F

    logs = tmp_path / "logs"
    logs.mkdir()
    for seg in range(3):
        write_synthetic_log(str(logs / f"jet-{seg}.jetlog"), 1500, segment=seg, start_ns=BASE_NS + seg * 10**10)
    df = spark.read.format("jetlog").load(str(logs))
    lo = datetime.datetime.fromtimestamp((BASE_NS + 10**10 + 2 * 10**6) / 1e9, datetime.UTC)
    hi = lo + datetime.timedelta(milliseconds=1)
    cond = (F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi)) & (F.col("kind") == "FRAME_IN")
    got = sorted((r["file"], r["offset"]) for r in df.filter(cond).select("file", "offset").collect())
    full = spark.read.format("jetlog").load(str(logs)).select("file", "offset", "ts_ns", "kind", "conn_id").collect()
    lo_ns = (BASE_NS + 10**10 + 2 * 10**6) // 1000 * 1000
    want = sorted((r["file"], r["offset"]) for r in full
                  if lo_ns <= r["ts_ns"] < lo_ns + 10**6 and r["kind"] == "FRAME_IN")
    assert got == want and len(want) > 10
    assert df.filter(F.col("conn_id").isin(2, 3)).count() == sum(1 for r in full if r["conn_id"] in (2, 3))
    assert df.filter(F.col("key").startswith("plant")).count() == df.filter("key like 'plant%'").count() > 0
