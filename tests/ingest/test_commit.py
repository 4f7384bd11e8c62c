"""JVM-free tests of jet-ingest's commit: Delta Lake commits decided by one rename and
finished by whoever comes next, crashes at every step of it, segments known by their
header identity, the checks of what tasks report, compaction, and the command line
that needs no JVM.

The ingest runs its tasks in this process (``ingest_once(None, ...)``); what readers see
is read with delta-rs (``deltalake``), as any Delta Lake reader would.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from rich.console import Console

from tools.ingest.cli import ingest_once
from tools.ingest.pipeline import IngestError
from tools.ingest.pipeline import check_reports
from tools.ingest.pipeline import compact
from tools.ingest.session import REPO_ROOT
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import write_synthetic_log
from tools.ingest.warehouse import COMMIT_ORDER
from tools.ingest.warehouse import CRASH_ENV
from tools.ingest.warehouse import TABLES
from tools.ingest.warehouse import Warehouse
from tools.ingest.warehouse import WarehouseError

QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115 (lives as long as the module)


def _segments(logs: Path, first: int, last: int, records: int = 100) -> None:
    logs.mkdir(exist_ok=True)
    for i in range(first, last):
        write_synthetic_log(str(logs / f"jet-{i:03d}.jetlog"), records, segment=i, start_ns=BASE_NS + i * 10**10)


def visible(warehouse: Path, table: str = "frames") -> pa.Table:
    """What a Delta Lake reader of ``WAREHOUSE/<table>`` sees (its latest version)."""
    if not (warehouse / table / "_delta_log").exists():
        return pa.table({"file": pa.array([], pa.string()), "offset": pa.array([], pa.int64())})
    return DeltaTable(str(warehouse / table)).to_pyarrow_table()


def live_files(warehouse: Path, table: str) -> list[str]:
    """The Parquet files of the latest version of ``table``."""
    return files_of(DeltaTable(str(warehouse / table)))


def files_of(dt: DeltaTable) -> list[str]:
    return list(pa.table(dt.get_add_actions()).column("path").to_pylist())


def frame_keys(warehouse: Path) -> list[tuple[str, int]]:
    """(segment file name, offset) of every frames row a reader sees."""
    t = visible(warehouse)
    return [(Path(f).name, o) for f, o in zip(t.column("file").to_pylist(), t.column("offset").to_pylist(),
                                               strict=True)]


def test_a_renamed_or_archived_segment_is_not_ingested_again(tmp_path: Path) -> None:
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    _segments(logs, 0, 3)
    added = ingest_once(None, str(logs), wh, console=QUIET)
    assert added == len(frame_keys(wh)) > 0
    # Rotated by hand, and a copy left in the directory: both are the same segment.
    os.rename(logs / "jet-001.jetlog", logs / "jet-001.jetlog.1")
    shutil.copy(logs / "jet-002.jetlog", logs / "archived-002")
    assert ingest_once(None, str(logs), wh, console=QUIET) == 0
    assert len(frame_keys(wh)) == added
    for name in TABLES[1:]:
        t = visible(wh, name)
        assert t.num_rows == visible(wh, name).num_rows  # settles
    paths = {s.path for s in Warehouse.load(wh).files.values()}
    assert str(logs / "jet-001.jetlog.1") in paths and str(logs / "jet-001.jetlog") not in paths
    # The renamed segment goes on growing (jetd still writes it): only the new bytes count.
    whole = tmp_path / "whole.jetlog"
    n = write_synthetic_log(str(whole), 150, segment=3, start_ns=BASE_NS + 3 * 10**10)
    data = whole.read_bytes()
    (logs / "jet-003.jetlog").write_bytes(data[: len(data) // 2])
    first = ingest_once(None, str(logs), wh, console=QUIET)
    os.rename(logs / "jet-003.jetlog", logs / "old-003")
    (logs / "old-003").write_bytes(data)
    second = ingest_once(None, str(logs), wh, console=QUIET)
    assert first + second == n
    keys = frame_keys(wh)
    assert len(keys) == len(set(keys)) == added + n


def test_a_segment_that_shrank_is_an_error(tmp_path: Path) -> None:
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    _segments(logs, 0, 1)
    ingest_once(None, str(logs), wh, console=QUIET)
    seg = logs / "jet-000.jetlog"
    os.rename(seg, logs / "moved")
    (logs / "moved").write_bytes((logs / "moved").read_bytes()[:-500])
    with pytest.raises(WarehouseError, match="shrank"):
        ingest_once(None, str(logs), wh, console=QUIET)


# Before the tasks write Parquet files (tasks), before the run is decided (staged,
# merged), once it is (planned), after each of its Delta commits (frames last), after
# the progress commit; then the same for the compaction that follows it.
CRASH_POINTS = ["tasks", "staged", "merged", "planned", *[f"committed-{t}" for t in COMMIT_ORDER], "committed",
                "compact-staged", "compact-planned", "compact-committed-requests", "compact-committed-frames",
                "compact-committed"]
_INGEST = "import sys; from pathlib import Path; from tools.ingest.cli import ingest_once; " \
          "ingest_once(None, sys.argv[1], Path(sys.argv[2]))"


def _ingest_process(logs: Path, wh: Path, crash_at: str | None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}
    env.pop(CRASH_ENV, None)
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.run([sys.executable, "-c", _INGEST, str(logs), str(wh)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A log directory and a warehouse with one committed run; then ten more segments
    (enough for the next run to compact): the crash tests start from copies of it."""
    base = tmp_path_factory.mktemp("one-run")
    _segments(base / "logs", 0, 4, 40)
    first = ingest_once(None, str(base / "logs"), base / "wh", console=QUIET)
    _segments(base / "logs", 4, 14, 40)
    return base, first


def crashed_warehouse(tmp_path: Path, one_run: tuple[Path, int], point: str) -> tuple[Path, Path, int, int]:
    """The warehouse of ``one_run``, then a second run killed at ``point``.
    Returns (logs, warehouse, rows of the first run, rows of both)."""
    base, first = one_run
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    shutil.copytree(base / "logs", logs)
    shutil.copytree(base / "wh", wh, symlinks=True)
    # The copied segments lie elsewhere now: known by their headers all the same.
    done = _ingest_process(logs, wh, point)
    assert done.returncode == 86, done  # died at the point
    total = len(frame_keys_of_logs(logs))
    return logs, wh, first, total


def frame_keys_of_logs(logs: Path) -> list[tuple[str, int]]:
    from tools.ingest.parse import read_segment

    return [(f.name, o) for f in sorted(logs.iterdir()) for b in read_segment(str(f))
            for o in b.column("offset").to_pylist()]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_any_point_shows_readers_only_committed_rows(tmp_path: Path, one_run: tuple[Path, int],
                                                               point: str) -> None:
    logs, wh, first, total = crashed_warehouse(tmp_path, one_run, point)
    # Each table alone shows whole versions: frames has the run once its own commit is made.
    committed = point in ("committed-frames", "committed") or point.startswith("compact-")
    keys = frame_keys(wh)
    assert len(keys) == len(set(keys)) == (total if committed else first), point
    decided = point not in ("tasks", "staged", "merged", "compact-staged")
    assert (wh / "_jet_ingest" / "commit.json").exists() == (decided and not point.endswith("committed")), point
    # Every table a reader can reach is one snapshot: the derived rows match the frames.
    requests = visible(wh, "requests")
    ids = list(zip(requests.column("run_ns").to_pylist(), requests.column("requester_conn").to_pylist(),
                   requests.column("request_id").to_pylist(), requests.column("ts_ns").to_pylist(), strict=True))
    assert len(ids) == len(set(ids)), point
    # The next run completes the work, once.
    ingest_once(None, str(logs), wh, console=QUIET)
    keys = frame_keys(wh)
    assert len(keys) == len(set(keys)) == total
    assert set(keys) == set(frame_keys_of_logs(logs))
    assert len(live_files(wh, "frames")) <= 3  # compacted
    assert not (wh / "_jet_ingest" / "staging").exists() or not any((wh / "_jet_ingest" / "staging").iterdir())
    assert not (wh / "_jet_ingest" / "commit.json").exists()
    # Every table and the progress hold the second run's transaction, made once: no
    # table has two commits of it.
    m = Warehouse.load(wh)
    assert m.version == 2 and m.rows("frames") == total
    for table in TABLES:
        dt = DeltaTable(str(wh / table))
        assert dt.transaction_version(m.app_id) == 2, table
        runs = [h.get("jet.run") for h in dt.history() if h.get("jet.operation") == "ingest"]
        assert len(runs) == len(set(runs)), (table, runs)
    # Nothing of a run is on disk that no version of its table names (a crash before the
    # run was decided leaves its files in staging only).
    for table in TABLES:
        on_disk = {str(p.relative_to(wh / table)) for p in (wh / table).rglob("*.parquet")}
        named = set()
        dt = DeltaTable(str(wh / table))
        for v in range(dt.version() + 1):
            named.update(files_of(DeltaTable(str(wh / table), version=v)))
        assert on_disk == named, table


def test_check_reports_refuses_what_the_driver_cannot_see(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    seen = tmp_path / "seen.jetlog"
    seen.write_bytes(b"x")
    ok = {"task": 0, "rows": 0, "files": {}, "missing": [str(tmp_path / "rotated-away.jetlog")]}
    assert check_reports(staging, [ok], 1) == {}  # gone for the driver too: rotated away
    blind = {"task": 0, "rows": 0, "files": {}, "missing": [str(seen)]}
    with pytest.raises(IngestError, match="log directory must be visible at the same path on every executor"):
        check_reports(staging, [blind], 1)
    stranded = {"task": 0, "rows": 5, "files": {"frames": {"date=2026-01-01/part-0.parquet": 5}}, "missing": []}
    with pytest.raises(IngestError, match="warehouse must be a path every executor and the driver share"):
        check_reports(staging, [stranded], 1)
    with pytest.raises(IngestError, match="expected reports from 2 task"):
        check_reports(staging, [ok], 2)
    # One chunk of a segment read, the next one found it gone (renamed mid-run): committing
    # the first chunk's rows would have the next run read them again under the new name.
    gone = str(tmp_path / "renamed-away.jetlog")
    parts = [[(gone, 0, 100, 200)], [(gone, 100, None, 200)]]
    halves = [{"task": 0, "rows": 0, "files": {}, "missing": []}, {"task": 1, "rows": 0, "files": {}, "missing": [gone]}]
    with pytest.raises(IngestError, match="vanished while it was being read"):
        check_reports(staging, halves, 2, parts)
    halves[0]["missing"] = [gone]
    assert check_reports(staging, halves, 2, parts) == {}  # gone before any task read it


def test_compaction_keeps_follow_from_leaving_many_small_files(tmp_path: Path) -> None:
    """Micro-batch-sized runs, one after another, as ``--follow`` makes them."""
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    whole = tmp_path / "whole.jetlog"
    n = write_synthetic_log(str(whole), 1200)
    data = whole.read_bytes()
    logs.mkdir()
    for k in range(1, 13):
        (logs / "jet-0.jetlog").write_bytes(data[: len(data) * k // 12])
        ingest_once(None, str(logs), wh, console=QUIET)
    keys = frame_keys(wh)
    assert len(keys) == len(set(keys)) == n
    for table in TABLES:
        files = live_files(wh, table)
        assert len(files) < 10, (table, len(files))
    m = Warehouse.load(wh)
    assert m.rows("frames") == n
    assert compact(m) == 0  # nothing left to compact
    # A compaction changes no data: its commits say so, and no run's transaction moves.
    frames = DeltaTable(str(wh / "frames"))
    assert frames.transaction_version(m.app_id) == m.version
    compactions = [h for h in frames.history() if h.get("jet.operation") == "compact"]
    assert compactions and all(h["jet.files_removed"] > 1 for h in compactions)


def _python_m_ingest(*argv: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tools.ingest", *argv],
                          env={**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "100", **(env or {})},
                          capture_output=True, text=True, timeout=120, check=False)
    return done, time.monotonic() - started


_NO_SPARK = ("import sys; from tools.ingest.cli import main; code = main(sys.argv[1:]); "
             "spark = sys.modules.get('pyspark'); "
             "print('a SparkContext' if spark and spark.SparkContext._active_spark_context else 'no SparkContext'); "
             "sys.exit(code)")


def test_nothing_new_answers_without_a_jvm(tmp_path: Path) -> None:
    """No JVM is started when nothing is new: no SparkContext exists when ``main``
    returns, and the only ``java`` on the path, a script that records each start, is
    never run. (How long it takes is measured in BENCHMARKS.md, not asserted.)"""
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    _segments(logs, 0, 3)
    ingest_once(None, str(logs), wh, console=QUIET)
    java_home = tmp_path / "java"
    (java_home / "bin").mkdir(parents=True)
    started = tmp_path / "java-started"
    java = java_home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho \"$@\" >> {started}\nexit 1\n")
    java.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "100", "JAVA_HOME": str(java_home),
           "PATH": f"{java_home / 'bin'}:{os.path.dirname(sys.executable)}:/usr/bin:/bin"}

    def no_op_run() -> str:
        done = subprocess.run([sys.executable, "-c", _NO_SPARK, str(logs), "--out", str(wh)], env=env,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done
        assert "nothing new to ingest" in done.stdout and done.stdout.rstrip().endswith("no SparkContext"), done
        return done.stdout

    no_op_run()
    os.rename(logs / "jet-000.jetlog", logs / "jet-000.old")  # a renamed segment is not new either
    with open(logs / "jet-002.jetlog", "ab") as fh:
        fh.write(b"\x4a\x52\x00\x00")  # nor the start of a record the daemon is writing
    no_op_run()
    assert not started.exists(), started.read_text()
    # The check can fail: with something new, the same command starts Spark, whose
    # launcher runs the recording java (which refuses to start).
    _segments(logs, 3, 4)
    done = subprocess.run([sys.executable, "-c", _NO_SPARK, str(logs), "--out", str(wh)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0 and started.exists(), done


def test_help_reads_well() -> None:
    done, _ = _python_m_ingest("--help")
    assert done.returncode == 0
    text = done.stdout
    assert "``" not in text and ":mod:" not in text  # no leaked docstring markup
    assert "Ingest jetd event logs" in text
    mode = text[text.index("--mode"):]
    assert "FAILFAST stops" in mode and "exit status" in text
    assert "--verbose" in text


def test_a_live_segment_cut_mid_record_is_not_damage_but_an_old_one_is(tmp_path: Path) -> None:
    """The newest segment of a daemon may be being written: its last record waits for
    the next run (no TRUNCATED row, FAILFAST does not fail). Once a newer segment exists
    (the daemon rotated or restarted), an older segment's cut tail is final: reported."""
    from tools.ingest.parse import TRUNCATED

    logs, wh = tmp_path / "logs", tmp_path / "wh"
    logs.mkdir()
    whole = tmp_path / "whole.jetlog"
    n = write_synthetic_log(str(whole), 200)
    data = whole.read_bytes()
    seg = logs / "jet-000.jetlog"
    seg.write_bytes(data[: len(data) // 2 + 5])
    first = ingest_once(None, str(logs), wh, console=QUIET, mode="FAILFAST")
    kinds = visible(wh).column("kind").to_pylist()
    assert TRUNCATED not in kinds and len(kinds) == first > 0
    seg.write_bytes(data[:-7])  # the daemon died mid-record ...
    second = ingest_once(None, str(logs), wh, console=QUIET)
    assert first + second == n - 1  # ... its last record waits: it might still come
    assert TRUNCATED not in visible(wh).column("kind").to_pylist()


def test_an_older_segments_cut_tail_is_reported_once_the_daemon_moved_on(tmp_path: Path) -> None:
    from tools.ingest.parse import TRUNCATED

    logs, wh = tmp_path / "logs", tmp_path / "wh"
    logs.mkdir()
    whole = tmp_path / "whole.jetlog"
    n = write_synthetic_log(str(whole), 200)
    (logs / "jet-000.jetlog").write_bytes(whole.read_bytes()[:-7])  # the daemon died mid-record
    ingest_once(None, str(logs), wh, console=QUIET)
    write_synthetic_log(str(logs / "jet-001.jetlog"), 10, segment=0, start_ns=BASE_NS + 10**12)  # ... restarted
    ingest_once(None, str(logs), wh, console=QUIET)
    t = visible(wh)
    rows = [(Path(f).name, k) for f, k in zip(t.column("file").to_pylist(), t.column("kind").to_pylist(), strict=True)]
    assert rows.count(("jet-000.jetlog", TRUNCATED)) == 1
    assert sum(1 for f, k in rows if f == "jet-000.jetlog" and k != TRUNCATED) == n - 1


def test_history_lists_each_runs_commits_with_what_they_added(tmp_path: Path) -> None:
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    _segments(logs, 0, 2)
    first = ingest_once(None, str(logs), wh, console=QUIET)
    _segments(logs, 2, 3)
    second = ingest_once(None, str(logs), wh, console=QUIET)
    from tools.ingest.warehouse import history

    commits = [c for c in history(wh) if c["table"] == "frames"]
    assert [(c["operation"], c["records"], c["files_added"]) for c in commits] == [
        ("ingest", first, commits[0]["files_added"]), ("ingest", second, commits[1]["files_added"])]
    assert commits[0]["version"] < commits[1]["version"] and commits[0]["files_added"] >= 1
    assert sorted(Path(s.split(":")[0]).name for s in commits[1]["segments"]) == ["jet-002.jetlog"]
    done, _ = _python_m_ingest("history", str(wh))
    assert done.returncode == 0, done
    assert "ingest" in done.stdout and f"{second:,}" in done.stdout and "jet-002.jetlog" in done.stdout
    done, _ = _python_m_ingest("history", str(tmp_path / "nothing"))
    assert done.returncode == 2 and "not a jet warehouse" in done.stdout, done


@pytest.mark.parametrize("crash", [None, "migrate-planned", "migrate-committed-traffic", "migrate-committed-frames",
                                   "migrate-committed"])
def test_migrate_converts_a_warehouse_of_the_snapshot_layout_in_place(tmp_path: Path, crash: str | None) -> None:
    """tests/ingest/data/snapshot-layout-warehouse.tar.gz: what jet-ingest wrote before
    Delta Lake (82ce793) from ``_segments(logs, 0, 2, 40)``. The ingest refuses it with
    the hint; ``migrate`` converts it (also when a first try was killed at ``crash``);
    the next ingest adds only what is new."""
    import tarfile

    with tarfile.open(Path(__file__).parent / "data" / "snapshot-layout-warehouse.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    wh, logs = tmp_path / "wh", tmp_path / "logs"
    _segments(logs, 0, 2, 40)  # the same segments (known by their headers), elsewhere
    old = visible_old(wh)
    with pytest.raises(WarehouseError, match=f"convert it in place with: jet-ingest migrate {wh}"):
        ingest_once(None, str(logs), wh, console=QUIET)
    if crash:
        done = subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                               "from tools.ingest.warehouse import migrate; migrate(Path(sys.argv[1]))", str(wh)],
                              env={**os.environ, "PYTHONPATH": REPO_ROOT, CRASH_ENV: crash}, capture_output=True,
                              text=True, timeout=120, check=False)
        assert done.returncode == 86, done
    done, _ = _python_m_ingest("migrate", str(wh))
    assert done.returncode == 0 and "Delta Lake tables" in done.stdout, done
    assert not (wh / "_jet_ingest" / "current").exists() and not (wh / "_jet_ingest" / "snapshots").exists()
    for table in TABLES:
        assert sorted(visible(wh, table).drop_columns(["date"]).to_pylist(), key=repr) == \
            sorted(old[table].to_pylist(), key=repr), table
    assert _python_m_ingest("migrate", str(wh))[0].stdout.strip().endswith("already Delta Lake tables")
    assert ingest_once(None, str(logs), wh, console=QUIET) == 0  # nothing new: the progress came along
    _segments(logs, 2, 3, 40)
    added = ingest_once(None, str(logs), wh, console=QUIET)
    keys = frame_keys(wh)
    assert len(keys) == len(set(keys)) == old["frames"].num_rows + added
    assert set(keys) == set(frame_keys_of_logs(logs))


def visible_old(wh: Path) -> dict[str, pa.Table]:
    """Every table of a snapshot-layout warehouse, as its current snapshot holds it."""
    import pyarrow.dataset as ds

    snap = wh / "_jet_ingest" / "current"
    return {t: ds.dataset(snap / t, format="parquet").to_table() for t in TABLES}


def test_the_run_and_its_report_say_each_tables_version_and_what_it_added(tmp_path: Path) -> None:
    """The console line and the report (text and HTML) show, per table, its Delta version
    and the rows and files this run's commits added, checked against the Delta log."""
    import pandas as pd

    from tools.ingest.cli import _table_versions
    from tools.ingest.cli import _versions_line
    from tools.ingest.cli import table_changes
    from tools.ingest.report import Summary
    from tools.ingest.report import print_summary
    from tools.ingest.report import write_report

    logs, wh = tmp_path / "logs", tmp_path / "wh"
    _segments(logs, 0, 1)
    assert _versions_line(table_changes(wh, _table_versions(wh))) == "tables: none yet"
    ingest_once(None, str(logs), wh, console=QUIET)
    before = _table_versions(wh)
    _segments(logs, 1, 3)
    added = ingest_once(None, str(logs), wh, console=QUIET)
    changes = table_changes(wh, before)
    assert [c["table"] for c in changes] == list(TABLES)
    for c in changes:
        table = str(c["table"])
        dt = DeltaTable(str(wh / table))
        assert c["version"] == dt.version() > before[table]
        old = set(files_of(DeltaTable(str(wh / table), version=before[table])))
        new = set(files_of(dt)) - old
        assert c["files"] == len(new) > 0, c
        rows = pa.table(dt.get_add_actions(flatten=True))
        by_path = dict(zip(rows.column("path").to_pylist(), rows.column("num_records").to_pylist(), strict=True))
        assert c["rows"] == sum(by_path[f] for f in new), c
    frames = changes[0]
    assert frames["rows"] == added > 0
    line = _versions_line(changes)
    assert line.startswith(f"tables: frames v{frames['version']} (+{added:,} rows, +{frames['files']} files), "
                           "requests v"), line
    assert _versions_line(table_changes(wh, _table_versions(wh))).startswith(
        f"tables: frames v{frames['version']} (+0 rows, +0 files)")

    empty = pd.DataFrame()
    summary = Summary({t: visible(wh, t).num_rows for t in TABLES}, empty, empty, empty, empty,
                      pd.DataFrame({"status": [], "latency_ms": []}), pd.DataFrame({"name": [], "conn_id": [],
                                                                                    "frames": []}),
                      source=str(logs), versions=changes)
    console = Console(record=True, width=200)
    print_summary(summary, console)
    text = console.export_text()
    assert "version" in text and "rows added" in text and "files added" in text
    row = next(line for line in text.splitlines() if line.startswith("│ frames "))
    assert [str(frames["version"]), f"{added}", str(frames["files"])] == row.replace("│", " ").split()[-3:], row
    write_report(summary, tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()
    html_table = page[page.index("<table id='tables'"):]
    html_table = html_table[:html_table.index("</table>")]
    assert re.findall(r"<th>(.*?)</th>", html_table) == ["table", "rows", "version", "rows added", "files added"]
    first_row = re.findall(r"<td>(.*?)</td>", html_table)[:5]
    assert first_row == ["frames", str(summary.rows["frames"]), str(frames["version"]), str(added),
                         str(frames["files"])]


def test_optimize_compacts_and_vacuum_deletes_only_replaced_files(tmp_path: Path) -> None:
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    for k in range(3):
        _segments(logs, k, k + 1)
        ingest_once(None, str(logs), wh, console=QUIET)
    rows = {t: visible(wh, t).num_rows for t in TABLES}
    assert len(live_files(wh, "frames")) == 3
    done, _ = _python_m_ingest("optimize", str(wh))
    assert done.returncode == 0 and "file(s) compacted" in done.stdout, done
    assert len(live_files(wh, "frames")) == 1
    assert {t: visible(wh, t).num_rows for t in TABLES} == rows
    assert len(list((wh / "frames").rglob("*.parquet"))) == 4  # the replaced ones stay for old versions
    done, _ = _python_m_ingest("vacuum", "--help")
    assert "168 hours" in done.stdout and "time travel" in done.stdout
    done, _ = _python_m_ingest("vacuum", str(wh))  # within the retention: nothing goes
    assert done.returncode == 0 and "0 unreferenced" in done.stdout, done
    done, _ = _python_m_ingest("vacuum", "--retention-hours", "0", str(wh))
    assert done.returncode == 0, done
    for table in TABLES:
        on_disk = sorted(str(p.relative_to(wh / table)) for p in (wh / table).rglob("*.parquet"))
        assert on_disk == sorted(live_files(wh, table)), table
    assert {t: visible(wh, t).num_rows for t in TABLES} == rows
    assert ingest_once(None, str(logs), wh, console=QUIET) == 0
    done, _ = _python_m_ingest("vacuum", str(tmp_path / "none"))
    assert done.returncode == 2 and "not a jet warehouse" in done.stdout, done


@pytest.mark.parametrize("command", ["vacuum", "optimize", "migrate"])
def test_maintenance_of_a_directory_that_is_not_a_warehouse_creates_nothing(tmp_path: Path, command: str) -> None:
    """It refuses before the lock file (``_jet_ingest/lock``) is made, and makes no
    directory that was not there."""
    plain = tmp_path / "plain"
    (plain / "data").mkdir(parents=True)
    (plain / "data" / "x.parquet").write_bytes(b"not ours")
    for target in (plain, tmp_path / "absent" / "wh"):
        done, _ = _python_m_ingest(command, str(target))
        assert done.returncode == 2 and "not a jet warehouse" in done.stdout, done
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == \
        ["plain", "plain/data", "plain/data/x.parquet"]
