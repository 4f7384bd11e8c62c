"""The warehouse layout: immutable snapshots, published by one atomic rename.

    WAREHOUSE/<table> -> _jet_ingest/current/<table>        (symlinks, made once)
    WAREHOUSE/_jet_ingest/current -> snapshots/00000042      (the commit point)
    WAREHOUSE/_jet_ingest/snapshots/00000042/
        {frames,requests,state_changes,connections,traffic}/date=YYYY-MM-DD/*.parquet
        _carry/*.parquet                                     (handed to the next run)
        _manifest.json                                       (what this snapshot holds)
    WAREHOUSE/_jet_ingest/staging/<run id>/                  (a run's files before its commit)
    WAREHOUSE/report.html

Each commit builds a new snapshot directory beside the current one: it hard-links the
current snapshot's Parquet files that stay (a link costs no data), moves the run's staged
files in, adds the carry and a ``_manifest.json`` that lists every Parquet file of the
snapshot with its rows, and renames the finished directory into place. Then it points
``_jet_ingest/current`` at it by renaming a new symlink over the old one: that rename is
the commit, the one step a reader sees or does not see. Until it happens every table
directory a reader can reach (``WAREHOUSE/frames`` and the rest resolve through
``current``) holds exactly the previous snapshot's files; uncommitted files only ever live
under ``_jet_ingest/`` (``staging``, an unpublished snapshot), which no table path leads
to. A run killed at any point leaves the previous snapshot current; the next run deletes
what the dead one left (:meth:`Manifest.remove_uncommitted`) and reads its byte ranges
again.

Readers: :func:`tools.ingest.read_table` (``read_table(spark, WAREHOUSE, "frames")``)
resolves ``current`` once and reads that snapshot's directory, so a query is pinned to
one snapshot even while later ones are committed. ``spark.read.parquet("WAREHOUSE/frames")``
also sees only committed rows (it follows the symlinks at listing time); a query that
runs across a later commit that compacts files may then fail to find a file (loudly,
never with wrong rows). Superseded snapshots stay readable for :data:`RETAIN_S`.

Each table of a snapshot is a plain Hive-partitioned Parquet directory, so moving to Delta
Lake or Iceberg is a conversion of ``WAREHOUSE/_jet_ingest/current/<table>`` in place
(``CONVERT TO DELTA parquet.`...` PARTITIONED BY (date DATE)``, Iceberg's ``migrate`` /
``add_files``), not a rewrite.

The manifest keys every log segment by its identity from the header (daemon name,
``created_ns``, segment number, header CRC), not by its path: a segment renamed or moved
to an archive directory is known as the one already ingested. The warehouse needs a
filesystem with hard links and symlinks (local disks, NFS), visible at the same path to
the driver and every Spark executor.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = [
    "CRASH_ENV",
    "RETAIN_S",
    "TABLES",
    "FileState",
    "Manifest",
    "WarehouseError",
    "crash_point",
    "history_notes",
    "locked",
    "new_run_id",
    "segment_key",
]

MANIFEST_VERSION = 3
TABLES = ("frames", "requests", "state_changes", "connections", "traffic")
RETAIN_S = 600.0  # a superseded snapshot stays readable this long (queries in flight)
KEEP_SUPERSEDED = 2  # ... and the newest superseded ones are kept whatever their age
CRASH_ENV = "JET_INGEST_CRASH_AT"  # tests: os._exit(86) at the named point (crash_point)


class WarehouseError(ValueError):
    """The warehouse is not one this jet-ingest can continue, or an ingest cannot be
    committed safely (says why)."""


def crash_point(name: str) -> None:
    """Die here, as a killed process would, if ``$JET_INGEST_CRASH_AT`` names this point.

    The crash tests set it in a subprocess to stop an ingest between any two steps of
    its commit; ``os._exit`` runs no cleanup, like SIGKILL.
    """
    if os.environ.get(CRASH_ENV) == name:
        os._exit(86)


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold ``root``'s lock (``_jet_ingest/lock``, an advisory ``flock``) while one
    jet-ingest writes it: two at once would delete each other's staged files and
    publish over each other. No lock where ``fcntl`` is missing.

    Raises:
        WarehouseError: another process holds it.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    path = root / "_jet_ingest" / "lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WarehouseError(f"{root}: another jet-ingest is writing this warehouse") from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def new_run_id() -> str:
    """A fresh ingest run id."""
    return uuid.uuid4().hex[:12]


def segment_key(daemon: str, created_ns: int, segment: int, header_crc: int) -> str:
    """The manifest's key of a segment: its identity from the header (JETLOG.md 2),
    the same wherever the file is moved."""
    return f"{daemon}/{created_ns}/{segment}/{header_crc:08x}"


def bad_header_key(path: str) -> str:
    """The manifest's key of a file with an invalid header (no identity: by its path)."""
    return f"path:{path}"


@dataclass
class FileState:
    """What the warehouse holds of one log segment."""

    path: str  # where it was last seen
    header_crc: int
    daemon: str
    created_ns: int
    segment: int
    run_ns: int
    done: int  # offset after the last record ingested
    # --since when the segment was first read: its records before then were skipped for good
    since_ns: Optional[int] = None

    @property
    def key(self) -> str:
        return segment_key(self.daemon, self.created_ns, self.segment, self.header_crc) if self.daemon \
            else bad_header_key(self.path)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _spans(numbers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
    out: list[str] = []
    for n in numbers:
        if out and int(out[-1].split("-")[-1]) == n - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def history_notes(files: Iterable[FileState]) -> dict[int, str]:
    """run_ns -> what is missing from the history of that daemon run, for the runs
    whose history the warehouse holds only in part: segments of the run (JETLOG.md 2:
    numbered from 0) never read, or records before a ``--since`` that cut into it.
    Those say what a state's owner, name and first value were: the note says what
    cannot be derived. Runs read whole have no note."""
    import datetime

    segments: dict[int, set[int]] = {}
    daemon: dict[int, str] = {}
    started: dict[int, int] = {}
    since: dict[int, int] = {}
    for s in files:
        if not s.daemon:
            continue  # a bad header: reported as damage
        segments.setdefault(s.run_ns, set()).add(s.segment)
        daemon[s.run_ns] = s.daemon
        started[s.run_ns] = min(started.get(s.run_ns, s.created_ns), s.created_ns)
        if s.since_ns is not None:
            since[s.run_ns] = max(since.get(s.run_ns, s.since_ns), s.since_ns)
    notes = {}
    for run, segs in sorted(segments.items()):
        parts = []
        missing = sorted(set(range(max(segs) + 1)) - segs)
        if missing:
            parts.append(f"segment(s) {_spans(missing)} of {max(segs) + 1} not read (deleted, or not in the log "
                         "directory)")
        if run in since and since[run] > started[run]:
            at = datetime.datetime.fromtimestamp(since[run] / 1e9, datetime.UTC)
            parts.append(f"records before {at:%Y-%m-%d %H:%M:%S} UTC skipped (--since)")
        if parts:
            at = datetime.datetime.fromtimestamp(run / 1e9, datetime.UTC)
            notes[run] = (f"partial history of daemon {daemon[run]!r}, run of {at:%Y-%m-%d %H:%M:%S} UTC "
                          f"(run_ns {run}): {'; '.join(parts)}. Not derived for it: the owner (and owner name) "
                          "of a state added before, until a routed set or a notify shows it; DISCONNECT rows of "
                          "such states; each state's value before its first change here (type/value_before "
                          "null); the names and open times of connections opened before (unless a segment's "
                          "CONN_SNAPSHOT gives the name)")
    return notes


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@dataclass
class Manifest:
    """The committed state of a warehouse: its current snapshot (module docstring)."""

    root: Path
    files: dict[str, FileState] = field(default_factory=dict)  # segment_key -> state
    tables: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {relative file: rows}
    version: int = 0  # snapshot number; 0: nothing committed yet
    has_carry: bool = False

    @property
    def meta(self) -> Path:
        return self.root / "_jet_ingest"

    @property
    def snapshots(self) -> Path:
        return self.meta / "snapshots"

    @property
    def current(self) -> Path:
        """The commit point: a symlink to the current snapshot's directory."""
        return self.meta / "current"

    @property
    def snapshot_dir(self) -> Optional[Path]:
        return self.snapshots / f"{self.version:08d}" if self.version else None

    @property
    def carry_dir(self) -> Optional[Path]:
        return self.snapshot_dir / "_carry" if self.version and self.has_carry else None  # type: ignore[operator]

    def rows(self, table: str) -> int:
        """Rows of ``table`` in this snapshot."""
        return sum(self.tables.get(table, {}).values())

    @classmethod
    def load(cls, root: Path) -> Manifest:
        """The committed state of ``root`` (empty if nothing was committed yet).

        Raises:
            WarehouseError: the warehouse was made by an older jet-ingest, or its
                current snapshot is unreadable.
        """
        m = cls(root)
        if (m.meta / "manifest.json").exists():
            raise WarehouseError(f"{root}: made by an older jet-ingest (its tables are not published as "
                                 "snapshots); ingest into a new warehouse")
        if not os.path.lexists(m.current):
            return m
        target = os.readlink(m.current)
        try:
            version = int(Path(target).name)
            doc = json.loads((m.snapshots / Path(target).name / "_manifest.json").read_text())
        except (ValueError, OSError) as exc:
            raise WarehouseError(f"{m.current} -> {target}: not a readable snapshot ({exc})") from None
        if doc.get("version") != MANIFEST_VERSION:
            raise WarehouseError(f"{m.current}: unknown manifest version {doc.get('version')!r}")
        m.version = version
        m.files = {k: FileState(**s) for k, s in doc["files"].items()}
        m.tables = {t: dict(v) for t, v in doc["tables"].items()}
        m.has_carry = bool(doc.get("carry"))
        return m

    # -- commit -------------------------------------------------------------------

    def publish(self, staged: list[tuple[Path, str]], run_id: str, states: dict[str, FileState], *,
                drop: Callable[[str, str], bool] = lambda table, rel: False,
                added_rows: Optional[dict[str, dict[str, int]]] = None,
                carry: Optional[Path] = None, point: str = "") -> int:
        """Commit a new snapshot: the current one's files except those ``drop(table,
        relative path)`` names, plus, for each ``(directory, prefix)`` of ``staged``,
        the Parquet files under ``directory/<table>/`` (renamed ``<prefix>-<run
        id>-<name>``), the carry directory ``carry`` (else the current one's), and the
        segment ``states`` merged over the current ones. ``added_rows`` gives the rows
        of files of the first staged directory ({table: {path relative to
        ``directory/<table>``: rows}}) when the caller has checked them; other files'
        footers are read. Returns the number of files added. On return the snapshot
        is current and ``self`` describes it.

        Crash points (``point`` prefixes them): ``linked``, ``published``, ``committed``.
        """
        import pyarrow.parquet as pq

        self.snapshots.mkdir(parents=True, exist_ok=True)
        version = self.version + 1
        final = self.snapshots / f"{version:08d}"
        tmp = self.snapshots / f".{version:08d}.{run_id}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tables: dict[str, dict[str, int]] = {}
        old = self.snapshot_dir
        added = 0
        for table in TABLES:
            keep = {rel: n for rel, n in self.tables.get(table, {}).items() if not drop(table, rel)}
            (tmp / table).mkdir(parents=True, exist_ok=True)
            for rel in keep:
                dest = tmp / table / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.link(old / table / rel, dest)  # type: ignore[operator]
            for i, (staging, prefix) in enumerate(staged):
                known = (added_rows or {}).get(table, {}) if i == 0 else {}
                src_dir = staging / table
                for f in sorted(src_dir.rglob("*.parquet")) if src_dir.exists() else []:
                    rel_src = f.relative_to(src_dir)
                    rel = str(rel_src.parent / f"{prefix}-{run_id}-{f.name}")
                    rows = known.get(str(rel_src))
                    keep[rel] = rows if rows is not None else pq.read_metadata(f).num_rows
                    dest = tmp / table / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(f, dest)
                    added += 1
            tables[table] = dict(sorted(keep.items()))
        carried = carry if carry is not None else self.carry_dir
        if carried is not None and carried.exists():
            (tmp / "_carry").mkdir()
            for f in carried.iterdir():
                if carry is not None:
                    os.replace(f, tmp / "_carry" / f.name)
                else:
                    os.link(f, tmp / "_carry" / f.name)
        files = dict(self.files)
        files.update(states)
        doc = {"version": MANIFEST_VERSION, "snapshot": version, "run": run_id, "committed_ns": time.time_ns(),
               "carry": carried is not None, "files": {k: s.to_json() for k, s in sorted(files.items())},
               "tables": tables}
        with open(tmp / "_manifest.json", "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        crash_point(f"{point}linked")
        os.rename(tmp, final)
        _fsync_dir(self.snapshots)
        crash_point(f"{point}published")
        pointer = self.meta / f".current.{run_id}"
        if os.path.lexists(pointer):
            pointer.unlink()
        os.symlink(os.path.join("snapshots", final.name), pointer)
        os.replace(pointer, self.current)  # the commit
        _fsync_dir(self.meta)
        crash_point(f"{point}committed")
        self.version, self.files, self.tables, self.has_carry = version, files, tables, carried is not None
        self._link_tables()
        self.remove_stale()
        return added

    def _link_tables(self) -> None:
        """``WAREHOUSE/<table>`` -> ``_jet_ingest/current/<table>`` (once)."""
        for table in TABLES:
            link = self.root / table
            target = os.path.join("_jet_ingest", "current", table)
            if os.path.islink(link) and os.readlink(link) == target:
                continue
            if os.path.lexists(link):
                raise WarehouseError(f"{link}: expected a symlink to {target}; move it away")
            os.symlink(target, link)

    # -- cleanup ------------------------------------------------------------------

    def remove_uncommitted(self) -> int:
        """Delete what runs that never committed left (staging, unpublished snapshots);
        returns how many directories went."""
        removed = 0
        staging = self.meta / "staging"
        if staging.exists():
            removed += sum(1 for _ in staging.iterdir())
            shutil.rmtree(staging, ignore_errors=True)
        if self.snapshots.exists():
            for d in self.snapshots.iterdir():
                if d.name.startswith(".") or (d.name.isdigit() and int(d.name) > self.version):
                    shutil.rmtree(d, ignore_errors=True)
                    removed += 1
        for p in self.meta.glob(".current.*") if self.meta.exists() else []:
            p.unlink(missing_ok=True)
        if self.version:
            self._link_tables()
        self.remove_stale()
        return removed

    def remove_stale(self, now: Optional[float] = None) -> None:
        """Delete superseded snapshots older than :data:`RETAIN_S` (keeping the
        :data:`KEEP_SUPERSEDED` newest), and the staging directory."""
        if not self.snapshots.exists():
            return
        now = time.time() if now is None else now
        versions = sorted(int(d.name) for d in self.snapshots.iterdir() if d.name.isdigit())
        superseded = [v for v in versions if v < self.version]
        for i, v in enumerate(superseded[:-KEEP_SUPERSEDED] if KEEP_SUPERSEDED else superseded):
            successor = self.snapshots / f"{superseded[i + 1] if i + 1 < len(superseded) else self.version:08d}"
            try:
                replaced_at = successor.stat().st_mtime
            except OSError:
                continue
            if now - replaced_at >= RETAIN_S:
                shutil.rmtree(self.snapshots / f"{v:08d}", ignore_errors=True)


def snapshot_path(root: Path) -> Path:
    """The directory of ``root``'s current snapshot, resolved (pinned).

    Raises:
        FileNotFoundError: nothing was committed yet.
    """
    current = root / "_jet_ingest" / "current"
    if not os.path.lexists(current):
        raise FileNotFoundError(f"{root}: nothing ingested yet")
    return Path(os.path.realpath(current))


def table_path(root: Path, table: str) -> Path:
    """The directory of ``table`` in ``root``'s current snapshot, resolved (pinned).

    Raises:
        FileNotFoundError: nothing was committed yet.
    """
    return snapshot_path(root) / table
