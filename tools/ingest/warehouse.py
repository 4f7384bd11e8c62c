"""The warehouse layout and its manifest: what has been ingested, so nothing is twice.

    WAREHOUSE/{frames,requests,state_changes,connections,traffic}/date=YYYY-MM-DD/run-<id>-....parquet
                                                                   (appended per run)
    WAREHOUSE/{requests,connections}/date=.../snap-<id>-....parquet  (replaced per run)
    WAREHOUSE/_jet_ingest/manifest.json                            (the commit point)
    WAREHOUSE/_jet_ingest/carry/<id>/                              (handed to the next run)
    WAREHOUSE/report.html

An ingest run writes into ``_jet_ingest/staging/<id>/``, moves the files into the tables
under names that carry the run id, writes its carry (:class:`tools.ingest.derive.Carry`),
then replaces the manifest atomically (write + ``os.replace``): that is its commit. The
manifest lists committed run ids, the current carry (whose id also names the current
snapshot files: requests still open, and the connections table) and, per log file (by
absolute path and header CRC), the offset after the last record ingested. A run that
died before its commit leaves files of an uncommitted id, which the next run deletes
first; a run that died just after it leaves the previous snapshot, deleted the same way.
The warehouse must be a filesystem path every Spark executor can write (local, or a
shared mount on a cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tools.ingest.parse import JetlogError, read_header

__all__ = ["FileState", "Manifest", "WarehouseError", "header_identity", "locked", "new_run_id"]

MANIFEST_VERSION = 2
TABLES = ("frames", "requests", "state_changes", "connections", "traffic")


class WarehouseError(ValueError):
    """The warehouse is not one this jet-ingest can continue (says why)."""


@contextmanager
def locked(root: Path) -> Iterator[None]:
    """Hold ``root``'s lock (``_jet_ingest/lock``, an advisory ``flock``) while one
    jet-ingest writes it: two at once would delete each other's staged files and
    overwrite each other's manifest and carry. No lock where ``fcntl`` is missing.

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
    """A fresh, sortable-enough ingest run id."""
    return uuid.uuid4().hex[:12]


def header_identity(path: str) -> Optional[tuple[int, str, int, int, int]]:
    """(header CRC, daemon, created_ns, segment, header size) of a segment, None if the
    header is incomplete or invalid."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64 * 1024 + 64)
        header = read_header(head)
    except (OSError, JetlogError):
        return None
    if header is None:
        return None
    (crc,) = struct.unpack_from(">I", head, header.size - 4)
    return crc, header.name, header.created_ns, header.segment, header.size


@dataclass
class FileState:
    """What the warehouse holds of one log file."""

    header_crc: int
    daemon: str
    created_ns: int
    segment: int
    run_ns: int
    done: int  # offset after the last record ingested

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Manifest:
    """The committed state of a warehouse (see the module docstring)."""

    root: Path
    files: dict[str, FileState] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)
    carry: Optional[str] = None  # the run whose carry and snapshot files are current

    @property
    def path(self) -> Path:
        return self.root / "_jet_ingest" / "manifest.json"

    @classmethod
    def load(cls, root: Path) -> Manifest:
        """Read the manifest of ``root`` (empty if there is none yet).

        Raises:
            WarehouseError: if the manifest exists but is not one this version wrote, or
                names a carry that is missing.
        """
        m = cls(root)
        if m.path.exists():
            doc = json.loads(m.path.read_text())
            if doc.get("version") == 1:
                raise WarehouseError(f"{m.root}: made by an older jet-ingest that rebuilt its derived tables from "
                                 "frames on every run; ingest into a new warehouse")
            if doc.get("version") != MANIFEST_VERSION:
                raise WarehouseError(f"{m.path}: unknown manifest version {doc.get('version')!r}")
            m.files = {p: FileState(**s) for p, s in doc["files"].items()}
            m.runs = list(doc["runs"])
            m.carry = doc.get("carry")
            if m.carry and not (m.root / "_jet_ingest" / "carry" / m.carry).is_dir():
                raise WarehouseError(f"{m.root}: the state carried from ingest run {m.carry} is missing "
                                     f"(_jet_ingest/carry/{m.carry}); the derived tables cannot be continued")
        return m

    def save(self) -> None:
        """Atomically replace the manifest: the commit point of a run."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": MANIFEST_VERSION, "files": {p: s.to_json() for p, s in sorted(self.files.items())},
               "runs": self.runs, "carry": self.carry}
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def remove_uncommitted(self) -> int:
        """Delete files left by runs that never committed; returns how many."""
        committed = set(self.runs)
        removed = self._remove_tables_files("run", lambda run: run not in committed)
        shutil.rmtree(self.root / "_jet_ingest" / "staging", ignore_errors=True)
        self.remove_stale()
        return removed

    def remove_stale(self) -> None:
        """Delete snapshot files and carries other than the current ones."""
        self._remove_tables_files("snap", lambda run: run != self.carry)
        carries = self.root / "_jet_ingest" / "carry"
        if carries.exists():
            for d in carries.iterdir():
                if d.name != self.carry:
                    shutil.rmtree(d, ignore_errors=True)

    def _remove_tables_files(self, prefix: str, doomed: Callable[[str], bool]) -> int:
        """Delete the tables' ``<prefix>-<run id>-...`` files whose run id is ``doomed``."""
        removed = 0
        for table in TABLES:
            directory = self.root / table
            if directory.exists():
                for f in directory.rglob(f"{prefix}-*"):
                    if doomed(f.name.split("-", 2)[1]):
                        f.unlink()
                        removed += 1
        return removed


def move_staged(staging: Path, table_dir: Path, run_id: str, *, prefix: str = "run") -> int:
    """Move the Parquet files of a staged table into ``table_dir``, keeping the
    partition directories and prefixing names with ``<prefix>-<run id>-``. Returns the
    file count."""
    moved = 0
    for f in staging.rglob("*.parquet"):
        rel = f.relative_to(staging)
        dest = table_dir / rel.parent / f"{prefix}-{run_id}-{f.name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f, dest)
        moved += 1
    return moved
