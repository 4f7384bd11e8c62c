"""One ingest run of ``jet-ingest``: Spark tasks parse and settle, the driver merges and commits.

Each Spark task takes byte ranges of segment files (as the ``jetlog`` source plans its
partitions), parses them with :mod:`tools.ingest.parse` and, per range, writes into the
run's staging directory:

- the ``frames`` rows, their ``traffic`` rollup, and the ``requests`` rows the range settles alone
  (:func:`tools.ingest.derive.piece`), partitioned by date as Spark lays them out;
- what it leaves for the driver: loose exchange rows, state-change candidates and
  connection counters.

The driver then merges those with what the previous run carried
(:func:`tools.ingest.derive.merge`), writes the rest, and commits (see
:mod:`tools.ingest.warehouse`). One pass over the records builds every table, and
a run costs what is new, not all history.

Why not ``spark.read.format("jetlog")...write``: a DataFrame read has one output; this
pass has five. The source and this pipeline share the parser and the partition plan.
Files are written with pyarrow by the tasks, so the warehouse must be a filesystem
path every executor can write (as before); a retried task rewrites the same names.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tools.ingest import derive
from tools.ingest.parse import ARROW_SCHEMA
from tools.ingest.parse import FRAMES_SCHEMA

__all__ = ["FRAMES_SCHEMA", "IngestError", "TaskSpec", "check_reports", "commit", "compact", "follow_task", "run_task",
           "spark_ddl"]


@dataclass(frozen=True)
class TaskSpec:
    """What every task of a run needs (pickled to the executors)."""

    staging: str
    runs: dict[str, int]  # file -> run_ns
    since_ns: Optional[int] = None
    mode: str = "PERMISSIVE"
    resume: dict[str, int] = field(default_factory=dict)  # file -> the offset its range starts at
    # file -> what the driver saw of it (tools.ingest.parse.PlannedSegment), checked by each task
    planned: dict[str, Any] = field(default_factory=dict)


def spark_ddl(schema: pa.Schema) -> str:
    """``schema`` as a Spark DDL string (plus the ``date`` partition column)."""
    names = {pa.int64(): "long", pa.string(): "string", pa.binary(): "binary", pa.bool_(): "boolean",
             pa.float64(): "double", pa.timestamp("us", tz="UTC"): "timestamp"}
    return ", ".join([f"{f.name} {names[f.type]}" for f in schema] + ["date date"])


def _rows_of(table: pa.Table, spec: TaskSpec) -> pa.Table:
    """Records of one range as frames rows: ``run_ns`` added, ``--since`` applied."""
    files = table.column("file")
    names = pc.unique(files)
    runs = pa.array([spec.runs.get(f) for f in names.to_pylist()], pa.int64())
    run = runs.take(pc.index_in(files, value_set=names))
    table = table.append_column("run_ns", run)
    if spec.since_ns is not None:
        ts = table.column("ts_ns")
        table = table.filter(pc.or_(pc.is_null(ts), pc.greater_equal(ts, pa.scalar(spec.since_ns, pa.int64()))))
    return table


def _settle(table: pa.Table, staging: Path, name: str, written: Optional[dict[str, dict[str, int]]] = None) -> int:
    """Write one range's frames and what it settles; returns its rows. ``written``, if
    given, receives {table: {file relative to ``staging/<table>``: rows}}."""
    if not table.num_rows:
        return 0
    out = written if written is not None else {}

    def into(name_: str) -> dict[str, int]:
        return out.setdefault(name_, {})

    table = table.select(FRAMES_SCHEMA.names).cast(FRAMES_SCHEMA)
    derive.write_partitioned(table, table.column("ts_ns"), staging / "frames", f"{name}.parquet", into("frames"))
    part = derive.piece(derive.with_seq(table))
    derive.write_partitioned(part.requests, part.requests.column("ts_ns"), staging / "requests", f"{name}.parquet",
                             into("requests"))
    seconds_ns = pc.multiply(pc.cast(part.traffic.column("second"), pa.int64()), 1000)
    derive.write_partitioned(part.traffic, seconds_ns, staging / "traffic", f"{name}.parquet", into("traffic"))
    for what, rows in (("loose", part.loose), ("candidates", part.candidates), ("conns", part.conns)):
        if rows.num_rows:
            derive.write_file(rows, staging / "_parts" / what / f"{name}.parquet")
            into(f"_parts/{what}")[f"{name}.parquet"] = rows.num_rows
    return int(table.num_rows)


def planned_gzip(path: str, spec: TaskSpec) -> bool:
    """``path`` was planned as a gzip-compressed segment (read whole)."""
    planned = spec.planned.get(path)
    if planned is not None:
        return bool(planned.size is None)
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def run_task(index: int, ranges: list[tuple[str, int, Optional[int], int]], spec: TaskSpec) -> dict[str, Any]:
    """A batch task: parse ``ranges`` and settle each. Returns its report for the
    driver's checks (:func:`check_reports`): ``task``, ``rows`` written, ``files``
    ({table: {file: rows}} as :func:`_settle` gives), ``missing``: the ranges whose
    file this task could not open, and ``verified``: [file, start, limit] of each range
    read after checking that the file is the one the driver planned (``spec.planned``).

    Raises:
        SegmentChanged: a file is shorter than planned, another segment, or lacks the
            last planned record (the executor sees another copy, or it was replaced).
        JetlogError: damage, in FAILFAST mode.
    """
    from tools.ingest.parse import check_segment
    from tools.ingest.parse import read_segment

    rows = 0
    files: dict[str, dict[str, int]] = {}
    missing: list[str] = []
    verified: list[tuple[str, int, int]] = []
    for i, (path, start, stop, limit) in enumerate(ranges):
        try:
            if path in spec.planned:
                check_segment(path, spec.planned[path])
            # A range's first chunk starts exactly where the progress table says the last run
            # ended (a record boundary, or a record cut short that is now final); a
            # truncated record is reported as a row (the live segment's cut tail is not
            # planned at all: cli._complete_live).
            # A gzip-compressed segment is read whole: its planned limit is the size of
            # the compressed file, not of the segment (capping the decompressed bytes at
            # it dropped the rest silently).
            whole = planned_gzip(path, spec)
            batches = list(read_segment(path, start, stop, mode=spec.mode, limit=None if whole else limit,
                                        exact_start=spec.resume.get(path) == start, truncated_row=True))
        except FileNotFoundError:
            # Rotated away since planning, or never visible here (an executor that does
            # not mount the log directory): only the driver can tell which.
            missing.append(path)
            continue
        if path in spec.planned:
            verified.append((path, start, limit))
        table = pa.Table.from_batches(batches, ARROW_SCHEMA)
        rows += _settle(_rows_of(table, spec), Path(spec.staging), f"part-{index:05d}-{i:04d}", files)
        del batches, table
    return {"task": index, "rows": rows, "files": files, "missing": missing, "verified": verified}


class IngestError(RuntimeError):
    """What the tasks report does not add up to what the driver can commit (says why)."""


def check_reports(staging: Path, reports: list[dict[str, Any]], tasks: int,
                  parts: Optional[list[list[Any]]] = None) -> dict[str, dict[str, int]]:
    """Check, before anything is committed, that every task reported, that the files the
    tasks could not open are really gone (rotated away) and were not read in part by
    other tasks (``parts``: each task's ranges), and that every file the tasks wrote is
    in ``staging`` as the driver sees it, with the rows they reported. Returns the
    staged files and their rows ({table: {file: rows}}).

    Raises:
        IngestError: a file the driver sees was unreadable on an executor (the log
            directory is not visible there), a file vanished while it was being read,
            or a staged file is missing or holds other rows (the warehouse is not the
            same path on the executors).
    """
    import pyarrow.parquet as pq

    if sorted(r["task"] for r in reports) != list(range(tasks)):
        raise IngestError(f"expected reports from {tasks} task(s), got {len(reports)}")
    missing = {p for r in reports for p in r["missing"]}
    unseen = sorted(p for p in missing if os.path.exists(p))
    if unseen:
        raise IngestError(
            f"the Spark executors could not open {len(unseen)} log file(s) the driver sees (first: {unseen[0]}): "
            "the log directory must be visible at the same path on every executor (a shared mount)")
    if parts is not None:
        # A segment renamed away mid-run, read by some tasks: the next run would find it
        # under its new name, resume where the progress table says, and read those rows again.
        read = {rng[0] for r in reports for rng in parts[r["task"]] if rng[0] not in r["missing"]}
        torn = sorted(missing & read)
        if torn:
            raise IngestError(f"{torn[0]} vanished while it was being read (rotated during the run?): "
                              "run jet-ingest again")
    staged: dict[str, dict[str, int]] = {}
    lost: list[str] = []
    for r in reports:
        for table, files in r["files"].items():
            for rel, rows in files.items():
                path = staging / table / rel
                try:
                    have = pq.read_metadata(path).num_rows
                except (OSError, ValueError):
                    lost.append(str(path))
                    continue
                if have != rows:
                    raise IngestError(f"{path}: {have} rows, but its task wrote {rows}")
                staged.setdefault(table, {})[rel] = rows
    if lost:
        raise IngestError(
            f"{len(lost)} file(s) the Spark executors wrote are not in the warehouse as the driver sees it "
            f"(first: {lost[0]}): the warehouse must be a path every executor and the driver share")
    written = sum(staged.get("frames", {}).values())
    reported = sum(int(r["rows"]) for r in reports)
    if written != reported:
        raise IngestError(f"the tasks reported {reported} records, but {written} are staged")
    return staged


def follow_task(batches: Iterator[pa.RecordBatch], staging: str, batch_id: int) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` over a streaming micro-batch's frames rows (``run_ns`` added):
    settle each file's rows (each a contiguous range); yields (file, end, rows,
    written) where ``end`` is the offset after the file's last record here and
    ``written`` the files it staged (JSON, as :func:`_settle` reports them)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    task = ctx.partitionId() if ctx is not None else 0
    received = list(batches)
    table = pa.Table.from_batches(received) if received else FRAMES_SCHEMA.empty_table()
    out: dict[str, tuple[int, int, str]] = {}
    if table.num_rows:
        table = table.select(FRAMES_SCHEMA.names).cast(FRAMES_SCHEMA)
        files = table.column("file")
        for j, f in enumerate(pc.unique(files).to_pylist()):
            rows = table.filter(pc.equal(files, f))
            written: dict[str, dict[str, int]] = {}
            n = _settle(rows, Path(staging), f"batch-{batch_id}-{task:05d}-{j:04d}", written)
            out[f] = (_end(rows), n, json.dumps(written))
    yield pa.RecordBatch.from_pydict({
        "file": pa.array(list(out), pa.string()),
        "end": pa.array([v[0] for v in out.values()], pa.int64()),
        "rows": pa.array([v[1] for v in out.values()], pa.int64()),
        "written": pa.array([v[2] for v in out.values()], pa.string()),
    })


def _end(rows: pa.Table) -> int:
    """The offset after the last record or damaged region among ``rows``: a record ends
    10 + 13 + size bytes after its start (JETLOG.md 3); a CORRUPT row covers [offset,
    offset + size); a TRUNCATED record is read again, so it ends at its offset. A bad
    segment header: -1 (the whole file is done)."""
    from tools.ingest.parse import CORRUPT
    from tools.ingest.parse import TRUNCATED

    if pc.any(pc.starts_with(pc.fill_null(rows.column("corrupt"), ""), "bad segment header")).as_py():
        return -1
    offset, size = (np.asarray(pc.fill_null(rows.column(c), 0).to_numpy(), dtype=np.int64) for c in ("offset", "size"))
    kind = rows.column("kind")
    record = ~_flag(pc.is_in(kind, value_set=pa.array([CORRUPT, TRUNCATED])))
    truncated = _flag(pc.equal(kind, TRUNCATED))
    return int(np.max(np.where(truncated, offset, offset + size + np.where(record, 23, 0))))


def _flag(arr: Any) -> np.ndarray:
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)


def _read_parts(directory: Path, schema: pa.Schema) -> list[pa.Table]:
    if not directory.exists():
        return []
    return [pq.read_table(f, schema=schema) for f in sorted(directory.glob("*.parquet"))]


def commit(committed: Any, staging: Path, run_id: str, states: dict[str, Any],
           staged_rows: Optional[dict[str, dict[str, int]]] = None) -> int:
    """Merge what the tasks left in ``staging`` with the carry, write the rest, and
    commit it all as the warehouse's next run (:meth:`Warehouse.publish
    <tools.ingest.warehouse.Warehouse.publish>`: decided in one atomic step, then one
    Delta commit per table); deletes ``staging``.
    ``staged_rows``: the tasks' files as :func:`check_reports` checked them. Returns
    derived rows added.

    Crash points (:func:`tools.ingest.warehouse.crash_point`): ``staged``, ``merged``,
    then those of ``publish``.
    """
    from tools.ingest.warehouse import crash_point

    crash_point("staged")
    carry = derive.Carry.load(committed.carry_dir) if committed.carry_dir else derive.Carry.empty()
    parts = staging / "_parts"
    files = dict(committed.files)
    files.update(states)
    latest: dict[str, int] = {}
    for s in files.values():
        if s.daemon:
            latest[s.daemon] = max(latest.get(s.daemon, s.run_ns), s.run_ns)
    merged = derive.merge(carry, _read_parts(parts / "loose", derive.VIEW_SCHEMA),
                          _read_parts(parts / "candidates", derive.CANDIDATE_SCHEMA),
                          _read_parts(parts / "conns", derive.CONN_SCHEMA), set(latest.values()))
    derive.write_partitioned(merged.requests, merged.requests.column("ts_ns"), staging / "requests", "merged.parquet")
    from tools.ingest.warehouse import history_notes

    # A run whose history is partial says so on each of its rows (issue 27).
    notes = history_notes(files.values())
    changes = derive.with_history(merged.state_changes, notes)
    derive.write_partitioned(changes, changes.column("ts_ns"), staging / "state_changes", "merged.parquet")
    snap = staging / "_snapshot"
    for where, conns in ((staging, merged.connections), (snap, merged.open_connections)):
        conns = derive.with_history(conns, notes)
        opened = pc.multiply(pc.cast(conns.column("opened"), pa.int64()), 1000)
        derive.write_partitioned(conns, opened, where / "connections", "merged.parquet")
    derive.write_partitioned(merged.pending, merged.pending.column("ts_ns"), snap / "requests", "pending.parquet")
    merged.carry.save(staging / "_carry")
    crash_point("merged")
    committed.publish([(staging, "run"), (snap, "snap")], run_id, states, added_rows=staged_rows,
                     carry=staging / "_carry", drop=_replaced_by_snapshot)
    shutil.rmtree(staging, ignore_errors=True)
    return int(merged.requests.num_rows + merged.state_changes.num_rows)


def _replaced_by_snapshot(table: str, rel: str) -> bool:
    """The files (requests still open, open connections) that every run replaces
    with its own."""
    return table in ("requests", "connections") and Path(rel).name.startswith("snap-")


COMPACT_MIN_FILES = 8  # a partition with this many small files is compacted
COMPACT_SMALL = 16 << 20  # bytes: a file smaller than this is small
COMPACT_TARGET = 128 << 20  # bytes: the most one compacted file gathers


def compact(committed: Any, *, min_files: int = COMPACT_MIN_FILES, small: int = COMPACT_SMALL,
            target: int = COMPACT_TARGET) -> int:
    """Rewrite the small files of every partition that has at least ``min_files`` of
    them into a few larger ones, committed on their own with no data change (``--follow``
    writes a few files per micro-batch). Returns the number of files it replaced.

    Crash points: ``compact-staged``, then ``publish``'s prefixed ``compact-``.

    Raises:
        IngestError: a rewritten file would not hold exactly the rows it replaces.
    """
    from tools.ingest.warehouse import crash_point
    from tools.ingest.warehouse import new_run_id

    if not committed.tables:
        return 0
    run_id = new_run_id()
    staging = committed.meta / "staging" / run_id
    doomed: dict[str, set[str]] = {}
    for table, files in committed.tables.items():
        by_part: dict[str, list[tuple[str, int]]] = {}
        for rel in files:
            if Path(rel).name.startswith("snap-"):
                continue  # replaced by every commit anyway
            size = (committed.root / table / rel).stat().st_size
            if size < small:
                by_part.setdefault(str(Path(rel).parent), []).append((rel, size))
        for part, found in sorted(by_part.items()):
            if len(found) < min_files:
                continue
            bins: list[list[str]] = [[]]
            total = 0
            for rel, size in found:
                if bins[-1] and total + size > target:
                    bins.append([])
                    total = 0
                bins[-1].append(rel)
                total += size
            for k, group in enumerate(b for b in bins if len(b) > 1):
                merged = pa.concat_tables([pq.ParquetFile(committed.root / table / rel).read() for rel in group],
                                         promote_options="default")  # files from before a column was added
                if merged.num_rows != sum(files[rel] for rel in group):
                    raise IngestError(f"compacting {table}/{part}: {merged.num_rows} rows read, "
                                      f"{sum(files[rel] for rel in group)} committed")
                derive.write_file(merged, staging / table / part / f"{k:04d}.parquet")
                doomed.setdefault(table, set()).update(group)
    if not doomed:
        return 0
    crash_point("compact-staged")
    committed.publish([(staging, "compact")], run_id, {}, drop=lambda table, rel: rel in doomed.get(table, ()),
                     point="compact-")
    shutil.rmtree(staging, ignore_errors=True)
    return sum(len(v) for v in doomed.values())
