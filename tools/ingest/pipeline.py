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

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tools.ingest import derive
from tools.ingest.parse import ARROW_SCHEMA

__all__ = ["FRAMES_SCHEMA", "TaskSpec", "commit", "follow_task", "run_task", "spark_ddl"]

FRAMES_SCHEMA = ARROW_SCHEMA.append(pa.field("run_ns", pa.int64()))


@dataclass(frozen=True)
class TaskSpec:
    """What every task of a run needs (pickled to the executors)."""

    staging: str
    runs: dict[str, int]  # file -> run_ns
    since_ns: Optional[int] = None
    mode: str = "PERMISSIVE"


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


def _settle(table: pa.Table, staging: Path, name: str) -> int:
    """Write one range's frames and what it settles; returns its rows."""
    if not table.num_rows:
        return 0
    table = table.select(FRAMES_SCHEMA.names).cast(FRAMES_SCHEMA)
    derive.write_partitioned(table, table.column("ts_ns"), staging / "frames", f"{name}.parquet")
    part = derive.piece(derive.with_seq(table))
    derive.write_partitioned(part.requests, part.requests.column("ts_ns"), staging / "requests", f"{name}.parquet")
    seconds_ns = pc.multiply(pc.cast(part.traffic.column("second"), pa.int64()), 1000)
    derive.write_partitioned(part.traffic, seconds_ns, staging / "traffic", f"{name}.parquet")
    for what, rows in (("loose", part.loose), ("candidates", part.candidates), ("conns", part.conns)):
        if rows.num_rows:
            derive.write_file(rows, staging / "_parts" / what / f"{name}.parquet")
    return int(table.num_rows)


def run_task(index: int, ranges: list[tuple[str, int, Optional[int], int]], spec: TaskSpec) -> int:
    """A batch task: parse ``ranges`` and settle each; returns the rows written."""
    from tools.ingest.parse import read_segment

    rows = 0
    for i, (path, start, stop, limit) in enumerate(ranges):
        try:
            batches = list(read_segment(path, start, stop, mode=spec.mode, limit=limit))
        except FileNotFoundError:
            if spec.mode.upper() == "FAILFAST":
                raise
            continue  # rotated away since planning: nothing left to read
        table = pa.Table.from_batches(batches, ARROW_SCHEMA)
        rows += _settle(_rows_of(table, spec), Path(spec.staging), f"part-{index:05d}-{i:04d}")
        del batches, table
    return rows


def follow_task(batches: Iterator[pa.RecordBatch], staging: str, batch_id: int) -> Iterator[pa.RecordBatch]:
    """``mapInArrow`` over a streaming micro-batch's frames rows (``run_ns`` added):
    settle each file's rows (each a contiguous range); yields (file, end, rows) where
    ``end`` is the offset after the file's last record here."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    task = ctx.partitionId() if ctx is not None else 0
    received = list(batches)
    table = pa.Table.from_batches(received) if received else FRAMES_SCHEMA.empty_table()
    out: dict[str, list[int]] = {}
    if table.num_rows:
        table = table.select(FRAMES_SCHEMA.names).cast(FRAMES_SCHEMA)
        files = table.column("file")
        for j, f in enumerate(pc.unique(files).to_pylist()):
            rows = table.filter(pc.equal(files, f))
            n = _settle(rows, Path(staging), f"batch-{batch_id}-{task:05d}-{j:04d}")
            out[f] = [_end(rows), n]
    yield pa.RecordBatch.from_pydict({
        "file": pa.array(list(out), pa.string()),
        "end": pa.array([v[0] for v in out.values()], pa.int64()),
        "rows": pa.array([v[1] for v in out.values()], pa.int64()),
    })


def _end(rows: pa.Table) -> int:
    """The offset after the last record or damaged region among ``rows``: a record ends
    10 + 13 + size bytes after its start (JETLOG.md 3); a damage row covers
    [offset, offset + size). A bad segment header: -1 (the whole file is done)."""
    if pc.any(pc.starts_with(pc.fill_null(rows.column("corrupt"), ""), "bad segment header")).as_py():
        return -1
    offset, size = (np.asarray(pc.fill_null(rows.column(c), 0).to_numpy(), dtype=np.int64) for c in ("offset", "size"))
    record = np.asarray(pc.is_valid(rows.column("kind")).to_numpy(zero_copy_only=False), dtype=bool)
    return int(np.max(offset + size + np.where(record, 23, 0)))


def _read_parts(directory: Path, schema: pa.Schema) -> list[pa.Table]:
    if not directory.exists():
        return []
    return [pq.read_table(f, schema=schema) for f in sorted(directory.glob("*.parquet"))]


def commit(manifest: Any, staging: Path, run_id: str, states: dict[str, Any]) -> int:
    """Merge what the tasks left in ``staging`` with the carry, move every file into the
    warehouse under run ``run_id``, commit the manifest and delete ``staging``. Returns
    derived rows added."""
    from tools.ingest.warehouse import move_staged

    root = manifest.root
    carry_dir = root / "_jet_ingest" / "carry"
    carry = derive.Carry.load(carry_dir / manifest.carry) if manifest.carry else derive.Carry.empty()
    parts = staging / "_parts"
    files = dict(manifest.files)
    files.update(states)
    latest: dict[str, int] = {}
    for s in files.values():
        if s.daemon:
            latest[s.daemon] = max(latest.get(s.daemon, s.run_ns), s.run_ns)
    merged = derive.merge(carry, _read_parts(parts / "loose", derive.VIEW_SCHEMA),
                          _read_parts(parts / "candidates", derive.CANDIDATE_SCHEMA),
                          _read_parts(parts / "conns", derive.CONN_SCHEMA), set(latest.values()))
    derive.write_partitioned(merged.requests, merged.requests.column("ts_ns"), staging / "requests", "merged.parquet")
    derive.write_partitioned(merged.state_changes, merged.state_changes.column("ts_ns"), staging / "state_changes",
                             "merged.parquet")
    for name, conns in (("connections", merged.connections), ("_snapshot/connections", merged.open_connections)):
        opened = pc.multiply(pc.cast(conns.column("opened"), pa.int64()), 1000)
        derive.write_partitioned(conns, opened, staging / name, "merged.parquet")
    snap = staging / "_snapshot"
    derive.write_partitioned(merged.pending, merged.pending.column("ts_ns"), snap / "requests", "pending.parquet")
    merged.carry.save(carry_dir / run_id)
    moved = 0
    for table in ("frames", "requests", "state_changes", "connections", "traffic"):
        moved += move_staged(staging / table, root / table, run_id)
    for table in ("requests", "connections"):
        (root / table).mkdir(parents=True, exist_ok=True)
        move_staged(snap / table, root / table, run_id, prefix="snap")
    manifest.files.update(states)
    if moved:
        manifest.runs.append(run_id)
    manifest.carry = run_id
    manifest.save()
    manifest.remove_stale()
    shutil.rmtree(staging, ignore_errors=True)
    return int(merged.requests.num_rows + merged.state_changes.num_rows)
