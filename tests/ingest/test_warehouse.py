"""JVM-free tests of the warehouse's Delta Lake commits, partition planning and CLI argument parsing."""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from jetwire.log import LogHeader
from jetwire.log import encode_header
from tools.ingest.cli import _parse_since
from tools.ingest.cli import _plan
from tools.ingest.source import DEFAULT_CHUNK
from tools.ingest.source import DEFAULT_GROUP
from tools.ingest.source import expand_paths
from tools.ingest.source import plan_ranges
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import write_synthetic_log
from tools.ingest.warehouse import FileState
from tools.ingest.warehouse import Warehouse
from tools.ingest.warehouse import table_schema


def _stage(root: Path, files: dict[str, int]) -> None:
    """Parquet files of ``rows`` rows each under ``root`` (``<table>/<partition>/<name>``),
    with the table's columns."""
    for name, rows in files.items():
        schema = table_schema(name.split("/")[0])
        columns = {f.name: pa.array([7] * rows, f.type) if f.type == pa.int64() else pa.nulls(rows, f.type)
                   for f in schema if f.name != "date"}
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), root / name)


def _rows(root: Path, table: str, version: int | None = None) -> int:
    return DeltaTable(str(root / table), version=version).to_pyarrow_table().num_rows


def test_publish_commits_each_table_with_the_runs_transaction(tmp_path: Path) -> None:
    m = Warehouse(tmp_path)
    _stage(tmp_path / "st1", {"frames/date=2026-01-01/a.parquet": 3, "requests/date=2026-01-01/b.parquet": 2})
    state = FileState("/x.jetlog", 123, "jetd", 5, 0, 5, 999)
    assert m.publish([(tmp_path / "st1", "run")], "r1", {state.key: state}) == 2
    assert [p.name for p in (tmp_path / "frames").rglob("*.parquet")] == ["run-r1-a.parquet"]
    loaded = Warehouse.load(tmp_path)
    assert loaded.files == {state.key: state} and loaded.rows("frames") == 3 and loaded.version == 1
    frames = DeltaTable(str(tmp_path / "frames"))
    assert frames.transaction_version(loaded.app_id) == 1 and _rows(tmp_path, "frames") == 3
    (add,) = pa.table(frames.get_add_actions(flatten=True)).to_pylist()
    assert add["num_records"] == 3 and add["min.offset"] == add["max.offset"] == 7
    assert add["partition.date"] == datetime.date(2026, 1, 1)
    # A second run dies after its files are staged, before it is decided: nothing seen,
    # and the next writer deletes what it left.
    _stage(tmp_path / "_jet_ingest" / "staging" / "r2", {"frames/date=2026-01-01/c.parquet": 4})
    assert _rows(tmp_path, "frames") == 3
    assert Warehouse.load(tmp_path).recover() == 1
    assert not (tmp_path / "_jet_ingest" / "staging").exists()
    assert Warehouse.load(tmp_path).version == 1 and _rows(tmp_path, "frames") == 3


def test_publish_removes_replaced_files_and_old_versions_stay_readable(tmp_path: Path) -> None:
    m = Warehouse(tmp_path)
    _stage(tmp_path / "st1", {"requests/date=2026-01-01/a.parquet": 3})
    _stage(tmp_path / "sn1", {"requests/date=2026-01-01/open.parquet": 1})
    m.publish([(tmp_path / "st1", "run"), (tmp_path / "sn1", "snap")], "r1", {}, carry=tmp_path / "no-carry")
    _stage(tmp_path / "sn2", {"requests/date=2026-01-01/open.parquet": 2})
    m.publish([(tmp_path / "sn2", "snap")], "r2", {}, drop=lambda t, rel: "snap-" in rel, carry=tmp_path / "none")
    assert m.tables["requests"] == {"date=2026-01-01/run-r1-a.parquet": 3, "date=2026-01-01/snap-r2-open.parquet": 2}
    assert m.version == 2 and _rows(tmp_path, "requests") == 5
    history = DeltaTable(str(tmp_path / "requests")).history()
    assert [h.get("jet.run") for h in history[:2]] == ["r2", "r1"]
    # Time travel: the first run's version is still there, files and all.
    assert _rows(tmp_path, "requests", version=history[1]["version"]) == 4


def test_a_warehouse_of_an_older_jet_ingest_is_refused_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "_jet_ingest").mkdir()
    (tmp_path / "_jet_ingest" / "manifest.json").write_text('{"version": 2, "files": {}, "runs": []}')
    with pytest.raises(ValueError, match="ingest into a new warehouse"):
        Warehouse.load(tmp_path)


def test_a_damaged_progress_table_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "_jet_ingest" / "progress" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000000.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a readable jet warehouse"):
        Warehouse.load(tmp_path)


def test_plan_resumes_and_assigns_runs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_synthetic_log(str(logs / "a"), 10, segment=0, start_ns=BASE_NS)
    write_synthetic_log(str(logs / "b"), 10, segment=1, start_ns=BASE_NS + 10)
    write_synthetic_log(str(logs / "c"), 10, segment=0, start_ns=BASE_NS + 20)  # the daemon restarted
    (logs / "d").write_bytes(encode_header(LogHeader("jetd", BASE_NS + 30, 0))[:15])  # still being created
    m = Warehouse(tmp_path / "wh")
    ranges, states = _plan(m, str(logs))
    assert [Path(f).name for f, _, _ in ranges] == ["a", "b", "c"]
    by_path = {s.path: s for s in states.values()}
    assert [by_path[str(logs / n)].run_ns for n in "abc"] == [BASE_NS, BASE_NS, BASE_NS + 20]
    size_a = (logs / "a").stat().st_size
    by_path[str(logs / "a")].done = size_a
    m.files.update(states)
    ranges, _ = _plan(m, str(logs))
    assert [Path(f).name for f, _, _ in ranges] == ["b", "c"]  # a is done
    with open(logs / "a", "ab") as fh:
        fh.write(b"JR")  # the daemon goes on writing
    ranges, _ = _plan(m, str(logs))
    assert ranges[0] == (str(logs / "a"), size_a, size_a + 2)


def test_plan_ranges_groups_and_chunks() -> None:
    parts = plan_ranges([("a", 0, 10), ("b", 0, 10), ("c", 0, 95), ("d", 50, 60)], chunk=40, group=20)
    assert parts == [
        [("a", 0, None, 10), ("b", 0, None, 10)],
        [("c", 0, 40, 95)], [("c", 40, 80, 95)], [("c", 80, None, 95)],
        [("d", 50, None, 60)],
    ]


def test_a_group_never_grows_past_group_size() -> None:
    # Two segments just under a chunk (27 MiB each, as after a restart) were one 54 MiB
    # task: read one after the other on one core while the other core idled.
    size = 27 << 20
    parts = plan_ranges([("a", 0, size), ("b", 0, size), ("c", 0, 1 << 20), ("d", 0, 1 << 20)],
                        chunk=DEFAULT_CHUNK, group=DEFAULT_GROUP)
    assert parts == [[("a", 0, None, size)],
                     [("b", 0, None, size), ("c", 0, None, 1 << 20), ("d", 0, None, 1 << 20)]]
    # Small files still share a partition up to the group size.
    many = plan_ranges([(f"s{i}", 0, 4 << 20) for i in range(16)], chunk=DEFAULT_CHUNK, group=DEFAULT_GROUP)
    assert [len(p) for p in many] == [8, 8]


def test_expand_paths_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        expand_paths({"path": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="give a path"):
        expand_paths({})


def test_parse_since() -> None:
    assert _parse_since("2026-01-01T00:00:00") == BASE_NS
    assert _parse_since("2026-01-01T01:00:00+01:00") == BASE_NS
    assert _parse_since("1767225600") == BASE_NS
    with pytest.raises(argparse.ArgumentTypeError):
        _parse_since("yesterday")


@pytest.mark.parametrize(("argv", "message"), [
    (["{tmp}/missing", "--out", "{tmp}/wh"], "no such log directory"),
    (["{tmp}", "--out", "{tmp}/wh", "--since", "yesterday-ish"], "--since"),
    (["{tmp}", "--out", "{tmp}/wh", "--mode", "LENIENT"], "invalid choice"),
    (["{tmp}"], "--out"),
])
def test_cli_rejects_bad_arguments_before_starting_spark(tmp_path: Path, argv: list[str], message: str) -> None:
    """``python -m tools.ingest`` as a user runs it: a clear message, exit status 2, no JVM."""
    import os
    import subprocess
    import sys

    from tools.ingest.session import REPO_ROOT

    done = subprocess.run([sys.executable, "-m", "tools.ingest", *[a.format(tmp=tmp_path) for a in argv]],
                          env={**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert message in done.stdout + done.stderr, done
    assert not (tmp_path / "wh").exists()


@pytest.mark.parametrize(("manifest", "message"), [
    ('{"version": 1, "files": {}, "runs": []}', "ingest into a new warehouse"),
    ('{"version": 2, "files": {}, "runs": ["r1"], "carry": "r1"}', "ingest into a new warehouse"),
    ("snapshot:{", "convert it in place with: jet-ingest migrate"),
])
def test_cli_refuses_a_warehouse_it_cannot_continue(tmp_path: Path, manifest: str, message: str) -> None:
    import os
    import subprocess
    import sys

    from tools.ingest.session import REPO_ROOT

    (tmp_path / "wh" / "_jet_ingest" / "snapshots" / "00000001").mkdir(parents=True)
    if manifest.startswith("snapshot:"):
        (tmp_path / "wh" / "_jet_ingest" / "snapshots" / "00000001" / "_manifest.json").write_text(manifest[9:])
        os.symlink("snapshots/00000001", tmp_path / "wh" / "_jet_ingest" / "current")
    else:
        (tmp_path / "wh" / "_jet_ingest" / "manifest.json").write_text(manifest)
    done = subprocess.run([sys.executable, "-m", "tools.ingest", str(tmp_path), "--out", str(tmp_path / "wh")],
                          env={**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert message in done.stdout + done.stderr, done
    assert "Traceback" not in done.stderr


def test_cli_refuses_a_warehouse_another_jet_ingest_is_writing(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tools.ingest.session import REPO_ROOT
    from tools.ingest.warehouse import WarehouseError
    from tools.ingest.warehouse import locked

    with locked(tmp_path / "wh"):
        with pytest.raises(WarehouseError, match="another jet-ingest"), locked(tmp_path / "wh"):
            pass
        done = subprocess.run([sys.executable, "-m", "tools.ingest", str(tmp_path), "--out", str(tmp_path / "wh")],
                              env={**os.environ, "PYTHONPATH": REPO_ROOT, "COLUMNS": "300"},
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done
    assert "another jet-ingest is writing this warehouse" in done.stdout, done
    with locked(tmp_path / "wh"):  # released
        pass


def test_a_python_worker_that_cannot_import_is_named_not_a_traceback() -> None:
    from tools.ingest.cli import _failure

    worker = RuntimeError("An exception was thrown from the Python worker. Please see the stack trace below.\n"
                          "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'pyarrow'")
    message = _failure(worker)
    assert message is not None and "No module named 'pyarrow'" in message and "PYSPARK_PYTHON" in message
    # The driver's own import failing is a bug: shown with its traceback.
    assert _failure(RuntimeError("ModuleNotFoundError: No module named 'rich'")) is None
