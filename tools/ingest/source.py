"""The ``jetlog`` PySpark Python Data Source: batch and streaming reads of jet event logs.

    >>> from tools.ingest import register
    >>> register(spark)
    >>> spark.read.format("jetlog").load("/var/log/jetd").groupBy("kind").count().show()
    >>> spark.sql("CREATE TABLE log USING jetlog OPTIONS (path '/var/log/jetd')")

Options (all optional except the path):

- ``path`` / ``load(path)``: a segment file, a directory (its regular files that start
  like a jet log; readers do not trust names, JETLOG.md 1) or a glob. ``load([a, b])``
  arrives as the JSON list ``paths``.
- ``mode``: PERMISSIVE (default; damage becomes a row whose ``corrupt`` says what and
  how many bytes were skipped, JETLOG.md 5), DROPMALFORMED or FAILFAST.
- ``chunkSize`` (bytes, default 32 MiB): larger files are split into partitions at
  record boundaries; ``groupSize`` (default 32 MiB): smaller files are grouped until a
  partition holds this many bytes.
- ``maxRecordSize``: the largest record length accepted (JETLOG.md 3).
- ``ranges``: JSON list of ``[file, start, limit]`` to read exactly those byte ranges
  (``jet-ingest`` uses it to resume where its manifest says).
- streaming only: ``startingOffsets`` JSON ``{file: offset}`` for files seen before.

The schema is fixed (:data:`tools.ingest.parse.SPARK_SCHEMA`); codes are spec names.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any, Optional

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from jetwire.log import DEFAULT_MAX_RECORD, MAGIC

__all__ = ["JetlogDataSource", "expand_paths", "plan_ranges", "register"]

DEFAULT_CHUNK = 32 << 20
DEFAULT_GROUP = 32 << 20
_GLOB_CHARS = set("*?[")


def _looks_like_jetlog(path: str) -> bool:
    """True if the file starts with the log magic (or is shorter and a prefix of it)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(MAGIC))
    except OSError:
        return False
    return MAGIC.startswith(head)


def _dir_files(directory: str) -> list[str]:
    out = []
    for entry in sorted(os.scandir(directory), key=lambda e: e.name):
        if entry.name.startswith((".", "_")) or not entry.is_file():
            continue
        if _looks_like_jetlog(entry.path):
            out.append(entry.path)
    return out


def expand_paths(options: Any) -> list[str]:
    """The files named by the ``path``/``paths`` options: files as given, directories
    and globs expanded (sorted, deduplicated).

    Raises:
        ValueError: if no path was given.
        FileNotFoundError: if a named file or directory does not exist.
    """
    given: list[str] = []
    if options.get("paths"):
        given.extend(json.loads(options["paths"]))
    if options.get("path"):
        given.append(options["path"])
    if not given:
        raise ValueError("jetlog: give a path: spark.read.format('jetlog').load(PATH)")
    files: list[str] = []
    for raw in given:
        path = raw[len("file:") :] if raw.startswith("file:") else raw
        if _GLOB_CHARS & set(path):
            for match in sorted(glob.glob(path, recursive=True)):
                files.extend(_dir_files(match) if os.path.isdir(match) else [match])
        elif os.path.isdir(path):
            files.extend(_dir_files(path))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise FileNotFoundError(f"jetlog: no such file or directory: {path}")
    return list(dict.fromkeys(os.path.abspath(f) for f in files))


Range = tuple[str, int, Optional[int], int]  # file, start, stop (None: to limit), limit


def plan_ranges(ranges: Sequence[tuple[str, int, int]], chunk: int, group: int) -> list[list[Range]]:
    """Group ``(file, start, limit)`` ranges into partitions: big ranges cut in chunks
    (the reader moves each cut to a record boundary), small ones grouped."""
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
        current.append((path, start, None, limit))
        current_bytes += size
        if current_bytes >= group:
            parts.append(current)
            current, current_bytes = [], 0
    if current:
        parts.append(current)
    return parts


class JetlogPartition(InputPartition):
    """Byte ranges of one or more segment files read by one task."""

    def __init__(self, ranges: list[Range]) -> None:
        super().__init__(ranges)
        self.ranges = ranges


def _read_ranges(ranges: list[Range], options: dict[str, str]) -> Iterator[Any]:
    # Imported here: this runs in the Python worker, which has numpy/pyarrow.
    from tools.ingest.parse import read_segment

    mode = options.get("mode", "PERMISSIVE")
    max_record = int(options.get("maxrecordsize", DEFAULT_MAX_RECORD))
    for path, start, stop, limit in ranges:
        try:
            yield from read_segment(path, start, stop, mode=mode, max_record=max_record, limit=limit)
        except FileNotFoundError:
            # A segment deleted (rotated away) since planning has nothing left to read.
            if mode.upper() == "FAILFAST":
                raise


def _options(options: Any) -> dict[str, str]:
    # Spark hands options over case-insensitively (lower-cased keys); look them up so.
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


class JetlogReader(DataSourceReader):
    """Batch reader: plans partitions on the driver, parses in the workers."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        from tools.ingest.parse import MODES

        if options.get("mode", "PERMISSIVE").upper() not in MODES:
            raise ValueError(f"jetlog: mode must be one of {', '.join(MODES)}")

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        if opts.get("ranges"):
            ranges = [(str(p), int(s), int(lim)) for p, s, lim in json.loads(opts["ranges"])]
        else:
            ranges = [(f, 0, os.path.getsize(f)) for f in expand_paths(opts)]
        chunk = int(opts.get("chunksize", DEFAULT_CHUNK))
        group = int(opts.get("groupsize", DEFAULT_GROUP))
        return [JetlogPartition(p) for p in plan_ranges(ranges, chunk, group)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, JetlogPartition)
        return _read_ranges(partition.ranges, self.options)


class JetlogStreamReader(DataSourceStreamReader):
    """Streaming reader over a log directory (or glob).

    The offset is ``{"files": {file: end}}`` where ``end`` is the offset after the last
    complete record of the file (JETLOG.md 5: a reader following a live file waits for
    the rest of a truncated record), so every micro-batch reads whole records only and
    a checkpointed query never reads a record twice.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self._ends: dict[str, tuple[int, int]] = {}  # file -> (scanned up to, size seen)
        self.max_record = int(options.get("maxrecordsize", DEFAULT_MAX_RECORD))

    def initialOffset(self) -> dict[str, Any]:
        start = self.options.get("startingoffsets")
        return {"files": json.loads(start) if start else {}}

    def _complete_end(self, path: str, start: int) -> int:
        from tools.ingest.parse import JetlogError, read_header, scan_records

        size = os.path.getsize(path)
        known = self._ends.get(path)
        if known is not None and known[1] == size:
            return known[0]
        import mmap

        if size == 0:
            return 0
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as mm:
            try:
                header = read_header(mm)
            except JetlogError:
                # A bad header is reported once, as a row, by the reader.
                self._ends[path] = (size, size)
                return size
            if header is None:
                return 0
            begin = max(start, known[0] if known else 0, header.size)
            end = scan_records(mm, begin, max_record=self.max_record).end
        self._ends[path] = (end, size)
        return end

    def latestOffset(self, start: Optional[dict[str, Any]] = None, limit: Any = None) -> dict[str, Any]:
        done = dict((start or {}).get("files", {}))
        files = dict(done)
        for path in expand_paths(self.options):
            end = self._complete_end(path, int(done.get(path, 0)))
            files[path] = max(end, int(done.get(path, 0)))
        return {"files": files}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = start.get("files", {})
        ranges = [(p, int(begin.get(p, 0)), int(e)) for p, e in sorted(end.get("files", {}).items())]
        chunk = int(self.options.get("chunksize", DEFAULT_CHUNK))
        group = int(self.options.get("groupsize", DEFAULT_GROUP))
        return [JetlogPartition(p) for p in plan_ranges(ranges, chunk, group)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, JetlogPartition)
        return _read_ranges(partition.ranges, self.options)

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
    and ``CREATE TABLE ... USING jetlog`` work in that session.
    """
    spark.dataSource.register(JetlogDataSource)
