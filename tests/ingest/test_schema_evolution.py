"""Schema evolution of the warehouse's Delta tables (issue 31): a newer jet that adds a
nullable column appends to an existing table and the older rows read as null; a
change Delta Lake cannot append (a column's type changed, a column dropped) is refused
with the table and column named, and nothing of that run is committed.

A "newer jet" is simulated by ``$JET_INGEST_TEST_COLUMN``
(:func:`tools.ingest.derive.with_test_column`): the run's files of one table get a column
more (filled), a column of another type, or one column less. The ingest runs its tasks
in this process (``ingest_once(None, ...)``) or in a subprocess (crashes); what readers
see is read with delta-rs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from rich.console import Console

from tools.ingest.cli import ingest_once
from tools.ingest.derive import TEST_COLUMN_ENV
from tools.ingest.session import REPO_ROOT
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import write_synthetic_log
from tools.ingest.warehouse import CRASH_ENV
from tools.ingest.warehouse import TABLES
from tools.ingest.warehouse import SchemaChangeError
from tools.ingest.warehouse import Warehouse
from tools.ingest.warehouse import history

QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115 (lives as long as the module)
NOTE = "written by a newer jet"  # what with_test_column fills a new string column with


def _segment(logs: Path, i: int, records: int = 60) -> int:
    """Writes segment ``i``; returns its records."""
    logs.mkdir(exist_ok=True)
    return write_synthetic_log(str(logs / f"jet-{i:03d}.jetlog"), records, segment=i, start_ns=BASE_NS + i * 10**10)


def _frames(wh: Path, version: int | None = None) -> pa.Table:
    return DeltaTable(str(wh / "frames"), version=version).to_pyarrow_table()


def _versions(wh: Path) -> dict[str, int]:
    return {t: DeltaTable(str(wh / t)).version() for t in TABLES}


@pytest.fixture
def old_warehouse(tmp_path: Path) -> tuple[Path, Path, int]:
    """A warehouse written by the current schema: two segments, one run."""
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    _segment(logs, 0)
    _segment(logs, 1)
    first = ingest_once(None, str(logs), wh, console=QUIET)
    assert first > 0
    return logs, wh, first


def test_a_new_nullable_column_is_added_and_older_rows_read_null(old_warehouse: tuple[Path, Path, int],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    logs, wh, first = old_warehouse
    before = DeltaTable(str(wh / "frames")).version()
    _segment(logs, 2)
    monkeypatch.setenv(TEST_COLUMN_ENV, "frames:ingest_note:string")
    second = ingest_once(None, str(logs), wh, console=QUIET)
    assert second > 0
    t = _frames(wh)
    assert "ingest_note" in t.column_names and t.num_rows == first + second
    notes = t.column("ingest_note").to_pylist()
    files = [Path(f).name for f in t.column("file").to_pylist()]
    old_rows = [n for n, f in zip(notes, files, strict=True) if f != "jet-002.jetlog"]
    new_rows = [n for n, f in zip(notes, files, strict=True) if f == "jet-002.jetlog"]
    assert len(old_rows) == first and set(old_rows) == {None}
    assert len(new_rows) == second and set(new_rows) == {NOTE}
    # The older version is read as it was: without the column.
    assert "ingest_note" not in _frames(wh, before).column_names and _frames(wh, before).num_rows == first
    # The other tables kept their schema; history says what changed, and when.
    for table in TABLES[1:]:
        assert "ingest_note" not in DeltaTable(str(wh / table)).schema().to_arrow().names
    changes = [c for c in history(wh) if c["operation"] == "add columns"]
    assert [(c["table"], c["columns"], c["version"]) for c in changes] == [("frames", ["ingest_note string"],
                                                                            before + 1)]
    ingest = [c for c in history(wh) if c["table"] == "frames" and c["operation"] == "ingest"]
    assert ingest[-1]["version"] == before + 2 and ingest[-1]["records"] == second
    done = subprocess.run([sys.executable, "-m", "tools.ingest", "history", str(wh)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT}, timeout=120, check=False)
    assert done.returncode == 0 and "+ column ingest_note string" in done.stdout, done
    # A later run of the same (newer) jet appends as usual; a compaction keeps the nulls.
    _segment(logs, 3)
    third = ingest_once(None, str(logs), wh, console=QUIET)
    m = Warehouse.load(wh)
    from tools.ingest.pipeline import compact

    assert compact(m, min_files=2) > 0
    t = _frames(wh)
    assert t.num_rows == first + second + third
    assert t.column("ingest_note").null_count == first


@pytest.mark.parametrize("change, column", [("frames:size:string", "size"), ("frames:-value_text", "value_text"),
                                            ("traffic:records:string", "records")])
def test_an_incompatible_change_names_table_and_column_and_commits_nothing(
        old_warehouse: tuple[Path, Path, int], monkeypatch: pytest.MonkeyPatch, change: str, column: str) -> None:
    logs, wh, first = old_warehouse
    versions, progress = _versions(wh), Warehouse.load(wh).files
    _segment(logs, 2)
    monkeypatch.setenv(TEST_COLUMN_ENV, change)
    table = change.split(":")[0]
    with pytest.raises(SchemaChangeError, match=rf"^{table}: column '{column}' .*Nothing of this run was committed"):
        ingest_once(None, str(logs), wh, console=QUIET)
    assert _versions(wh) == versions and Warehouse.load(wh).files == progress
    assert not (wh / "_jet_ingest" / "commit.json").exists()
    assert _frames(wh).num_rows == first
    # The same jet as before goes on where the warehouse stands.
    monkeypatch.delenv(TEST_COLUMN_ENV)
    second = ingest_once(None, str(logs), wh, console=QUIET)
    assert _frames(wh).num_rows == first + second and second > 0


def test_a_column_the_table_gained_cannot_be_dropped_by_an_older_jet(old_warehouse: tuple[Path, Path, int],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    logs, wh, _ = old_warehouse
    _segment(logs, 2)
    monkeypatch.setenv(TEST_COLUMN_ENV, "frames:ingest_note:string")
    ingest_once(None, str(logs), wh, console=QUIET)
    versions = _versions(wh)
    monkeypatch.delenv(TEST_COLUMN_ENV)
    _segment(logs, 3)
    with pytest.raises(SchemaChangeError, match=r"^frames: column 'ingest_note' of the table is missing"):
        ingest_once(None, str(logs), wh, console=QUIET)
    assert _versions(wh) == versions


@pytest.mark.parametrize("point", ["planned", "columns-frames", "committed-frames"])
def test_a_crash_around_the_schema_change_adds_the_column_and_rows_once(
        old_warehouse: tuple[Path, Path, int], point: str) -> None:
    logs, wh, first = old_warehouse
    second = _segment(logs, 2)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, TEST_COLUMN_ENV: "frames:ingest_note:string", CRASH_ENV: point}
    code = "import sys; from pathlib import Path; from tools.ingest.cli import ingest_once; " \
           "ingest_once(None, sys.argv[1], Path(sys.argv[2]))"
    done = subprocess.run([sys.executable, "-c", code, str(logs), str(wh)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 86, done
    t = _frames(wh)
    assert t.num_rows == (first + second if point == "committed-frames" else first)
    # The next writer (the same newer jet) finishes the decided run: one schema change, rows once.
    env.pop(CRASH_ENV)
    done = subprocess.run([sys.executable, "-c", code, str(logs), str(wh)], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done
    t = _frames(wh)
    keys = list(zip(t.column("file").to_pylist(), t.column("offset").to_pylist(), strict=True))
    assert len(keys) == len(set(keys))
    assert t.column("ingest_note").null_count == first and t.num_rows == first + second
    assert [c["columns"] for c in history(wh) if c["operation"] == "add columns"] == [["ingest_note string"]]


@pytest.mark.spark
def test_read_table_reads_each_version_with_its_own_schema(spark: Any, old_warehouse: tuple[Path, Path, int],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from tools.ingest import read_table

    logs, wh, first = old_warehouse
    before = DeltaTable(str(wh / "frames")).version()
    second = _segment(logs, 2)
    monkeypatch.setenv(TEST_COLUMN_ENV, "frames:ingest_note:string")
    ingest_once(None, str(logs), wh, console=QUIET)
    old = read_table(spark, wh, "frames", version=before)
    assert "ingest_note" not in old.columns and old.count() == first
    now = read_table(spark, wh, "frames")
    notes = {r["ingest_note"]: r["n"] for r in now.groupBy("ingest_note").count().withColumnRenamed("count", "n")
             .collect()}
    assert notes == {None: first, NOTE: second}


@pytest.mark.spark
def test_jet_ingest_exits_1_naming_table_and_column_and_commits_nothing(old_warehouse: tuple[Path, Path, int]) -> None:
    """The command line (Spark, local[1]) with a run whose ``frames`` files change a column's type."""
    logs, wh, first = old_warehouse
    versions = _versions(wh)
    _segment(logs, 2)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300", TEST_COLUMN_ENV: "frames:size:string",
           "JET_INGEST_CDS": "0"}
    done = subprocess.run([sys.executable, "-m", "tools.ingest", str(logs), "--out", str(wh), "--master", "local[1]",
                           "--no-report"], env=env, capture_output=True, text=True, timeout=900, check=False)
    out = " ".join(done.stdout.split())
    assert done.returncode == 1, (out, done.stderr[-3000:])
    assert "jet-ingest: frames: column 'size' is long in the table but string in this run's files" in out, out
    assert "nothing of this run was committed" in out and "Traceback" not in out + done.stderr
    assert _versions(wh) == versions and _frames(wh).num_rows == first
