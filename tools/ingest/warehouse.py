"""The warehouse: five Delta Lake tables, committed by the driver with delta-rs.

    WAREHOUSE/{frames,requests,state_changes,connections,traffic}/   Delta tables
        _delta_log/00000000000000000042.json ...                      (the commits)
        date=YYYY-MM-DD/*.parquet                                     (partitioned by UTC date)
    WAREHOUSE/_jet_ingest/progress/      a Delta table: how far each log segment is ingested
    WAREHOUSE/_jet_ingest/carry/<run>/   what run <run> handed to the next (open requests, owners)
    WAREHOUSE/_jet_ingest/commit.json    a decided run while its commits are being made
    WAREHOUSE/_jet_ingest/staging/<id>/  a run's files before it is decided
    WAREHOUSE/report.html

Spark's executors write a run's Parquet files into staging; the driver checks them and
decides the run: it writes ``commit.json`` (atomically, by a rename), which lists every
file each table adds and removes, each with its rows and statistics, and the segment
states the run reaches. From then on the run happens, whoever finishes it: the files are
moved into the table directories (a file no Delta commit names is invisible to every
reader), then each table gets one Delta commit (``create_write_transaction`` with add and
remove actions) carrying the application transaction ``(app id of the warehouse, run
number)``, ``frames`` last, then the ``progress`` table is overwritten with the new
segment states under the same transaction. A run killed before ``commit.json`` exists
left nothing a reader can see: the next run deletes its staging and reads those byte
ranges again. A run killed after it is finished by the next one (:meth:`Warehouse.recover`):
a table whose transaction version already is the run's is not committed twice, so no
record is lost or added twice. Delta Lake has no multi-table commit: for the moments
between two of a run's commits a reader can see a run's rows in one table and not yet
in another (each table alone is always a whole version).

The application id is ``jet-ingest-<id of the progress table>``: one per warehouse.

Readers: :func:`tools.ingest.read_table` (a version or a time, else the latest), any Delta
Lake reader (delta-rs, polars, Spark with delta-spark, DuckDB). Files removed by a
compaction stay on disk for older versions: a plain Parquet reader of a table directory
would count them twice.

The progress table keys every log segment by its identity from the header (daemon name,
``created_ns``, segment number, header CRC), not by its path: a segment renamed or moved
to an archive directory is known as the one already ingested. The warehouse must be
visible at the same path to the driver and every Spark executor.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Optional

__all__ = [
    "CRASH_ENV",
    "TABLES",
    "FileState",
    "SchemaChangeError",
    "Warehouse",
    "WarehouseError",
    "crash_point",
    "history",
    "history_notes",
    "locked",
    "migrate",
    "new_run_id",
    "segment_key",
    "table_schema",
]

TABLES = ("frames", "requests", "state_changes", "connections", "traffic")
# The order of a run's commits: frames last, then progress (module docstring).
COMMIT_ORDER = ("requests", "state_changes", "connections", "traffic", "frames")
CRASH_ENV = "JET_INGEST_CRASH_AT"  # tests: os._exit(86) at the named point (crash_point)
PLAN_VERSION = 1


class WarehouseError(ValueError):
    """The warehouse is not one this jet-ingest can continue, or an ingest cannot be
    committed safely (says why)."""


class SchemaChangeError(WarehouseError):
    """A run's files do not fit their table's schema in a way Delta Lake schema
    evolution allows (only new nullable columns are added): a column's type changed,
    a column is missing, or a new column is not nullable. Names the table and column;
    raised before the run is decided, so nothing of it is committed."""


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
    commit over each other. No lock where ``fcntl`` is missing.

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
    """The progress key of a segment: its identity from the header (JETLOG.md 2),
    the same wherever the file is moved."""
    return f"{daemon}/{created_ns}/{segment}/{header_crc:08x}"


def bad_header_key(path: str) -> str:
    """The progress key of a file with an invalid header (no identity: by its path)."""
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


def table_schema(name: str) -> Any:
    """The Arrow schema of table ``name`` as Delta Lake holds it: its files' columns
    plus the ``date`` partition column (UTC date)."""
    import pyarrow as pa

    from tools.ingest.derive import CONNECTIONS_SCHEMA
    from tools.ingest.derive import REQUESTS_SCHEMA
    from tools.ingest.derive import STATE_CHANGES_SCHEMA
    from tools.ingest.derive import TRAFFIC_SCHEMA
    from tools.ingest.parse import FRAMES_SCHEMA

    schema = {"frames": FRAMES_SCHEMA, "state_changes": STATE_CHANGES_SCHEMA, "requests": REQUESTS_SCHEMA,
              "connections": CONNECTIONS_SCHEMA, "traffic": TRAFFIC_SCHEMA}[name]
    return schema.append(pa.field("date", pa.date32()))


def _progress_schema() -> Any:
    import pyarrow as pa

    i64, s = pa.int64(), pa.string()
    return pa.schema([("key", s), ("path", s), ("header_crc", i64), ("daemon", s), ("created_ns", i64),
                      ("segment", i64), ("run_ns", i64), ("done", i64), ("since_ns", i64)])


def _file_action(table_dir: Path, rel: str, rows: int) -> dict[str, Any]:
    """What a Delta add action of ``rel`` says: size, partition, time, and statistics
    (numRecords; min, max and null count of the integer columns, from the footer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tools.ingest.derive import NULL_PARTITION

    path = table_dir / rel
    st = path.stat()
    part = Path(rel).parent.name
    value: Optional[str] = part.split("=", 1)[1] if part.startswith("date=") else None
    if value == NULL_PARTITION:
        value = None
    stats: dict[str, Any] = {"numRecords": rows}
    meta = pq.read_metadata(path)
    lows: dict[str, int] = {}
    highs: dict[str, int] = {}
    nulls: dict[str, int] = {}
    schema = meta.schema.to_arrow_schema()
    for col, fld in enumerate(schema):
        if fld.type != pa.int64() or not meta.num_row_groups:
            continue
        per = [meta.row_group(g).column(col).statistics for g in range(meta.num_row_groups)]
        if any(p is None or not p.has_null_count for p in per):
            continue
        nulls[fld.name] = sum(p.null_count for p in per)
        bounded = [p for p in per if p.has_min_max]
        if bounded:
            lows[fld.name] = min(p.min for p in bounded)
            highs[fld.name] = max(p.max for p in bounded)
    stats.update(minValues=lows, maxValues=highs, nullCount=nulls)
    return {"path": rel, "size": st.st_size, "date": value, "mtime": int(st.st_mtime * 1000), "rows": rows,
            "stats": json.dumps(stats)}


@dataclass
class Warehouse:
    """The committed state of a warehouse, read from its Delta tables (module docstring):
    each table's files and rows, the segment states, the carry, and ``version``, the
    number of the last run committed (its application transaction version; 0: none)."""

    root: Path
    files: dict[str, FileState] = field(default_factory=dict)  # segment_key -> state
    tables: dict[str, dict[str, int]] = field(default_factory=dict)  # table -> {relative file: rows}
    version: int = 0
    has_carry: bool = False
    app_id: str = ""

    @property
    def meta(self) -> Path:
        return self.root / "_jet_ingest"

    @property
    def plan_path(self) -> Path:
        return self.meta / "commit.json"

    @property
    def progress(self) -> Path:
        return self.meta / "progress"

    @property
    def carry_dir(self) -> Optional[Path]:
        d = self.meta / "carry" / f"{self.version:08d}"
        return d if self.version and self.has_carry else None

    def rows(self, table: str) -> int:
        """Rows of ``table`` in its latest version."""
        return sum(self.tables.get(table, {}).values())

    @classmethod
    def load(cls, root: Path) -> Warehouse:
        """The committed state of ``root`` (empty if nothing was committed yet). A run
        decided but not finished by a killed process shows as it was before that run
        until a writer calls :meth:`recover`.

        Raises:
            WarehouseError: the warehouse was made by an older jet-ingest (its own
                snapshot layout), or a table is unreadable.
        """
        m = cls(root)
        if (m.meta / "manifest.json").exists():
            raise WarehouseError(f"{root}: made by an older jet-ingest (before snapshots); ingest into a new "
                                 "warehouse")
        if os.path.lexists(m.meta / "current"):
            raise WarehouseError(f"{root}: made by an older jet-ingest (its own snapshot layout, not Delta Lake "
                                 f"tables); convert it in place with: jet-ingest migrate {root}")
        return cls._load_delta(root)

    @classmethod
    def _load_delta(cls, root: Path) -> Warehouse:
        m = cls(root)
        if not (m.progress / "_delta_log").exists():
            return m
        from deltalake import DeltaTable

        try:
            progress = DeltaTable(str(m.progress))
            m.app_id = f"jet-ingest-{progress.metadata().id}"
            m.version = progress.transaction_version(m.app_id) or 0
            rows = progress.to_pyarrow_table().to_pylist()
            for table in TABLES:
                if (root / table / "_delta_log").exists():
                    m.tables[table] = _live_files(DeltaTable(str(root / table)))
        except Exception as exc:  # deltalake raises its own errors, and OSError
            raise WarehouseError(f"{root}: not a readable jet warehouse ({exc})") from None
        for r in rows:
            key = r.pop("key")
            m.files[key] = FileState(**r)
        m.has_carry = (m.meta / "carry" / f"{m.version:08d}").is_dir()
        return m

    # -- commit -------------------------------------------------------------------

    def _create(self) -> None:
        """Create the progress table and the five tables, empty (once)."""
        from deltalake import DeltaTable

        if not (self.progress / "_delta_log").exists():
            self.progress.mkdir(parents=True, exist_ok=True)
            DeltaTable.create(str(self.progress), _progress_schema(), mode="ignore")
        self.app_id = f"jet-ingest-{DeltaTable(str(self.progress)).metadata().id}"
        for table in TABLES:
            if not (self.root / table / "_delta_log").exists():
                (self.root / table).mkdir(parents=True, exist_ok=True)
                DeltaTable.create(str(self.root / table), table_schema(table), partition_by=["date"], mode="ignore")

    def publish(self, staged: list[tuple[Path, str]], run_id: str, states: dict[str, FileState], *,
                drop: Callable[[str, str], bool] = lambda table, rel: False,
                added_rows: Optional[dict[str, dict[str, int]]] = None,
                carry: Optional[Path] = None, point: str = "") -> int:
        """Commit, per table, its current files except those ``drop(table, relative
        path)`` names, plus, for each ``(directory, prefix)`` of ``staged``, the Parquet
        files under ``directory/<table>/`` (renamed ``<prefix>-<run id>-<name>``).
        With segment ``states`` or a ``carry`` directory it is an ingest run: its
        commits carry the application transaction (app id, :attr:`version` + 1), the
        progress table gets ``states`` merged over the current ones, and the carry
        becomes ``carry`` (else stays). Without them (a compaction) the tables' commits
        change no data and no progress. ``added_rows`` gives the rows of files of the
        first staged directory ({table: {path relative to ``directory/<table>``: rows}})
        when the caller has checked them; other files' footers are read. Returns the
        number of files added. On return every commit is made and ``self`` describes
        the warehouse.

        Crash points (``point`` prefixes them): ``planned`` (decided), then
        ``columns-<table>`` after a table's schema gained the run's new columns,
        ``committed-<table>`` after each table's commit, ``committed`` at the end.

        Raises:
            SchemaChangeError: a table's files do not fit its schema (:func:`new_columns`);
                nothing is decided.
        """
        import pyarrow.parquet as pq

        self._create()
        is_run = bool(states) or carry is not None
        version = self.version + 1 if is_run else self.version
        plan: dict[str, Any] = {"plan": PLAN_VERSION, "run": run_id, "version": version, "is_run": is_run,
                                "moves": [], "tables": {}}
        added = 0
        for table in TABLES:
            removes = [rel for rel in self.tables.get(table, {}) if drop(table, rel)]
            adds: list[tuple[str, int]] = []
            sources: list[Path] = []
            for i, (staging, prefix) in enumerate(staged):
                known = (added_rows or {}).get(table, {}) if i == 0 else {}
                src_dir = staging / table
                for f in sorted(src_dir.rglob("*.parquet")) if src_dir.exists() else []:
                    rel_src = f.relative_to(src_dir)
                    rel = str(rel_src.parent / f"{prefix}-{run_id}-{f.name}")
                    rows = known.get(str(rel_src))
                    adds.append((rel, rows if rows is not None else pq.read_metadata(f).num_rows))
                    plan["moves"].append([str(f), str(self.root / table / rel)])
                    sources.append(f)
                    added += 1
            # Checked before the run is decided: a file that does not fit is refused
            # with nothing committed; new nullable columns are added to the table first.
            columns = new_columns(table, self.root / table, sources, compaction=not is_run)
            plan["tables"][table] = {"add": adds, "remove": removes, "columns": columns}
        if is_run:
            files = dict(self.files)
            files.update(states)
            plan["files"] = {k: s.to_json() for k, s in sorted(files.items())}
            carry_to = self.meta / "carry" / f"{version:08d}"
            carried = carry if carry is not None else self.carry_dir
            if carried is not None and carried.exists():
                for f in sorted(carried.iterdir()):
                    # A new carry is moved in; the current one is kept by hard links.
                    plan["moves"].append([str(f), str(carry_to / f.name), "move" if carry is not None else "link"])
            plan["carry"] = carried is not None
            # The segments this run read further (or found moved): what its commits cover.
            plan["segments"] = [f"{s.path}:{s.done}" for k, s in sorted(states.items()) if self.files.get(k) != s]
        tmp = self.meta / f".commit.{run_id}.tmp"
        with open(tmp, "w") as fh:
            json.dump(plan, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.plan_path)  # the run is decided: from here on it happens
        _fsync_dir(self.meta)
        crash_point(f"{point}planned")
        self._apply(plan, point)
        return added

    def _apply(self, plan: dict[str, Any], point: str = "") -> None:
        """Make the commits ``plan`` decided, skipping those already made (a killed run's
        plan is applied again by the next one), then forget the plan."""
        from deltalake import DeltaTable
        from deltalake import Transaction
        from deltalake.transaction import AddAction
        from deltalake.transaction import CommitProperties
        from deltalake.transaction import RemoveAction

        self._create()
        for move in plan["moves"]:
            src, dest = Path(move[0]), Path(move[1])
            if os.path.lexists(dest):
                continue  # done before the crash
            if not os.path.lexists(src):
                raise WarehouseError(f"{src}: the decided run's file is gone; the warehouse cannot be completed")
            dest.parent.mkdir(parents=True, exist_ok=True)
            if len(move) > 2 and move[2] == "link":
                os.link(src, dest)
            else:
                os.replace(src, dest)
        version, is_run, run_id = int(plan["version"]), bool(plan["is_run"]), str(plan["run"])
        txn = [Transaction(self.app_id, version)] if is_run else None
        for table in COMMIT_ORDER:
            actions = plan["tables"][table]
            if not actions["add"] and not actions["remove"]:
                continue
            if actions.get("columns"):
                _add_columns(self.root / table, actions["columns"], run_id)
                crash_point(f"{point}columns-{table}")
            dt = DeltaTable(str(self.root / table))
            live = _live_files(dt)
            if is_run:
                if (dt.transaction_version(self.app_id) or 0) >= version:
                    continue  # committed before the crash
            elif all(rel in live for rel, _ in actions["add"]) and not any(rel in live for rel in actions["remove"]):
                continue  # a compaction committed before the crash
            now = int(time.time() * 1000)
            adds = [_file_action(self.root / table, rel, rows) for rel, rows in actions["add"]]
            add_actions: list[Any] = [AddAction(a["path"], a["size"], {"date": a["date"]}, a["mtime"], is_run,
                                                a["stats"]) for a in adds]
            removes = [RemoveAction(rel, is_run, now, partition_values={"date": _partition_of(rel)})
                       for rel in actions["remove"] if rel in live]
            metadata = {"jet.run": run_id, "jet.operation": "ingest" if is_run else "compact",
                        "jet.records": sum(rows for _, rows in actions["add"]),
                        "jet.files_added": len(adds), "jet.files_removed": len(removes)}
            if is_run and table == "frames":
                metadata["jet.segments"] = plan.get("segments", [])
            dt.create_write_transaction(add_actions + removes, "append", dt.schema(), partition_by=["date"],
                                        commit_properties=CommitProperties(custom_metadata=metadata,
                                                                           app_transactions=txn))
            crash_point(f"{point}committed-{table}")
        if is_run:
            import pyarrow as pa
            from deltalake import write_deltalake

            progress = DeltaTable(str(self.progress))
            if (progress.transaction_version(self.app_id) or 0) < version:
                rows = [{"key": k, **s} for k, s in plan["files"].items()]
                write_deltalake(progress, pa.Table.from_pylist(rows, _progress_schema()), mode="overwrite",
                                commit_properties=CommitProperties(custom_metadata={"jet.run": run_id},
                                                                   app_transactions=txn))
        self.plan_path.unlink(missing_ok=True)
        _fsync_dir(self.meta)
        crash_point(f"{point}committed")
        fresh = Warehouse._load_delta(self.root)
        self.files, self.tables, self.version, self.has_carry, self.app_id = (
            fresh.files, fresh.tables, fresh.version, fresh.has_carry, fresh.app_id)
        self._remove_old_carry()

    def _remove_old_carry(self) -> None:
        carry = self.meta / "carry"
        if carry.exists():
            for d in carry.iterdir():
                if d.name != f"{self.version:08d}":
                    shutil.rmtree(d, ignore_errors=True)

    # -- recovery -----------------------------------------------------------------

    def recover(self) -> int:
        """Finish a run a killed process decided (its ``commit.json``), and delete what
        runs that were never decided left (staging); returns how many runs' leftovers
        were dealt with. Only a writer holding the lock calls this."""
        dealt = 0
        if self.plan_path.exists():
            plan = json.loads(self.plan_path.read_text())
            if plan.get("plan") != PLAN_VERSION:
                raise WarehouseError(f"{self.plan_path}: unknown plan version {plan.get('plan')!r}")
            self._apply(plan)
            dealt += 1
        staging = self.meta / "staging"
        if staging.exists():
            dealt += sum(1 for _ in staging.iterdir())
            shutil.rmtree(staging, ignore_errors=True)
        for p in self.meta.glob(".commit.*.tmp") if self.meta.exists() else []:
            p.unlink(missing_ok=True)
        return dealt


def _type_name(delta_type: Any) -> str:
    return str(getattr(delta_type, "type", delta_type))


def new_columns(table: str, table_dir: Path, files: Iterable[Path], *, compaction: bool = False) -> list[str]:
    """The columns ``files`` (Parquet files a run adds to Delta table ``table`` at
    ``table_dir``) have and the table has not: their Delta field JSON, to be added to
    the table's schema before the files are committed (Delta Lake schema evolution:
    rows of older files read them as null). A ``compaction``'s files may lack columns
    added after the files they gather were written (they read as null, as before).

    Raises:
        SchemaChangeError: a file lacks a column of the table, has one of another type,
            or a new column that is not nullable (older rows could not be null).
    """
    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake import Schema

    have = {f.name: f for f in DeltaTable(str(table_dir)).schema().fields if f.name != "date"}
    added: dict[str, Any] = {}
    for path in files:
        fields = Schema.from_arrow(pq.read_schema(path)).fields
        for fld in fields:
            known = have.get(fld.name) or added.get(fld.name)
            if known is None:
                if not fld.nullable:
                    raise SchemaChangeError(
                        f"{table}: new column {fld.name!r} ({_type_name(fld.type)}) is not nullable, so the "
                        f"table's older rows cannot have it (in {path.name}); nothing of this run was committed")
                added[fld.name] = fld
            elif known.type != fld.type:
                raise SchemaChangeError(
                    f"{table}: column {fld.name!r} is {_type_name(known.type)} in the table but "
                    f"{_type_name(fld.type)} in this run's files ({path.name}): Delta Lake schema evolution only "
                    "adds nullable columns; write into a new warehouse. Nothing of this run was committed")
        lacking = sorted(set(have).difference(f.name for f in fields))
        if lacking and not compaction:
            raise SchemaChangeError(
                f"{table}: column {lacking[0]!r} of the table is missing from this run's files ({path.name}): "
                "Delta Lake schema evolution only adds nullable columns; write into a new warehouse. Nothing of "
                "this run was committed")
    return [f.to_json() for f in added.values()]


def _add_columns(table_dir: Path, columns: list[str], run_id: str) -> None:
    """Add the fields ``columns`` (Delta field JSON) that the table lacks to its schema,
    in a commit of its own that changes no data (once: a retried plan finds them)."""
    from deltalake import DeltaTable
    from deltalake import Field
    from deltalake.transaction import CommitProperties

    dt = DeltaTable(str(table_dir))
    have = {f.name for f in dt.schema().fields}
    fields = [f for f in map(Field.from_json, columns) if f.name not in have]
    if fields:
        names = [f"{f.name} {_type_name(f.type)}" for f in fields]
        dt.alter.add_columns(fields, commit_properties=CommitProperties(custom_metadata={
            "jet.run": run_id, "jet.operation": "add columns", "jet.columns": names}))


def _partition_of(rel: str) -> Optional[str]:
    from tools.ingest.derive import NULL_PARTITION

    part = Path(rel).parent.name
    value = part.split("=", 1)[1] if part.startswith("date=") else None
    return None if value == NULL_PARTITION else value


def _live_files(dt: Any) -> dict[str, int]:
    """{relative path: rows} of the files of ``dt``'s version."""
    import pyarrow as pa

    actions = pa.table(dt.get_add_actions(flatten=True))
    paths = actions.column("path").to_pylist()
    rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else [0] * len(paths)
    return {p: int(n or 0) for p, n in zip(paths, rows, strict=True)}


SNAPSHOT_MANIFEST_VERSION = 3  # the last layout before Delta Lake (migrate converts it)


def migrate(root: Path) -> int:
    """Convert a warehouse of the snapshot layout (``_jet_ingest/current`` ->
    ``snapshots/N`` with ``_manifest.json``) in place: the current snapshot's files,
    carry and segment states become one ingest run committed to the five Delta tables
    (no data rewritten: the files are moved), then the old layout is deleted. Safe to
    run again after it was killed. Returns the number of files converted (0: nothing
    left to convert).

    Raises:
        WarehouseError: ``root`` is not a warehouse of that layout, or its manifest is
            unreadable or of another version.
    """
    meta = root / "_jet_ingest"
    current = meta / "current"
    if not os.path.lexists(current):
        if (meta / "progress" / "_delta_log").exists():
            return 0  # converted already
        raise WarehouseError(f"{root}: not a warehouse of the snapshot layout (no _jet_ingest/current)")
    snapshot = meta / "snapshots" / Path(os.readlink(current)).name
    m = Warehouse._load_delta(root)
    m.recover()  # a migration killed after it was decided is finished
    converted = 0
    if not m.version:
        try:
            doc = json.loads((snapshot / "_manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise WarehouseError(f"{snapshot}: not a readable snapshot ({exc})") from None
        if doc.get("version") != SNAPSHOT_MANIFEST_VERSION:
            raise WarehouseError(f"{snapshot}: unknown manifest version {doc.get('version')!r}")
        for table in TABLES:
            if os.path.islink(root / table):
                (root / table).unlink()  # pointed into the snapshots
        states = {k: FileState(**v) for k, v in doc["files"].items()}
        carry = snapshot / "_carry" if doc.get("carry") else root / "_jet_ingest" / "no-carry"
        rows = {t: dict(v) for t, v in doc["tables"].items()}
        converted = m.publish([(snapshot, "migrated")], "migrated", states, added_rows=rows, carry=carry,
                              point="migrate-")
    shutil.rmtree(meta / "snapshots", ignore_errors=True)
    current.unlink()
    _fsync_dir(meta)
    return converted


def history(root: Path) -> list[dict[str, Any]]:
    """Every commit of ``root``'s tables, oldest first: ``table``, its Delta
    ``version``, ``time`` (UTC ``datetime``), ``operation`` (``ingest``, ``compact``, or
    Delta's own name for a commit jet did not make), ``run`` id, ``records`` and
    ``files_added`` / ``files_removed``, for frames commits ``segments``: each log
    segment the run read, as ``path:offset reached``, and for ``add columns`` commits
    (schema evolution) ``columns``: ``name type`` of each column added.

    Raises:
        WarehouseError: ``root`` holds no jet warehouse.
    """
    import datetime

    from deltalake import DeltaTable

    if not (root / "_jet_ingest" / "progress" / "_delta_log").exists():
        raise WarehouseError(f"{root}: not a jet warehouse (nothing ingested yet?)")
    rows: list[dict[str, Any]] = []
    for table in TABLES:
        if not (root / table / "_delta_log").exists():
            continue
        for h in DeltaTable(str(root / table)).history():
            if h.get("operation") == "CREATE TABLE":
                continue
            rows.append({"table": table, "version": int(h["version"]),
                         "time": datetime.datetime.fromtimestamp(h["timestamp"] / 1000, datetime.UTC),
                         "operation": h.get("jet.operation", h.get("operation")), "run": h.get("jet.run"),
                         "records": h.get("jet.records"), "files_added": h.get("jet.files_added"),
                         "files_removed": h.get("jet.files_removed"), "segments": list(h.get("jet.segments", [])),
                         "columns": list(h.get("jet.columns", []))})
    rows.sort(key=lambda r: (r["time"], TABLES.index(r["table"])))
    return rows


def table_path(root: Path, table: str) -> Path:
    """The directory of Delta table ``table`` of ``root``.

    Raises:
        FileNotFoundError: nothing was committed yet.
    """
    path = root / table
    if not (path / "_delta_log").exists():
        raise FileNotFoundError(f"{root}: nothing ingested yet")
    return path
