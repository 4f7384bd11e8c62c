"""The ``jetlog`` PySpark Python Data Source: batch and streaming reads of jet event logs.

    >>> from tools.ingest import register
    >>> register(spark)
    >>> spark.read.format("jetlog").load("/var/log/jetd").groupBy("kind").count().show()
    >>> spark.sql("CREATE TEMPORARY VIEW log USING jetlog OPTIONS (path '/var/log/jetd')")

Options (all optional except the path):

- ``path`` / ``load(path)``: a segment file, a directory (its regular files that start
  like a jet log; readers do not trust names, JETLOG.md 1) or a glob. ``load([a, b])``
  arrives as the JSON list ``paths``.
- ``mode``: PERMISSIVE (default; damage becomes a row whose ``corrupt`` says what and
  how many bytes were skipped, JETLOG.md 5), DROPMALFORMED or FAILFAST.
- ``chunkSize`` (bytes, default 32 MiB): larger files are split into partitions at
  record boundaries; ``groupSize`` (default 32 MiB): smaller files share a partition
  of at most this many bytes.
- ``maxRecordSize``: the largest record length accepted (JETLOG.md 3).
- ``since`` / ``until``: only the records with ``since <= ts_ns < until`` (ns since the
  epoch, or an ISO 8601 time with its zone); only the byte ranges of that time are
  read (bisection over offsets). Query filters are never pushed into the reader: Spark
  reuses a planned reader for later queries of the same DataFrame or view.
- ``ranges``: JSON list of ``[file, start, limit]`` to read exactly those byte ranges
  (``jet-ingest`` uses it to resume where its progress table says).
- streaming only: ``startingOffsets`` JSON ``{file: offset}`` for files seen before.

The schema is fixed (:data:`tools.ingest.parse.SPARK_SCHEMA`); codes are spec names.
"""

from __future__ import annotations

import datetime
import fnmatch
import glob
import json
import logging
import os
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import Optional

from pyspark.sql.datasource import DataSource
from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StructType

from jetwire.log import DEFAULT_MAX_RECORD
from jetwire.log import MAGIC

__all__ = ["JetlogDataSource", "expand_paths", "plan_files", "plan_ranges", "register", "segment_runs"]

DEFAULT_CHUNK = 32 << 20
DEFAULT_GROUP = 32 << 20
_GLOB_CHARS = set("*?[")
_GZIP_MAGIC = b"\x1f\x8b"
_log = logging.getLogger("jetlog")


def _looks_like_jetlog(path: str) -> bool:
    """True if the file starts with the log magic (or is shorter and a prefix of it),
    also once gunzipped (a compressed rotated segment)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC))
            if head[:2] == _GZIP_MAGIC:
                import gzip

                fh.seek(0)
                with gzip.GzipFile(fileobj=fh) as gz:
                    head = gz.read(len(MAGIC))
    except (OSError, EOFError):
        return False
    return MAGIC.startswith(head)


def _opt_true(options: Any, name: str) -> bool:
    return str(options.get(name.lower(), options.get(name, "false"))).strip().lower() == "true"


def _dir_files(directory: str, recursive: bool, name_glob: Optional[str]) -> list[str]:
    """The segment files of ``directory`` (names are not trusted, JETLOG.md 1: the
    magic is); hidden files and ones starting with ``_`` are skipped, as Spark does."""
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.startswith((".", "_")):
            continue
        if entry.is_dir():
            if recursive:
                out.extend(_dir_files(entry.path, recursive, name_glob))
            continue
        if not entry.is_file() or (name_glob is not None and not fnmatch.fnmatchcase(entry.name, name_glob)):
            continue
        if _looks_like_jetlog(entry.path):
            out.append(entry.path)
    return out


def expand_paths(options: Any) -> list[str]:
    """The files named by the ``path``/``paths`` options: files as given, directories
    and globs expanded (sorted, deduplicated), like Spark's file sources:
    ``recursiveFileLookup`` (true: directories are walked down), ``pathGlobFilter``
    (only files whose name matches, e.g. ``*.jetlog``).

    An existing empty directory gives no files (an empty DataFrame).

    Raises:
        ValueError: if no path was given.
        FileNotFoundError: if a named file or directory does not exist, or a glob
            matches nothing (as Spark's PATH_NOT_FOUND).
    """
    given: list[str] = []
    if options.get("paths"):
        given.extend(json.loads(options["paths"]))
    if options.get("path"):
        given.append(options["path"])
    if not given:
        # Spark 4.3 keeps no OPTIONS of a catalog table (CREATE TABLE ... USING) of a Python
        # data source: the reader gets none. Say what works instead.
        raise ValueError("jetlog: give a path: spark.read.format('jetlog').load(PATH), or in SQL "
                         "CREATE TEMPORARY VIEW name USING jetlog OPTIONS (path 'PATH') (a CREATE TABLE ... "
                         "USING jetlog keeps no OPTIONS in Spark 4.3: its reader gets none)")
    recursive = _opt_true(options, "recursiveFileLookup")
    name_glob = options.get("pathglobfilter", options.get("pathGlobFilter"))
    files: list[str] = []
    for raw in given:
        path = raw[len("file:") :] if raw.startswith("file:") else raw
        if path.startswith("//"):  # file:///x
            path = path[2:]
        if _GLOB_CHARS & set(path):
            matches = sorted(glob.glob(path, recursive=True))
            if not matches:
                raise FileNotFoundError(f"jetlog: no file or directory matches {path}")
            for match in matches:
                if os.path.isdir(match):
                    files.extend(_dir_files(match, recursive, name_glob))
                elif name_glob is None or fnmatch.fnmatchcase(os.path.basename(match), name_glob):
                    files.append(match)
        elif os.path.isdir(path):
            files.extend(_dir_files(path, recursive, name_glob))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise FileNotFoundError(f"jetlog: no such file or directory: {path}")
    return list(dict.fromkeys(os.path.abspath(f) for f in files))


def segment_runs(files: Sequence[str]) -> dict[str, int]:
    """The daemon run (``run_ns``) of each of ``files`` with a valid header, as the
    ``jetlog`` source's ``run_ns`` column says it (JETLOG.md 2; version 1: inferred from
    these files' headers, :func:`tools.ingest.parse.infer_runs`).

    Raises:
        OSError: a file cannot be read.
    """
    from tools.ingest.parse import JetlogError
    from tools.ingest.parse import infer_runs
    from tools.ingest.parse import read_file_header

    headers = {}
    for f in files:
        try:
            headers[f] = read_file_header(f)
        except JetlogError:
            headers[f] = None  # a bad header: its one row says so
    return infer_runs(headers)


Range = tuple[str, int, Optional[int], Optional[int]]  # file, start, stop (None: to limit), limit


def plan_ranges(ranges: Sequence[tuple[str, int, int]], chunk: int, group: int) -> list[list[Range]]:
    """Group ``(file, start, limit)`` ranges into partitions: big ranges cut in chunks
    (the reader moves each cut to where the chunk really starts), small ones grouped."""
    parts: list[list[Range]] = []
    current: list[Range] = []
    current_bytes = 0
    for path, start, limit in ranges:
        size = limit - start
        if size <= 0:
            continue
        if size > chunk:
            if current:
                parts.append(current)
                current, current_bytes = [], 0
            cuts = list(range(start, limit, chunk))
            for i, cut in enumerate(cuts):
                stop = cuts[i + 1] if i + 1 < len(cuts) else None
                parts.append([(path, cut, stop, limit)])
            continue
        if current and current_bytes + size > group:
            # Never past the group size: two segments just under a chunk are two tasks
            # (as Spark packs files into splits), not one that runs them in turn.
            parts.append(current)
            current, current_bytes = [], 0
        current.append((path, start, None, limit))
        current_bytes += size
        if current_bytes >= group:
            parts.append(current)
            current, current_bytes = [], 0
    if current:
        parts.append(current)
    return parts


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == _GZIP_MAGIC


class JetlogPartition(InputPartition):
    """Byte ranges of one or more segment files read by one task.

    ``runs``: file -> run_ns (for version-1 headers); ``starts``: file -> the start of
    its range, a position an earlier read ended at (read from exactly there);
    ``planned``: file -> what the driver saw of it (:class:`tools.ingest.parse.PlannedSegment`:
    header, size, last planned record), which the task checks before it reads.
    """

    def __init__(self, ranges: list[Range], runs: dict[str, int], starts: dict[str, int],
                 planned: Optional[dict[str, Any]] = None) -> None:
        super().__init__(ranges)
        self.ranges = ranges
        self.runs = runs
        self.starts = starts
        self.planned = planned or {}


def _partitions(ranges: list[tuple[str, int, Optional[int]]], options: dict[str, str],
                runs: dict[str, int]) -> list[JetlogPartition]:
    """Partitions for ``(file, start, limit)`` ranges (limit None: the whole file): a
    gzip-compressed segment is one task (it cannot be split); never no partition."""
    chunk = int(options.get("chunksize", DEFAULT_CHUNK))
    group = int(options.get("groupsize", DEFAULT_GROUP))
    plain: list[tuple[str, int, int]] = []
    parts: list[list[Range]] = []
    for path, start, limit in ranges:
        if limit is None:
            parts.append([(path, start, None, None)])
        else:
            plain.append((path, start, limit))
    planned: list[list[Range]] = []
    small: list[tuple[str, int, int]] = []
    for path, start, limit in plain:
        size = limit - start
        if size <= chunk:
            small.append((path, start, limit))
            continue
        planned += plan_ranges(small, chunk, group)
        small = []
        # Equal chunks (a 53 MiB file in two of 26.5, not 32 + 21): the slowest task
        # sets the time.
        pieces = -(-size // chunk)
        planned += plan_ranges([(path, start, limit)], -(-size // pieces), group)
    parts = planned + plan_ranges(small, chunk, group) + parts
    starts = {path: start for path, start, _ in ranges}
    seen = plan_files(ranges, int(options.get("maxrecordsize", DEFAULT_MAX_RECORD)))
    out = [JetlogPartition(p, {f: runs[f] for f, *_ in p if f in runs}, {f: starts[f] for f, *_ in p},
                           {f: seen[f] for f, *_ in p if f in seen})
           for p in parts]
    # Spark needs at least one partition: an empty directory is an empty DataFrame.
    return out or [JetlogPartition([], {}, {})]


def plan_files(ranges: Sequence[tuple[str, int, Optional[int]]], max_record: int = DEFAULT_MAX_RECORD) -> dict[str, Any]:
    """What the driver sees of each file of ``(file, start, limit)`` ranges (limit None:
    a gzip-compressed segment, read whole), for the tasks to check
    (:func:`tools.ingest.parse.check_segment`): file -> :class:`~tools.ingest.parse.PlannedSegment`
    for its furthest limit. A file the driver cannot read is left out (the task says so)."""
    from tools.ingest.parse import plan_segment

    limits: dict[str, Optional[int]] = {}
    for path, _, limit in ranges:
        old = limits.get(path, 0)
        limits[path] = None if limit is None or old is None else max(old, limit)
    out: dict[str, Any] = {}
    for path, limit in limits.items():
        try:
            out[path] = plan_segment(path, None if _is_gzip(path) else limit, max_record=max_record)
        except OSError:
            continue
    return out


def _missing(path: str, exc: OSError) -> str:
    return (f"jetlog: cannot read {path}, which the driver listed: {exc.strerror or exc}. "
            "Every executor must see the log files at the same path as the driver (a shared "
            "mount). If files may be deleted between listing and reading, set the option "
            "ignoreMissingFiles=true to skip them (each one is reported).")


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_US = datetime.timedelta(microseconds=1)


def _time_option(options: dict[str, str], name: str) -> Optional[int]:
    """Option ``name`` (``since``/``until``) in ns since the epoch: an integer (ns) or an
    ISO 8601 time with its zone (``2026-11-27T10:00:00Z``, ``...+01:00``).

    Raises:
        ValueError: neither, or a time without a zone (whose instant is unknown).
    """
    text = options.get(name.lower())
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"jetlog: option {name} must be ns since the epoch or an ISO 8601 time with a zone, "
                         f"not {text!r}") from None
    if moment.tzinfo is None:
        raise ValueError(f"jetlog: option {name}={text!r} has no zone (add Z or +HH:MM)")
    return (moment - _EPOCH) // _US * 1000


@dataclass(frozen=True)
class TimeWindow:
    """The ``since`` / ``until`` options: records with ``since <= ts_ns < until`` (either
    bound may be absent). Part of the DataFrame's definition, like its path, so every
    query of it reads the same rows (PySpark 4.3 reuses one planned reader for later
    scans of a DataFrame or view: a window taken from one query's filters would leak
    into the next, see :class:`JetlogReader`)."""

    since: Optional[int] = None
    until: Optional[int] = None

    @classmethod
    def of(cls, options: dict[str, str]) -> TimeWindow:
        """The window the options set.

        Raises:
            ValueError: a bound is not a time, or ``until`` is not after ``since``.
        """
        window = cls(_time_option(options, "since"), _time_option(options, "until"))
        if window.since is not None and window.until is not None and window.until <= window.since:
            raise ValueError(f"jetlog: until ({window.until}) must be after since ({window.since})")
        return window

    def any(self) -> bool:
        return self.since is not None or self.until is not None

    def mask(self, batch: Any) -> Any:
        """The rows of ``batch`` inside the window (pyarrow boolean array); rows without
        a time (damage found in the byte ranges read) are kept."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        keep = pa.array(np.ones(batch.num_rows, dtype=bool))
        ts = batch.column("ts_ns")
        if self.since is not None:
            keep = pc.and_(keep, pc.greater_equal(ts, pa.scalar(self.since, pa.int64())))
        if self.until is not None:
            keep = pc.and_(keep, pc.less(ts, pa.scalar(self.until, pa.int64())))
        return pc.fill_null(keep, True)


def _read_ranges(partition: JetlogPartition, options: dict[str, str]) -> Iterator[Any]:
    # Imported here: this runs in the Python worker, which has numpy/pyarrow.
    import pyarrow as pa

    from tools.ingest.parse import CORRUPT
    from tools.ingest.parse import SOURCE_SCHEMA
    from tools.ingest.parse import check_segment
    from tools.ingest.parse import read_segment

    window = TimeWindow.of(options)
    if window.any():
        for batch in _read_ranges(partition, {k: v for k, v in options.items() if k not in ("since", "until")}):
            batch = batch.filter(window.mask(batch))
            if batch.num_rows:
                yield batch
        return

    mode = options.get("mode", "PERMISSIVE").upper()
    max_record = int(options.get("maxrecordsize", DEFAULT_MAX_RECORD))
    ignore_missing = _opt_true(options, "ignoreMissingFiles")
    for path, start, stop, limit in partition.ranges:
        try:
            if path in partition.planned:
                check_segment(path, partition.planned[path], max_record=max_record)
            yield from read_segment(
                path, start, stop, mode=mode, max_record=max_record, limit=limit, add_run=True,
                run_ns=partition.runs.get(path), exact_start=start == partition.starts.get(path),
                truncated_row=True,
            )
        except FileNotFoundError as exc:
            if not ignore_missing:
                raise FileNotFoundError(_missing(path, exc)) from None
            # Like Spark's ignoreMissingFiles, but never silent: logged, and a row.
            _log.warning("jetlog: skipped missing file %s (ignoreMissingFiles)", path)
            if mode == "PERMISSIVE":
                yield pa.RecordBatch.from_pylist(
                    [{"file": path, "offset": start, "kind": CORRUPT, "size": 0,
                      "corrupt": "missing file: listed by the driver, gone when read (ignoreMissingFiles)"}],
                    schema=SOURCE_SCHEMA)


def _options(options: Any) -> dict[str, str]:
    # Spark hands options over case-insensitively (lower-cased keys); look them up so.
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _check_mode(options: dict[str, str]) -> None:
    from tools.ingest.parse import MODES

    if options.get("mode", "PERMISSIVE").upper() not in MODES:
        raise ValueError(f"jetlog: mode must be one of {', '.join(MODES)}")


class JetlogReader(DataSourceReader):
    """Batch reader: plans partitions on the driver, parses in the workers.

    It keeps no state but its options: PySpark 4.3 plans a DataFrame's (or view's) scan
    once and reuses the planned reader and partitions for later queries of it (it plans
    again only for a query that pushes filters, and keeps that plan for the queries
    after it). So this reader takes no filters from queries (no ``pushFilters``: a
    filter of one query would decide the rows of the next); what it skips is set by
    the DataFrame's own options: ``since`` / ``until`` (:class:`TimeWindow`) read only
    the byte ranges of those times (``ts_ns`` never decreases within a segment,
    JETLOG.md 3: bisection over offsets, :func:`tools.ingest.parse.time_range`).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        _check_mode(options)
        TimeWindow.of(options)  # a bad since/until fails at load, on the driver

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        ranges: list[tuple[str, int, Optional[int]]]
        window = TimeWindow.of(opts)
        if opts.get("ranges"):
            ranges = [(str(p), int(s), int(lim)) for p, s, lim in json.loads(opts["ranges"])]
            files = list(dict.fromkeys(f for f, _, _ in ranges))
        else:
            files = expand_paths(opts)
            if window.any():
                ranges = _window_ranges(files, window, int(opts.get("maxrecordsize", DEFAULT_MAX_RECORD)))
            else:
                ranges = [(f, 0, None if _is_gzip(f) else os.path.getsize(f)) for f in files]
        return _partitions(ranges, opts, segment_runs(files))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, JetlogPartition)
        return _read_ranges(partition, self.options)


def _window_ranges(files: list[str], window: TimeWindow, max_record: int) -> list[tuple[str, int, Optional[int]]]:
    """The byte ranges of ``files`` that hold the records of ``window`` (a gzip segment
    is read whole; a file whose header is bad is left out: that row has no time)."""
    from tools.ingest.parse import JetlogError
    from tools.ingest.parse import open_segment
    from tools.ingest.parse import read_header
    from tools.ingest.parse import time_range

    hi = None if window.until is None else window.until - 1
    ranges: list[tuple[str, int, Optional[int]]] = []
    for f in files:
        if _is_gzip(f):
            ranges.append((f, 0, None))
            continue
        with open_segment(f) as buf:
            try:
                header = read_header(buf)
            except JetlogError:
                header = None
            if header is None:
                continue
            start, stop = time_range(buf, header.size, window.since, hi, max_record=max_record)
        if stop > start:
            ranges.append((f, start, stop))
    return ranges


def _read_limit(options: dict[str, str]) -> Any:
    """``maxFilesPerTrigger`` / ``maxBytesPerTrigger`` as a ReadLimit (as Spark's file
    source, not both)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from pyspark.sql.streaming.datasource import ReadMaxBytes
    from pyspark.sql.streaming.datasource import ReadMaxFiles

    files, size = options.get("maxfilespertrigger"), options.get("maxbytespertrigger")
    if files is not None and size is not None:
        raise ValueError("jetlog: maxFilesPerTrigger and maxBytesPerTrigger cannot both be set")
    if files is not None:
        if int(files) < 1:
            raise ValueError(f"jetlog: maxFilesPerTrigger must be at least 1, not {files}")
        return ReadMaxFiles(int(files))
    if size is not None:
        if int(size) < 1:
            raise ValueError(f"jetlog: maxBytesPerTrigger must be at least 1, not {size}")
        return ReadMaxBytes(int(size))
    return ReadAllAvailable()


class JetlogStreamReader(DataSourceStreamReader):
    """Streaming reader over a log directory (or glob).

    The offset is ``{"files": {file: end}}`` where ``end`` is the offset after the last
    complete record or damaged run of the file (JETLOG.md 5: a reader following a live
    file waits for the rest of a truncated record), so every micro-batch reads whole
    records only and a checkpointed query never reads a record twice.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        _check_mode(options)
        self._ends: dict[str, tuple[int, int, int]] = {}  # file -> (from, scanned up to, size seen)
        self.max_record = int(options.get("maxrecordsize", DEFAULT_MAX_RECORD))
        self.limit = _read_limit(options)
        start = options.get("startingoffsets", "earliest").strip()
        if start.lower() not in ("earliest", "latest"):
            try:
                parsed = json.loads(start)
            except ValueError:
                parsed = None
            if not isinstance(parsed, dict) or not all(isinstance(v, int) for v in parsed.values()):
                raise ValueError("jetlog: startingOffsets is 'earliest', 'latest' or JSON {file: offset}, "
                                 f"not {start!r}")

    def initialOffset(self) -> dict[str, Any]:
        start = self.options.get("startingoffsets", "earliest").strip()
        if start.lower() == "earliest":
            return {"files": {}}
        if start.lower() == "latest":
            # Only what is written from now on: every file's current complete end.
            return {"files": {f: self._complete_end(f, 0) for f in expand_paths(self.options)}}
        return {"files": {os.path.abspath(f): int(v) for f, v in json.loads(start).items()}}

    def getDefaultReadLimit(self) -> Any:
        return self.limit

    def _complete_end(self, path: str, start: int, budget: Optional[int] = None) -> int:
        """The offset after the last complete record or damaged run of ``path``, read
        from ``start`` (a position an earlier read ended at); with ``budget``, the
        furthest such offset at most ``budget`` bytes past ``start`` (at least one
        record or run, so that a stream always advances)."""
        from tools.ingest.parse import JetlogError
        from tools.ingest.parse import open_segment
        from tools.ingest.parse import read_header
        from tools.ingest.parse import scan_records

        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            return start  # deleted: nothing more to read (what was read stays read)
        known = self._ends.get(path)
        if budget is None and known is not None and known[0] == start and known[2] == size:
            return known[1]
        with open_segment(path) as mm:
            try:
                header = read_header(mm)
            except JetlogError:
                # A bad header is reported once, as a row, by the reader.
                return len(mm)
            if header is None:
                return start
            begin = max(start, header.size)
            until = None if budget is None else begin + budget
            scan = scan_records(mm, begin, until, max_record=self.max_record)
            end = scan.end
            if budget is not None and end > begin + budget:
                # The last record or run crosses the budget: stop before it, unless it is the only one.
                points = sorted([int(x) for x in scan.starts] + [d[0] for d in scan.damage])
                inside = [p for p in points if begin < p <= begin + budget]
                if inside:
                    end = inside[-1]
        if budget is None:
            self._ends[path] = (start, end, size)
        return end

    def latestOffset(self, start: Optional[dict[str, Any]] = None, limit: Any = None) -> dict[str, Any]:
        from pyspark.sql.streaming.datasource import ReadMaxBytes
        from pyspark.sql.streaming.datasource import ReadMaxFiles

        done = {f: int(v) for f, v in (start or {}).get("files", {}).items()}
        files = dict(done)
        if limit is None:
            limit = self.limit
        files_left = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        bytes_left = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        for path in expand_paths(self.options):  # sorted: JETLOG.md 1 names sort chronologically
            begin = done.get(path, 0)
            if files_left is not None and files_left <= 0:
                break
            if bytes_left is not None and bytes_left <= 0:
                break
            end = max(self._complete_end(path, begin, bytes_left), begin)
            if end > begin or path not in files:
                files[path] = end
            if end > begin:
                if files_left is not None:
                    files_left -= 1
                if bytes_left is not None:
                    bytes_left -= end - max(begin, 0)
        return {"files": files}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = start.get("files", {})
        ranges: list[tuple[str, int, Optional[int]]] = [
            (p, int(begin.get(p, 0)), int(e)) for p, e in sorted(end.get("files", {}).items())
            if int(e) > int(begin.get(p, 0))
        ]
        runs = segment_runs([p for p in end.get("files", {}) if os.path.exists(p)])
        return _partitions(ranges, self.options, runs)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, JetlogPartition)
        return _read_ranges(partition, self.options)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the log files belong to the daemon."""


class JetlogDataSource(DataSource):
    """``format("jetlog")``: jet event-log segments (spec/JETLOG.md) as rows."""

    @classmethod
    def name(cls) -> str:
        return "jetlog"

    def schema(self) -> str:
        from tools.ingest.parse import SPARK_SCHEMA

        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return JetlogReader(_options(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return JetlogStreamReader(_options(self.options))


def register(spark: Any) -> None:
    """Register the ``jetlog`` data source with ``spark`` (a SparkSession).

    Afterwards ``spark.read.format("jetlog")``, ``spark.readStream.format("jetlog")``
    and ``CREATE TEMPORARY VIEW ... USING jetlog`` work in that session. (It no longer
    turns on ``spark.sql.python.filterPushdown.enabled``: the reader takes no filters
    from queries, see :class:`JetlogReader`.)
    """
    spark.dataSource.register(JetlogDataSource)
