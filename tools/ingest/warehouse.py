"""The warehouse layout and its manifest: what has been ingested, so nothing is twice.

    WAREHOUSE/frames/date=YYYY-MM-DD/run-<id>-part-....parquet   (appended per run)
    WAREHOUSE/{state_changes,requests,connections}/date=.../      (rebuilt from frames)
    WAREHOUSE/_jet_ingest/manifest.json                            (the commit point)
    WAREHOUSE/report.html

An ingest run writes its frames into ``_jet_ingest/staging/<id>/``, moves the files into
``frames/`` under names that carry the run id, then replaces the manifest atomically
(write + ``os.replace``): that is its commit. The manifest lists committed run ids and,
per log file (by absolute path and header CRC), the offset after the last record
ingested. A run that died before its commit leaves files of an uncommitted run id,
which the next run deletes first. The warehouse must be a filesystem path every Spark
executor can write (local, or a shared mount on a cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from tools.ingest.parse import JetlogError, read_header

__all__ = ["FileState", "Manifest", "header_identity", "new_run_id"]

MANIFEST_VERSION = 1


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

    @property
    def path(self) -> Path:
        return self.root / "_jet_ingest" / "manifest.json"

    @classmethod
    def load(cls, root: Path) -> Manifest:
        """Read the manifest of ``root`` (empty if there is none yet).

        Raises:
            ValueError: if the manifest exists but is not one this version wrote.
        """
        m = cls(root)
        if m.path.exists():
            doc = json.loads(m.path.read_text())
            if doc.get("version") != MANIFEST_VERSION:
                raise ValueError(f"{m.path}: unknown manifest version {doc.get('version')!r}")
            m.files = {p: FileState(**s) for p, s in doc["files"].items()}
            m.runs = list(doc["runs"])
        return m

    def save(self) -> None:
        """Atomically replace the manifest: the commit point of a run."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"version": MANIFEST_VERSION, "files": {p: s.to_json() for p, s in sorted(self.files.items())},
               "runs": self.runs}
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    def remove_uncommitted(self) -> int:
        """Delete frame files left by runs that never committed; returns how many."""
        removed = 0
        frames = self.root / "frames"
        if frames.exists():
            committed = set(self.runs)
            for f in frames.rglob("run-*"):
                run = f.name.split("-", 2)[1]
                if run not in committed:
                    f.unlink()
                    removed += 1
        shutil.rmtree(self.root / "_jet_ingest" / "staging", ignore_errors=True)
        return removed


def move_staged(staging: Path, table_dir: Path, run_id: str) -> int:
    """Move the Parquet files of a staged table into ``table_dir``, keeping the
    partition directories and prefixing names with the run id. Returns the file count."""
    moved = 0
    for f in staging.rglob("*.parquet"):
        rel = f.relative_to(staging)
        dest = table_dir / rel.parent / f"run-{run_id}-{f.name}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(f, dest)
        moved += 1
    return moved


def replace_dir(new: Path, old: Path) -> None:
    """Put directory ``new`` in place of ``old`` (rename, then delete the previous one)."""
    trash = old.with_name(f".{old.name}.old-{uuid.uuid4().hex[:6]}")
    if old.exists():
        os.replace(old, trash)
    os.replace(new, old)
    shutil.rmtree(trash, ignore_errors=True)
