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
import json
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Optional

from rich.console import Console

__all__ = ["commit_micro_batch", "ingest_once", "load_tables", "main"]


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
    """Shows "files done/total" while Spark tasks run (one task per file or chunk)."""

    def __init__(self, spark: Any, console: Console, files: int, tasks: int) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.console = console
        self.files = files
        self.tasks = max(tasks, 1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Progress:
        if self.console.is_terminal or self.files:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)
        if not exc[0]:
            self.console.print(f"files done {self.files}/{self.files}")

    def _run(self) -> None:
        last = -1
        while not self._stop.wait(1.0):
            done = 0
            for stage_id in self.tracker.getActiveStageIds():
                info = self.tracker.getStageInfo(stage_id)
                if info is not None and info.numTasks == self.tasks:
                    done = max(done, info.numCompletedTasks)
            files_done = done * self.files // self.tasks
            if files_done != last:
                self.console.print(f"files done {files_done}/{self.files}")
                last = files_done


def _plan(manifest: Any, logdir: str) -> tuple[list[tuple[str, int, int]], dict[str, Any]]:
    """Byte ranges still to ingest per file, and the file states to record."""
    from tools.ingest.parse import JetlogError, infer_runs, read_file_header
    from tools.ingest.source import expand_paths
    from tools.ingest.warehouse import FileState, header_identity

    files = expand_paths({"path": logdir})
    idents = {f: header_identity(f) for f in files}
    # Runs (JETLOG.md 2): the header's run_ns, or inferred from the headers for version 1.
    headers = {}
    for f in files:
        try:
            headers[f] = read_file_header(f)
        except (OSError, JetlogError):
            headers[f] = None

    def known_run(f: str, header: Any) -> Optional[int]:
        known = manifest.files.get(f)
        return known.run_ns if known is not None and known.created_ns == header.created_ns else None

    run_of = infer_runs(headers, known_run)
    ranges: list[tuple[str, int, int]] = []
    states: dict[str, Any] = {}
    for f, ident in idents.items():
        size = Path(f).stat().st_size
        known = manifest.files.get(f)
        if ident is None:
            if known is None and not _header_incomplete(f):
                ranges.append((f, 0, size))  # a bad header: reported once as a corrupt row
                states[f] = FileState(0, "", 0, 0, 0, size)
            continue
        crc, daemon, created, segment, header_size = ident
        start = known.done if known is not None and known.header_crc == crc else 0
        states[f] = FileState(crc, daemon, created, segment, run_of[f], max(start, header_size))
        if size > max(start, header_size):
            ranges.append((f, start, size))
    return ranges, states


def _header_incomplete(path: str) -> bool:
    from tools.ingest.parse import JetlogError, read_header

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

    out = df.withColumn("run_ns", _per_file({f: s.run_ns for f, s in states.items()}).cast("long"))
    if since_ns is not None:
        out = out.filter(F.col("ts_ns").isNull() | (F.col("ts_ns") >= F.lit(since_ns)))
    return out


def _resume_offsets(ranges: list[tuple[str, int, int]], chunk: int) -> dict[str, int]:
    """Each range's resume offset, as the reader's last chunk of it ends (no Spark job)."""
    from tools.ingest.parse import JetlogError, resume_offset

    out = {}
    for path, start, limit in ranges:
        try:
            out[path] = resume_offset(path, start, limit, chunk)
        except JetlogError:
            out[path] = limit  # a bad header: reported once as a row, never read again
        except FileNotFoundError:
            out[path] = start  # rotated away since planning: the reader found nothing either
    return out


def ingest_once(spark: Any, logdir: str, warehouse: Path, *, since_ns: Optional[int] = None,
                console: Optional[Console] = None, mode: str = "PERMISSIVE") -> int:
    """Ingest what is new in ``logdir`` into every table of ``warehouse``; returns the
    records added (:mod:`tools.ingest.pipeline`)."""
    from tools.ingest.pipeline import TaskSpec, commit, run_task
    from tools.ingest.source import DEFAULT_CHUNK, plan_ranges
    from tools.ingest.warehouse import Manifest, new_run_id

    console = console or Console(stderr=True)
    manifest = Manifest.load(warehouse)
    removed = manifest.remove_uncommitted()
    if removed:
        console.print(f"removed {removed} file(s) of an ingest run that never committed")
    ranges, states = _plan(manifest, logdir)
    if not ranges:
        manifest.files.update(states)
        manifest.save()
        console.print("nothing new to ingest")
        return 0
    parts = plan_ranges(ranges, DEFAULT_CHUNK, 0)
    console.print(f"ingesting {len(ranges)} file(s), {sum(lim - s for _, s, lim in ranges):,} bytes")
    run_id = new_run_id()
    staging = manifest.root / "_jet_ingest" / "staging" / run_id
    spec = TaskSpec(str(staging), {f: s.run_ns for f, s in states.items()}, since_ns, mode)
    ends: dict[str, int] = {}
    # Where each file's next read resumes is computed while the tasks run.
    worker = threading.Thread(target=lambda: ends.update(_resume_offsets(ranges, DEFAULT_CHUNK)), daemon=True)
    worker.start()
    try:
        with _Progress(spark, console, len(ranges), len(parts)):
            rows = int(sum(spark.sparkContext.parallelize(list(enumerate(parts)), len(parts))
                       .map(lambda task: run_task(task[0], task[1], spec)).collect()))
    finally:
        worker.join()
    if len(ends) < len(ranges):
        raise RuntimeError("jet-ingest: could not compute where each file's next read resumes")
    for path, end in ends.items():
        states[path].done = max(states[path].done, end)
    commit(manifest, staging, run_id, states)
    return rows


def load_tables(spark: Any, warehouse: Path) -> dict[str, Any]:
    """Every table of ``warehouse`` as a DataFrame (``frames`` and the derived ones)."""
    from tools.ingest.derive import CONNECTIONS_SCHEMA, REQUESTS_SCHEMA, STATE_CHANGES_SCHEMA, TRAFFIC_SCHEMA
    from tools.ingest.pipeline import FRAMES_SCHEMA, spark_ddl

    if not (warehouse / "frames").exists():
        raise FileNotFoundError(f"{warehouse / 'frames'}: nothing ingested yet")
    out = {}
    for name, schema in (("frames", FRAMES_SCHEMA), ("state_changes", STATE_CHANGES_SCHEMA),
                         ("requests", REQUESTS_SCHEMA), ("connections", CONNECTIONS_SCHEMA),
                         ("traffic", TRAFFIC_SCHEMA)):
        (warehouse / name).mkdir(exist_ok=True)
        out[name] = spark.read.schema(spark_ddl(schema)).parquet(str(warehouse / name))
    return out


def commit_micro_batch(manifest: Any, listed: dict[str, Any], settled: list[dict[str, Any]], staging: Path,
                       run_id: str) -> int:
    """Commit a ``--follow`` micro-batch whose tasks (:func:`tools.ingest.pipeline.follow_task`)
    left ``staging`` and reported ``settled`` (file, end, rows); returns its rows.

    Only files the warehouse holds already, or that the batch read, are recorded: a
    segment ``listed`` now that the stream has not read yet (jetd restarted after the
    micro-batch was planned) would end its daemon's previous run, whose last records
    may not be read yet either.
    """
    from tools.ingest.pipeline import commit

    read = {r["file"] for r in settled if r["rows"]}
    states = {f: s for f, s in listed.items() if f in manifest.files or f in read}
    for r in settled:
        state = states.get(r["file"])
        if state is not None:
            end = Path(r["file"]).stat().st_size if r["end"] < 0 else r["end"]
            state.done = max(state.done, end)
    rows = sum(int(r["rows"]) for r in settled)
    if rows:
        commit(manifest, staging, run_id, states)
    else:
        manifest.files.update(states)
        manifest.save()
    return rows


def _follow(spark: Any, args: argparse.Namespace, console: Console) -> None:
    """Keep ingesting with the streaming reader until interrupted, or until no new
    record arrived for ``--idle-exit`` seconds."""
    from pyspark.sql import functions as F

    from tools.ingest.warehouse import Manifest, new_run_id

    warehouse = Path(args.out)
    manifest = Manifest.load(warehouse)
    manifest.remove_uncommitted()
    starting = {f: s.done for f, s in manifest.files.items()}
    last_rows = [time.monotonic()]
    # Held while a micro-batch commits, so stopping never cuts one in half.
    committing = threading.Lock()

    def batch(df: Any, batch_id: int) -> None:
        from tools.ingest.pipeline import follow_task

        with committing:
            m = Manifest.load(warehouse)
            _, states = _plan(m, args.logdir)
            # The manifest is the truth: rows it already holds (from a batch run, or a
            # micro-batch replayed after a crash) are filtered out.
            done = _per_file({f: s.done for f, s in m.files.items()})
            fresh = _frames_df(df.filter(F.col("offset") >= F.coalesce(done, F.lit(0))), states, args.since)
            run_id = new_run_id()
            staging = m.root / "_jet_ingest" / "staging" / run_id
            settled = fresh.mapInArrow(lambda it: follow_task(it, str(staging), batch_id),
                                       "file string, `end` long, rows long").collect()
            rows = commit_micro_batch(m, states, [r.asDict() for r in settled], staging, run_id)
            if rows:
                last_rows[0] = time.monotonic()
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
            if args.idle_exit is None or now - last_rows[0] < args.idle_exit:
                continue
            # Not while a micro-batch is being planned or committed: it may hold records.
            if not committing.locked() and not query.status.get("isTriggerActive", False):
                console.print(f"no new records for {args.idle_exit:g} s: stopping")
                break
    except KeyboardInterrupt:
        pass
    finally:
        with committing:
            query.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jet-ingest", description=__doc__.split("\n\n")[0])
    parser.add_argument("logdir", help="jetd log directory (or a segment file or glob)")
    parser.add_argument("--out", required=True, help="warehouse directory (created if missing)")
    parser.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    parser.add_argument("--since", type=_parse_since, help="skip records before this time (ISO 8601 or epoch s)")
    parser.add_argument("--follow", action="store_true", help="keep ingesting new records (streaming reader)")
    parser.add_argument("--interval", type=float, default=5.0, help="--follow: seconds between micro-batches")
    parser.add_argument("--idle-exit", type=float, default=None, metavar="S",
                        help="--follow: stop after S seconds without a new record")
    parser.add_argument("--follow-for", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="PERMISSIVE", choices=["PERMISSIVE", "DROPMALFORMED", "FAILFAST"])
    parser.add_argument("--no-report", action="store_true", help="skip the summary and report.html")
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point of ``jet-ingest``; returns the exit status."""
    args = _parser().parse_args(argv)
    console = Console()
    if not Path(args.logdir.split("*")[0] or ".").exists():
        console.print(f"[red]jet-ingest: no such log directory: {args.logdir}[/red]")
        return 2
    from contextlib import ExitStack

    from tools.ingest.warehouse import Manifest, WarehouseError, locked

    warehouse = Path(args.out).resolve()
    with ExitStack() as stack:
        try:
            warehouse.mkdir(parents=True, exist_ok=True)
            stack.enter_context(locked(warehouse))
            Manifest.load(warehouse)  # refuse a warehouse it cannot continue before starting Spark
        except (WarehouseError, OSError, json.JSONDecodeError) as exc:
            console.print(f"[red]jet-ingest: {exc}[/red]")
            return 2
        from tools.ingest.session import spark_session

        started = time.monotonic()
        spark = spark_session(args.master)
        try:
            return run(spark, args, console, started=started)
        finally:
            spark.stop()


def run(spark: Any, args: argparse.Namespace, console: Console, *, started: Optional[float] = None) -> int:
    """What ``jet-ingest`` does with a SparkSession (``main`` creates and stops it, and
    holds the warehouse's lock around it)."""
    started = time.monotonic() if started is None else started
    warehouse = Path(args.out).resolve()
    warehouse.mkdir(parents=True, exist_ok=True)
    added = ingest_once(spark, args.logdir, warehouse, since_ns=args.since, console=console, mode=args.mode)
    if args.follow:
        _follow(spark, args, console)
    if not (warehouse / "frames").exists():
        console.print("no records ingested yet")
        return 0
    tables = load_tables(spark, warehouse)
    console.print(f"added {added:,} record(s) in {time.monotonic() - started:.1f} s")
    if not args.no_report:
        from tools.ingest.report import collect_summary, print_summary, write_report

        summary = collect_summary(tables)
        print_summary(summary, console)
        write_report(summary, warehouse / "report.html")
        console.print(f"report: {warehouse / 'report.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
