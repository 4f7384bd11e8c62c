"""``jet-ingest LOGDIR --out WAREHOUSE [--master URL] [--since TS] [--follow]``.

Reads a jetd log directory with the ``jetlog`` source and maintains a Parquet
warehouse (layout and exactly-once commit: :mod:`tools.ingest.warehouse`):

- ``frames``: every record (the ``jetlog`` schema plus ``run_ns``);
- ``state_changes``, ``requests``, ``connections``, ``traffic``: derived in the same
  pass, each run adding what its records settle (:mod:`tools.ingest.pipeline`);

all partitioned by ``date`` (UTC), codes stored by their spec names. It prints a summary
and writes ``WAREHOUSE/report.html``.

Master: ``local[*]`` unless ``--master`` or ``spark-submit --master`` says otherwise
(``spark-submit -m tools.ingest`` is not a thing: submit ``tools/ingest/cli.py``'s
``main`` via a one-line driver script, with the project installed on every node as
:mod:`tools.ingest.session` explains).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC
from datetime import datetime
from pathlib import Path
from typing import Any
from typing import Optional

from rich.console import Console

__all__ = ["commit_micro_batch", "ingest_once", "load_tables", "main", "read_table", "table_changes"]


def _parse_since(text: str) -> int:
    """``--since``: epoch seconds or an ISO 8601 time (UTC unless it says otherwise) -> ns."""
    try:
        return int(float(text) * 1e9)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--since: not a time: {text!r} (use ISO 8601 or epoch seconds)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1e9)


class _Progress:
    """Our own progress while the Spark tasks run (one task per file or chunk): a rich
    progress bar on a terminal, else a "files done" line when the count changes."""

    def __init__(self, spark: Any, console: Console, files: int, tasks: int) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.console = console
        self.files = files
        self.tasks = max(tasks, 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._bar: Any = None

    def __enter__(self) -> _Progress:
        if self.console.is_terminal:
            from rich.progress import BarColumn
            from rich.progress import MofNCompleteColumn
            from rich.progress import Progress
            from rich.progress import TextColumn
            from rich.progress import TimeElapsedColumn

            self._bar = Progress(TextColumn("ingesting"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
                                 TimeElapsedColumn(), console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("files", total=self.files)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        if self._bar is not None:
            self._bar.stop()
        if not exc[0]:
            self.console.print(f"files done {self.files}/{self.files}")

    def _run(self) -> None:
        last = -1
        while not self._stop.wait(0.5 if self._bar is not None else 1.0):
            done = 0
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None and info.numTasks == self.tasks:
                    done = max(done, info.numCompletedTasks)
            files_done = done * self.files // self.tasks
            if files_done != last:
                if self._bar is not None:
                    self._bar.update(self._task, completed=files_done)
                else:
                    self.console.print(f"files done {files_done}/{self.files}")
                last = files_done


def _plan(committed: Any, logdir: str) -> tuple[list[tuple[str, int, int]], dict[str, Any]]:
    """Byte ranges still to ingest per file, and the segment states to record (keyed by
    segment identity, :func:`tools.ingest.warehouse.segment_key`).

    A segment is known by its header, wherever it lies now: one renamed or moved to an
    archive directory resumes where the warehouse left it (a ``.gz`` one, finished, is
    done), and a second copy of it is not read. Runs: the header's ``run_ns``, or
    inferred from the headers (:func:`tools.ingest.parse.infer_runs`).

    Raises:
        WarehouseError: a known segment is now shorter than what was ingested from it.
    """
    from tools.ingest.parse import JetlogError
    from tools.ingest.parse import infer_runs
    from tools.ingest.parse import read_file_header
    from tools.ingest.source import expand_paths
    from tools.ingest.warehouse import FileState
    from tools.ingest.warehouse import WarehouseError
    from tools.ingest.warehouse import bad_header_key
    from tools.ingest.warehouse import segment_key

    def key_of(h: Any) -> str:
        return segment_key(h.name, h.created_ns, h.segment, h.crc)

    files = expand_paths({"path": logdir})
    headers: dict[str, Any] = {}
    for f in files:
        try:
            headers[f] = read_file_header(f)
        except (OSError, JetlogError):
            headers[f] = None
    where: dict[str, str] = {}  # segment key -> the path read
    for f, h in headers.items():
        if h is None:
            continue
        key = key_of(h)
        known = committed.files.get(key)
        if key not in where or (known is not None and known.path == f):
            where[key] = f

    def known_run(path: str, header: Any) -> Optional[int]:
        known = committed.files.get(key_of(header))
        return known.run_ns if known is not None else None

    run_of = infer_runs({f: headers[f] for f in where.values()}, known_run)
    ranges: list[tuple[str, int, int]] = []
    states: dict[str, Any] = {}
    for f, h in headers.items():
        size = Path(f).stat().st_size
        if h is None:
            key = bad_header_key(f)
            if key not in committed.files and not _header_incomplete(f):
                ranges.append((f, 0, size))  # a bad header: reported once as a corrupt row
                states[key] = FileState(f, 0, "", 0, 0, 0, size)
            continue
        key = key_of(h)
        if where[key] != f:
            continue  # another copy of a segment read from elsewhere
        known = committed.files.get(key)
        start = known.done if known is not None else 0
        if f.endswith(".gz"):
            # Archived, so finished: read whole once (offsets are of the uncompressed bytes).
            if known is None:
                ranges.append((f, 0, size))
            states[key] = FileState(f, h.crc, h.name, h.created_ns, h.segment, run_of[f], max(start, size))
            continue
        if size < start:
            raise WarehouseError(
                f"{f}: segment {h.segment} of daemon {h.name!r} (created_ns {h.created_ns}) has {size} bytes, but "
                f"{start} bytes of it were ingested (from {known.path}): it shrank; "
                "restore the whole file or move it out of the log directory")
        states[key] = FileState(f, h.crc, h.name, h.created_ns, h.segment, run_of[f], max(start, h.size))
        if size > max(start, h.size):
            ranges.append((f, start, size))
    for key, state in states.items():
        if key in committed.files:
            state.since_ns = committed.files[key].since_ns  # what the first read of it skipped stays said
    return ranges, states


def _changed(committed: Any, states: dict[str, Any]) -> bool:
    return any(committed.files.get(k) != s for k, s in states.items())


def _header_incomplete(path: str) -> bool:
    from tools.ingest.parse import JetlogError
    from tools.ingest.parse import read_header

    try:
        with open(path, "rb") as fh:
            return read_header(fh.read(1 << 17)) is None
    except (OSError, JetlogError):
        return False


def _per_file(values: dict[str, int]) -> Any:
    """A column: ``values[file]`` (null for other files).

    A literal map, not a joined table: no Spark job (and no Python worker) to build a
    lookup table, and a log directory holds at most a few thousand segments.
    """
    from pyspark.sql import functions as F

    if not values:
        return F.lit(None).cast("long")
    return F.create_map(*[F.lit(x) for f, v in sorted(values.items()) for x in (f, v)])[F.col("file")]


def _frames_df(df: Any, states: dict[str, Any], since_ns: Optional[int]) -> Any:
    from pyspark.sql import functions as F

    out = df.withColumn("run_ns", _per_file({s.path: s.run_ns for s in states.values()}).cast("long"))
    if since_ns is not None:
        out = out.filter(F.col("ts_ns").isNull() | (F.col("ts_ns") >= F.lit(since_ns)))
    return out


def _complete_live(ranges: list[tuple[str, int, int]], states: dict[str, Any]) -> list[tuple[str, int, int]]:
    """``ranges`` with the newest segment of each daemon cut after its last complete
    record: the daemon may be writing the rest of the last one (JETLOG.md 5), which is
    neither damage nor a reason for FAILFAST to fail. An older segment will not grow
    (the daemon moved on, or restarted): its truncated tail is read and reported."""
    from tools.ingest.parse import JetlogError
    from tools.ingest.parse import resume_offset
    from tools.ingest.source import DEFAULT_CHUNK

    newest: dict[str, tuple[int, int, str]] = {}
    for s in states.values():
        if s.daemon:
            newest[s.daemon] = max(newest.get(s.daemon, (s.created_ns, s.segment, s.path)),
                                   (s.created_ns, s.segment, s.path))
    live = {path for _, _, path in newest.values()}
    out = []
    for path, start, limit in ranges:
        if path in live:
            with contextlib.suppress(JetlogError, OSError):  # else read as it is: the reader reports it
                limit = resume_offset(path, start, limit, DEFAULT_CHUNK)
        if limit > start:
            out.append((path, start, limit))
    return out


def _resume_offsets(ranges: list[tuple[str, int, int]], chunk: int) -> dict[str, int]:
    """Each range's resume offset, as the reader's last chunk of it ends (no Spark job)."""
    from tools.ingest.parse import JetlogError
    from tools.ingest.parse import resume_offset

    out = {}
    for path, start, limit in ranges:
        try:
            out[path] = resume_offset(path, start, limit, chunk)
        except JetlogError:
            out[path] = limit  # a bad header: reported once as a row, never read again
        except FileNotFoundError:
            out[path] = start  # rotated away since planning: the reader found nothing either
    return out


def _execute(spark: Any, parts: list[Any], spec: Any, console: Console, files: int) -> list[dict[str, Any]]:
    """Run one :func:`tools.ingest.pipeline.run_task` per partition: as Spark tasks, or
    in this process when ``spark`` is None."""
    from tools.ingest.pipeline import run_task

    if spark is None:
        return [run_task(i, p, spec) for i, p in enumerate(parts)]
    with _Progress(spark, console, files, len(parts)):
        return list(spark.sparkContext.parallelize(list(enumerate(parts)), len(parts))
                    .map(lambda task: run_task(task[0], task[1], spec)).collect())


def _record(committed: Any, states: dict[str, Any]) -> None:
    """Commit segment states that changed (a moved segment's new path) without rows,
    and finish a compaction that a killed run left undone."""
    from tools.ingest.pipeline import compact

    if _changed(committed, states):
        from tools.ingest.warehouse import new_run_id

        committed.publish([], new_run_id(), states)
    compact(committed)


def ingest_once(spark: Any, logdir: str, warehouse: Path, *, since_ns: Optional[int] = None,
                console: Optional[Console] = None, mode: str = "PERMISSIVE") -> int:
    """Ingest what is new in ``logdir`` into every table of ``warehouse``; returns the
    records added (:mod:`tools.ingest.pipeline`). ``spark`` None runs the tasks in this
    process (no JVM: tests, tiny logs).

    What the tasks report is checked against what is staged before anything is
    committed (:func:`tools.ingest.pipeline.check_reports`); then the run is committed
    to every Delta table with its application transaction, and partitions with many
    small files are compacted in commits of their own.

    Raises:
        IngestError: the executors could not see the log files or the warehouse.
        WarehouseError: a known segment shrank, or the warehouse cannot be continued.
        JetlogError: (in a Spark exception, from the tasks) damage in FAILFAST mode.
    """
    from tools.ingest.pipeline import TaskSpec
    from tools.ingest.pipeline import check_reports
    from tools.ingest.pipeline import commit
    from tools.ingest.pipeline import compact
    from tools.ingest.source import DEFAULT_CHUNK
    from tools.ingest.source import plan_files
    from tools.ingest.source import plan_ranges
    from tools.ingest.warehouse import Warehouse
    from tools.ingest.warehouse import new_run_id

    console = console or Console(stderr=True)
    committed = Warehouse.load(warehouse)
    removed = committed.recover()
    if removed:
        console.print(f"removed what {removed} ingest run(s) left that never committed")
    ranges, states = _plan(committed, logdir)
    if not ranges:
        _record(committed, states)
        console.print("nothing new to ingest")
        return 0
    ranges = _complete_live(ranges, states)
    if not ranges:
        _record(committed, states)
        console.print("nothing new to ingest")
        return 0
    parts = plan_ranges(ranges, DEFAULT_CHUNK, 0)
    console.print(f"ingesting {len(ranges)} file(s), {sum(lim - s for _, s, lim in ranges):,} bytes")
    run_id = new_run_id()
    staging = committed.meta / "staging" / run_id
    resume = {path: start for path, start, _ in ranges if start > 0}
    # Each task checks that the segment it reads is the one planned here (header, size,
    # last record): an executor that sees a shorter or other copy fails the run.
    spec = TaskSpec(str(staging), {s.path: s.run_ns for s in states.values()}, since_ns, mode, resume,
                    plan_files(ranges))
    from tools.ingest.warehouse import crash_point

    crash_point("tasks")  # before the tasks write any Parquet file
    ends: dict[str, int] = {}
    # Where each file's next read resumes is computed while the tasks run.
    worker = threading.Thread(target=lambda: ends.update(_resume_offsets(ranges, DEFAULT_CHUNK)), daemon=True)
    worker.start()
    try:
        reports = _execute(spark, parts, spec, console, len(ranges))
    finally:
        worker.join()
    staged = check_reports(staging, reports, len(parts), parts)
    if len(ends) < len(ranges):
        raise RuntimeError("jet-ingest: could not compute where each file's next read resumes")
    gone = {p for r in reports for p in r["missing"]}  # rotated away: check_reports proved it
    by_path = {s.path: k for k, s in states.items()}
    if since_ns is not None:
        for path, *_ in ranges:
            if path in by_path and by_path[path] not in committed.files:
                states[by_path[path]].since_ns = since_ns  # its records before then are skipped for good
    for path in gone:
        states.pop(by_path[path], None)
    # Done is what the executors read and verified: the end of each file's ranges that
    # a task checked against the plan (every one, or a task failed and nothing commits).
    verified: dict[str, int] = {}
    for r in reports:
        for path, _, limit in r.get("verified", ()):
            verified[path] = max(verified.get(path, 0), int(limit))
    for path, end in ends.items():
        if path in by_path and by_path[path] in states and path in verified:
            states[by_path[path]].done = max(states[by_path[path]].done, min(end, verified[path]))
    commit(committed, staging, run_id, states, staged)
    compact(committed)
    return int(sum(r["rows"] for r in reports))


def load_tables(spark: Any, warehouse: Path) -> dict[str, Any]:
    """Every table of ``warehouse`` (``frames`` and the derived ones) as a DataFrame of
    its latest version, each resolved once."""
    from tools.ingest.warehouse import TABLES

    return {name: read_table(spark, warehouse, name) for name in TABLES}


def table_files(warehouse: str | Path, name: str, *, version: Optional[int] = None,
                timestamp: Any = None) -> list[str]:
    """The Parquet files of Delta table ``name`` of ``warehouse`` at ``version`` (a Delta
    version of that table), or as of ``timestamp`` (a ``datetime`` with a zone, or ISO
    8601 text), else of its latest version.

    Raises:
        FileNotFoundError: nothing was ingested into ``warehouse`` yet.
        ValueError: no such table, both ``version`` and ``timestamp``, or no such
            version (before the first commit, or newer than the latest).
    """
    return [str(u) for u in _snapshot(warehouse, name, version, timestamp).file_uris()]


def _snapshot(warehouse: str | Path, name: str, version: Optional[int], timestamp: Any) -> Any:
    """The ``deltalake.DeltaTable`` of ``name`` at ``version`` or ``timestamp`` (see
    :func:`table_files`, which raises the same)."""
    from deltalake import DeltaTable

    from tools.ingest.warehouse import TABLES
    from tools.ingest.warehouse import table_path

    if name not in TABLES:
        raise ValueError(f"no table {name!r}: one of {', '.join(TABLES)}")
    if version is not None and timestamp is not None:
        raise ValueError("give a version or a timestamp, not both")
    path = table_path(Path(warehouse), name)
    try:
        dt = DeltaTable(str(path), version=version)
        if timestamp is not None:
            dt.load_as_version(timestamp)
    except Exception as exc:  # deltalake's own errors: no such version or time
        raise ValueError(f"{path}: {exc}") from None
    return dt


def read_table(spark: Any, warehouse: str | Path, name: str, *, version: Optional[int] = None,
               timestamp: Any = None) -> Any:
    """``name`` (frames, requests, state_changes, connections, traffic) of the
    warehouse, a Delta Lake table, as a Spark DataFrame: at ``version`` (that table's
    Delta version, see ``jet-ingest history``), as of ``timestamp``, else its latest
    version. The version's files are resolved once (with delta-rs) and read with
    ``spark.read.parquet``, so the DataFrame keeps reading that version while later
    ones are committed; no Delta jars are needed. Its columns are that version's
    schema: a column added later (schema evolution) is not in an older version, and
    reads as null in the rows of files written before it was added.

    Raises:
        FileNotFoundError: nothing was ingested into ``warehouse`` yet.
        ValueError: no such table, or no such version or time.
    """
    import pyarrow as pa

    from tools.ingest.pipeline import spark_ddl

    dt = _snapshot(warehouse, name, version, timestamp)
    files = [str(u) for u in dt.file_uris()]
    schema = pa.schema(dt.schema().to_arrow())
    ddl = spark_ddl(schema.remove(schema.get_field_index("date")))
    if not files:
        return spark.createDataFrame([], ddl)
    return spark.read.schema(ddl).option("basePath", str(Path(warehouse) / name)).parquet(*files)


def commit_micro_batch(committed: Any, listed: dict[str, Any], settled: list[dict[str, Any]], staging: Path,
                       run_id: str) -> int:
    """Commit a ``--follow`` micro-batch whose tasks (:func:`tools.ingest.pipeline.follow_task`)
    left ``staging`` and reported ``settled`` (file, end, rows, written); returns its rows.

    Only segments the warehouse holds already, or that the batch read, are recorded: a
    segment ``listed`` now that the stream has not read yet (jetd restarted after the
    micro-batch was planned) would end its daemon's previous run, whose last records
    may not be read yet either.

    Raises:
        IngestError: a staged file is missing or holds other rows than reported.
    """
    from tools.ingest.pipeline import check_reports
    from tools.ingest.pipeline import commit

    read = {r["file"] for r in settled if r["rows"]}
    states = {k: s for k, s in listed.items() if k in committed.files or s.path in read}
    by_path = {s.path: s for s in states.values()}
    for r in settled:
        state = by_path.get(r["file"])
        if state is not None:
            end = Path(r["file"]).stat().st_size if r["end"] < 0 else r["end"]
            state.done = max(state.done, end)
    reports = [{"task": i, "rows": r["rows"], "files": json.loads(r.get("written") or "{}"), "missing": []}
               for i, r in enumerate(settled)]
    staged = check_reports(staging, reports, len(reports))
    rows = sum(int(r["rows"]) for r in settled)
    if rows:
        commit(committed, staging, run_id, states, staged)
    else:
        _record(committed, states)
    return rows


def _follow(spark: Any, args: argparse.Namespace, console: Console) -> int:
    """Keep ingesting with the streaming reader until interrupted, or until no new
    record arrived for ``--idle-exit`` seconds; returns the records added."""
    from pyspark.sql import functions as F

    from tools.ingest.warehouse import Warehouse
    from tools.ingest.warehouse import new_run_id

    warehouse = Path(args.out)
    committed = Warehouse.load(warehouse)
    committed.recover()
    starting = {s.path: s.done for s in committed.files.values()}
    last_rows = [time.monotonic()]
    added, batches = [0], [0]
    # Held while a micro-batch commits, so stopping never cuts one in half.
    committing = threading.Lock()

    def batch(df: Any, batch_id: int) -> None:
        from tools.ingest.pipeline import compact
        from tools.ingest.pipeline import follow_task

        with committing:
            m = Warehouse.load(warehouse)
            _, states = _plan(m, args.logdir)
            # The progress table is the truth: rows it already holds (from a batch run, or a
            # micro-batch replayed after a crash, or a segment since renamed) are
            # filtered out.
            done = _per_file({s.path: m.files[k].done for k, s in states.items() if k in m.files})
            fresh = _frames_df(df.filter(F.col("offset") >= F.coalesce(done, F.lit(0))), states, args.since)
            run_id = new_run_id()
            staging = m.root / "_jet_ingest" / "staging" / run_id
            settled = fresh.mapInArrow(lambda it: follow_task(it, str(staging), batch_id),
                                       "file string, `end` long, rows long, written string").collect()
            rows = commit_micro_batch(m, states, [r.asDict() for r in settled], staging, run_id)
            if rows or not batches[0]:
                last_rows[0] = time.monotonic()  # idle time counts from the first look
            batches[0] += 1
            if rows:
                added[0] += rows
                compact(m)
            console.print(f"micro-batch {batch_id}: {rows} new record(s)")

    query = (
        spark.readStream.format("jetlog").option("path", args.logdir).option("mode", args.mode)
        .option("startingOffsets", json.dumps(starting)).load()
        .writeStream.foreachBatch(batch)
        .option("checkpointLocation", str(warehouse / "_jet_ingest" / "checkpoint"))
        .trigger(processingTime=f"{args.interval} seconds").start()
    )
    console.print(f"following {args.logdir} (Ctrl-C to stop)")
    started = time.monotonic()
    try:
        while not query.awaitTermination(0.5):
            now = time.monotonic()
            if args.follow_for is not None and now - started >= args.follow_for:
                break
            if args.idle_exit is None or not batches[0] or now - last_rows[0] < args.idle_exit:
                continue  # (before its first micro-batch the stream has not looked yet)
            # Not while a micro-batch is being planned or committed: it may hold records.
            if not committing.locked() and not query.status.get("isTriggerActive", False):
                console.print(f"no new records for {args.idle_exit:g} s: stopping")
                break
    except KeyboardInterrupt:
        pass
    finally:
        with committing:
            query.stop()
    return added[0]


_DESCRIPTION = """\
Ingest jetd event logs (spec/JETLOG.md) into a Parquet warehouse with Spark: every record
(frames) and the tables derived from them (requests, state_changes, connections, traffic),
then print a summary and write WAREHOUSE/report.html. Run it again to add what is new:
nothing is ingested twice, and readers see each run whole or not at all."""

_EPILOG = """\
the tables are Delta Lake tables: read them with tools.ingest.read_table(spark,
WAREHOUSE, "frames", version=N) or any Delta Lake reader (deltalake, polars);
jet-ingest history WAREHOUSE lists their commits; jet-ingest migrate WAREHOUSE
converts a warehouse of the older snapshot layout in place; jet-ingest optimize
WAREHOUSE compacts small files, jet-ingest vacuum WAREHOUSE deletes replaced ones
(after a retention, see its --help); layout and clusters:
tools/ingest/README.md.

exit status: 0 done (or nothing new), 1 the ingest failed and nothing was committed
(damage with --mode FAILFAST, executors that cannot see the files), 2 bad arguments
or a warehouse it cannot continue."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jet-ingest", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logdir", help="jetd log directory (or a segment file, or a glob)")
    parser.add_argument("--out", required=True, metavar="WAREHOUSE", help="warehouse directory (created if missing)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default: spark-submit's, else local[*]); on a cluster the log "
                             "directory and the warehouse must be at the same path on every node")
    parser.add_argument("--since", type=_parse_since, metavar="TIME",
                        help="skip records before TIME for good (ISO 8601, UTC unless it says, or epoch seconds)")
    parser.add_argument("--mode", default="PERMISSIVE", choices=["PERMISSIVE", "DROPMALFORMED", "FAILFAST"],
                        type=str.upper,
                        help="damaged records: PERMISSIVE keeps a row saying what was skipped (default), "
                             "DROPMALFORMED drops them, FAILFAST stops with exit status 1 and commits nothing")
    parser.add_argument("--follow", action="store_true", help="keep ingesting new records (streaming reader)")
    parser.add_argument("--interval", type=float, default=5.0, metavar="S",
                        help="--follow: seconds between micro-batches (default 5)")
    parser.add_argument("--idle-exit", type=float, default=None, metavar="S",
                        help="--follow: stop after S seconds without a new record")
    parser.add_argument("--follow-for", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-report", action="store_true", help="skip the summary and report.html")
    parser.add_argument("--verbose", "-v", action="store_true", help="show Spark's own log lines and progress bars")
    return parser


def _failure(exc: BaseException) -> Optional[str]:
    """The message of an ingest failure to show without a traceback (None: a bug)."""
    from tools.ingest.parse import JetlogError
    from tools.ingest.pipeline import IngestError
    from tools.ingest.warehouse import WarehouseError

    if isinstance(exc, (IngestError, WarehouseError, JetlogError)):
        return str(exc)
    # An exception raised in a Python worker reaches the driver as a Spark exception
    # whose text holds the worker's traceback: its last line of ours is the message.
    import re

    missing = re.findall(r"(?:ModuleNotFoundError|ImportError): (.+)", str(exc))
    if missing and "Python worker" in str(exc):  # not the driver's own imports: those are bugs
        return (f"a Spark worker's Python cannot import what the jetlog source needs ({missing[-1]}); "
                f"the Python that PYSPARK_PYTHON (or spark.pyspark.python) names on every node needs numpy "
                f"and pyarrow (jet-ingest ships jet's own code): see 'Master and clusters' in "
                f"tools/ingest/README.md")
    found = re.findall(r"(?:tools\.ingest\.\w+\.)?(JetlogError|SegmentChanged|FileNotFoundError|IngestError|"
                       r"PermissionError|OSError): (.+)", str(exc))
    if found:
        kind, message = found[-1]
        return f"{message}" if kind in ("JetlogError", "SegmentChanged") else f"{kind}: {message}"
    return None


def _table_versions(warehouse: Path) -> dict[str, int]:
    """table -> its latest Delta version (-1: not created yet)."""
    from deltalake import DeltaTable

    from tools.ingest.warehouse import TABLES

    return {t: DeltaTable(str(warehouse / t)).version() if (warehouse / t / "_delta_log").exists() else -1
            for t in TABLES}


def table_changes(warehouse: Path, before: dict[str, int]) -> list[dict[str, int | str]]:
    """Per table that exists: ``table``, its ``version`` now, and the ``rows`` and
    ``files`` its ingest commits since the versions ``before`` (:func:`_table_versions`
    when this invocation started) added: what this run (every micro-batch of ``--follow``
    too) added. Compactions add no rows and are not counted."""
    from tools.ingest.warehouse import history

    now = _table_versions(warehouse)
    rows = {t: 0 for t in now}
    files = {t: 0 for t in now}
    if any(v >= 0 for v in now.values()):
        for c in history(warehouse):
            if c["version"] > before.get(c["table"], -1) and c["operation"] == "ingest":
                rows[c["table"]] += int(c["records"] or 0)
                files[c["table"]] += int(c["files_added"] or 0)
    return [{"table": t, "version": v, "rows": rows[t], "files": files[t]} for t, v in now.items() if v >= 0]


def _versions_line(changes: list[dict[str, int | str]]) -> str:
    """``changes`` (:func:`table_changes`) on one line, e.g. ``frames v7 (+1,200 rows,
    +3 files), requests v7 (+40 rows, +2 files), ...``."""
    if not changes:
        return "tables: none yet"
    return "tables: " + ", ".join(f"{c['table']} v{c['version']} (+{c['rows']:,} rows, +{c['files']} files)"
                                  for c in changes)


def _warehouse_args(command: str, description: str, argv: list[str],
                    options: Optional[Callable[[argparse.ArgumentParser], None]] = None) -> argparse.Namespace:
    """``argv`` of ``jet-ingest COMMAND [options] WAREHOUSE``, parsed (``--help`` shows
    ``description``; ``options`` adds the command's own)."""
    parser = argparse.ArgumentParser(prog=f"jet-ingest {command}", description=description)
    if options is not None:
        options(parser)
    parser.add_argument("warehouse", metavar="WAREHOUSE")
    return parser.parse_args(argv)


def history_main(argv: list[str]) -> int:
    """``jet-ingest history WAREHOUSE``: every commit of the warehouse's tables, with what
    each added; returns the exit status (2: not a warehouse)."""
    from tools.ingest.warehouse import WarehouseError
    from tools.ingest.warehouse import history

    args = _warehouse_args("history", "Every Delta Lake commit of a jet-ingest warehouse's tables, oldest first: "
                           "version, time, what it added and removed, and the log segments each run read "
                           "(path:offset reached); tables are versioned each on its own (Delta Lake).", argv)
    try:
        commits = history(Path(args.warehouse))
    except WarehouseError as exc:
        print(f"jet-ingest: {exc}")
        return 2
    for c in commits:
        records = "" if c["records"] is None else f" {c['records']:,} record(s)"
        files = f" files +{c['files_added'] or 0} -{c['files_removed'] or 0}" if c["files_added"] is not None else ""
        run = f" run {c['run']}" if c["run"] else ""
        print(f"{c['time']:%Y-%m-%d %H:%M:%S} {c['table']} v{c['version']} {c['operation']}{run}{records}{files}")
        for segment in c["segments"]:
            print(f"    {segment}")
        for column in c["columns"]:
            print(f"    + column {column}")
    if not commits:
        print("no commits yet")
    return 0


def migrate_main(argv: list[str]) -> int:
    """``jet-ingest migrate WAREHOUSE``: convert a warehouse of the snapshot layout to
    Delta Lake tables in place; returns the exit status (2: not such a warehouse)."""
    from tools.ingest.warehouse import WarehouseError
    from tools.ingest.warehouse import locked
    from tools.ingest.warehouse import migrate

    args = _warehouse_args("migrate", "Convert a warehouse written by a jet-ingest before Delta Lake (snapshot "
                           "directories and _manifest.json) in place: its current snapshot becomes version 1 of each "
                           "Delta table, its files moved, not rewritten. Safe to run again if it was interrupted.",
                           argv)
    root = Path(args.warehouse).resolve()
    try:
        if not os.path.lexists(root / "_jet_ingest" / "current"):
            _require_warehouse(root)  # (converted already) before the lock file is made
        with locked(root):
            files = migrate(root)
    except (WarehouseError, OSError) as exc:
        print(f"jet-ingest: {exc}")
        return 2
    print(f"{root}: converted to Delta Lake tables ({files} file(s))" if files else
          f"{root}: already Delta Lake tables")
    return 0


def _require_warehouse(root: Path) -> None:
    """Refuse ``root`` unless it holds a jet warehouse, before anything (the lock file)
    is created in it.

    Raises:
        WarehouseError: it does not (no progress table).
    """
    from tools.ingest.warehouse import WarehouseError

    if not (root / "_jet_ingest" / "progress" / "_delta_log").is_dir():
        raise WarehouseError(f"{root}: not a jet warehouse (nothing ingested yet?); nothing done")


VACUUM_RETENTION_HOURS = 168  # Delta Lake's default: a week of versions stays readable


def maintain_main(command: str, argv: list[str]) -> int:
    """``jet-ingest optimize|vacuum WAREHOUSE``; returns the exit status (2: not a
    warehouse, or another jet-ingest holds it)."""
    from tools.ingest.pipeline import compact
    from tools.ingest.warehouse import TABLES
    from tools.ingest.warehouse import Warehouse
    from tools.ingest.warehouse import WarehouseError
    from tools.ingest.warehouse import locked

    def retention(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--retention-hours", type=int, default=VACUUM_RETENTION_HOURS, metavar="H",
                            help=f"keep what versions of the last H hours need (default {VACUUM_RETENTION_HOURS})")

    if command == "optimize":
        args = _warehouse_args("optimize", "Compact the small files of every partition that has two or more into "
                               "larger ones, in commits that change no data (the replaced files stay for older "
                               "versions until vacuum).", argv)
    else:
        args = _warehouse_args("vacuum", "Delete the files no version of a table newer than the retention still "
                               "needs (files that compactions replaced). Versions older than the retention can no "
                               f"longer be read (time travel). Retention: {VACUUM_RETENTION_HOURS} hours (7 days, "
                               "Delta Lake's default) unless --retention-hours says otherwise.", argv, retention)
    root = Path(args.warehouse).resolve()
    try:
        _require_warehouse(root)
        with locked(root):
            m = Warehouse.load(root)
            m.recover()  # a killed run's decided commits first: their files are not garbage
            if command == "optimize":
                print(f"{root}: {compact(m, min_files=2)} file(s) compacted")
                return 0
            from deltalake import DeltaTable

            deleted = 0
            for table in TABLES:
                deleted += len(DeltaTable(str(root / table)).vacuum(
                    retention_hours=args.retention_hours, dry_run=False, enforce_retention_duration=False))
            print(f"{root}: {deleted} unreferenced file(s) deleted")
    except (WarehouseError, OSError) as exc:
        print(f"jet-ingest: {exc}")
        return 2
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``jet-ingest``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["optimize"], ["vacuum"]) and "--out" not in argv:
        return maintain_main(argv[0], argv[1:])
    if argv[:1] == ["history"] and "--out" not in argv:
        return history_main(argv[1:])
    if argv[:1] == ["migrate"] and "--out" not in argv:
        return migrate_main(argv[1:])
    args = _parser().parse_args(argv)
    console = Console()
    if not Path(args.logdir.split("*")[0] or ".").exists():
        console.print(f"[red]jet-ingest: no such log directory: {args.logdir}[/red]")
        return 2
    from contextlib import ExitStack

    from tools.ingest.warehouse import Warehouse
    from tools.ingest.warehouse import WarehouseError
    from tools.ingest.warehouse import locked

    started = time.monotonic()
    warehouse = Path(args.out).resolve()
    with ExitStack() as stack:
        try:
            warehouse.mkdir(parents=True, exist_ok=True)
            stack.enter_context(locked(warehouse))
            committed = Warehouse.load(warehouse)  # refuse a warehouse it cannot continue before starting Spark
            if not args.follow:
                # Decided from the headers and sizes against the progress table: no JVM.
                committed.recover()
                ranges, states = _plan(committed, args.logdir)
                if not _complete_live(ranges, states):
                    _record(committed, states)
                    report = warehouse / "report.html"
                    console.print("nothing new to ingest" + (f"; report: {report}" if report.exists() else ""))
                    return 0
        except (WarehouseError, OSError, json.JSONDecodeError) as exc:
            console.print(f"[red]jet-ingest: {exc}[/red]")
            return 2
        from tools.ingest.session import spark_session

        spark = spark_session(args.master, quiet=not args.verbose)
        try:
            return run(spark, args, console, started=started)
        except Exception as exc:
            message = _failure(exc)
            if message is None:
                raise
            hint = " (--mode FAILFAST)" if args.mode == "FAILFAST" else ""
            from rich.text import Text

            console.print(Text(f"jet-ingest: {message}", style="red"), soft_wrap=True)
            console.print(f"[red]jet-ingest: failed{hint}; nothing of this run was committed[/red]", highlight=False)
            return 1
        finally:
            spark.stop()


def run(spark: Any, args: argparse.Namespace, console: Console, *, started: Optional[float] = None) -> int:
    """What ``jet-ingest`` does with a SparkSession (``main`` creates and stops it, and
    holds the warehouse's lock around it)."""
    from tools.ingest.warehouse import Warehouse

    started = time.monotonic() if started is None else started
    warehouse = Path(args.out).resolve()
    warehouse.mkdir(parents=True, exist_ok=True)
    before = _table_versions(warehouse)
    added = ingest_once(spark, args.logdir, warehouse, since_ns=args.since, console=console, mode=args.mode)
    if args.follow:
        added += _follow(spark, args, console)
    changes = table_changes(warehouse, before)
    console.print(_versions_line(changes), highlight=False)
    if not Warehouse.load(warehouse).rows("frames"):
        console.print("no records ingested yet")
        return 0
    tables = load_tables(spark, warehouse)
    console.print(f"added {added:,} record(s) in {time.monotonic() - started:.1f} s")
    if not args.no_report:
        from tools.ingest.report import collect_summary
        from tools.ingest.report import print_summary
        from tools.ingest.report import write_report
        from tools.ingest.warehouse import history_notes

        history = list(history_notes(Warehouse.load(warehouse).files.values()).values())
        summary = collect_summary(tables, source=args.logdir, history=history, versions=changes)
        print_summary(summary, console)
        write_report(summary, warehouse / "report.html")
        console.print(f"report: {warehouse / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
