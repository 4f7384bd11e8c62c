"""JVM-free tests of the warehouse manifest, partition planning and CLI argument parsing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from jetwire.log import LogHeader, encode_header
from tools.ingest.cli import _parse_since, _plan
from tools.ingest.source import expand_paths, plan_ranges
from tools.ingest.synth import BASE_NS, write_synthetic_log
from tools.ingest.warehouse import FileState, Manifest, move_staged


def test_manifest_round_trip_and_uncommitted_cleanup(tmp_path: Path) -> None:
    m = Manifest(tmp_path)
    m.files["/x.jetlog"] = FileState(123, "jetd", 5, 0, 5, 999)
    m.runs.append("aaa")
    m.save()
    staged = tmp_path / "stage" / "date=2026-01-01"
    staged.mkdir(parents=True)
    (staged / "part-0.parquet").write_bytes(b"x")
    assert move_staged(tmp_path / "stage", tmp_path / "frames", "bbb") == 1
    (tmp_path / "frames" / "date=2026-01-01" / "run-aaa-part-1.parquet").write_bytes(b"y")
    loaded = Manifest.load(tmp_path)
    assert loaded.files == m.files and loaded.runs == ["aaa"]
    assert loaded.remove_uncommitted() == 1  # run bbb never committed
    assert [f.name for f in (tmp_path / "frames").rglob("*.parquet")] == ["run-aaa-part-1.parquet"]


def test_cleanup_keeps_only_committed_runs_and_the_current_snapshot(tmp_path: Path) -> None:
    m = Manifest(tmp_path, runs=["aaa"], carry="aaa")
    m.save()
    day = "date=2026-01-01"
    files = {
        f"requests/{day}/run-aaa-part-0.parquet": True,  # committed
        f"requests/{day}/run-ccc-part-0.parquet": False,  # a run that died before its commit
        f"state_changes/{day}/run-ccc-merged.parquet": False,
        f"requests/{day}/snap-aaa-pending.parquet": True,  # the current snapshot
        f"requests/{day}/snap-zzz-pending.parquet": False,  # the one before it, or an uncommitted one
        f"connections/{day}/snap-zzz-all.parquet": False,
        f"connections/{day}/snap-aaa-all.parquet": True,
        "_jet_ingest/carry/aaa/conns.parquet": True,
        "_jet_ingest/carry/ccc/conns.parquet": False,
    }
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert Manifest.load(tmp_path).remove_uncommitted() == 2
    assert {n for n in files if (tmp_path / n).exists()} == {n for n, keep in files.items() if keep}


def test_manifest_of_an_older_jet_ingest_is_refused_with_a_reason(tmp_path: Path) -> None:
    (tmp_path / "_jet_ingest").mkdir()
    (tmp_path / "_jet_ingest" / "manifest.json").write_text('{"version": 1, "files": {}, "runs": []}')
    with pytest.raises(ValueError, match="ingest into a new warehouse"):
        Manifest.load(tmp_path)


def test_manifest_rejects_unknown_version(tmp_path: Path) -> None:
    (tmp_path / "_jet_ingest").mkdir()
    (tmp_path / "_jet_ingest" / "manifest.json").write_text('{"version": 99}')
    with pytest.raises(ValueError, match="unknown manifest version"):
        Manifest.load(tmp_path)


def test_plan_resumes_and_assigns_runs(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_synthetic_log(str(logs / "a"), 10, segment=0, start_ns=BASE_NS)
    write_synthetic_log(str(logs / "b"), 10, segment=1, start_ns=BASE_NS + 10)
    write_synthetic_log(str(logs / "c"), 10, segment=0, start_ns=BASE_NS + 20)  # the daemon restarted
    (logs / "d").write_bytes(encode_header(LogHeader("jetd", BASE_NS + 30, 0))[:15])  # still being created
    m = Manifest(tmp_path / "wh")
    ranges, states = _plan(m, str(logs))
    assert [Path(f).name for f, _, _ in ranges] == ["a", "b", "c"]
    assert [states[str(logs / n)].run_ns for n in "abc"] == [BASE_NS, BASE_NS, BASE_NS + 20]
    size_a = (logs / "a").stat().st_size
    states[str(logs / "a")].done = size_a
    m.files.update(states)
    ranges, _ = _plan(m, str(logs))
    assert [Path(f).name for f, _, _ in ranges] == ["b", "c"]  # a is done
    with open(logs / "a", "ab") as fh:
        fh.write(b"JR")  # the daemon goes on writing
    ranges, _ = _plan(m, str(logs))
    assert ranges[0] == (str(logs / "a"), size_a, size_a + 2)


def test_plan_ranges_groups_and_chunks() -> None:
    parts = plan_ranges([("a", 0, 10), ("b", 0, 10), ("c", 0, 95), ("d", 50, 60)], chunk=40, group=15)
    assert parts == [
        [("a", 0, None, 10), ("b", 0, None, 10)],
        [("c", 0, 40, 95)], [("c", 40, 80, 95)], [("c", 80, None, 95)],
        [("d", 50, None, 60)],
    ]


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
    ('{"version": 2, "files": {}, "runs": ["r1"], "carry": "r1"}', "carried from ingest run r1 is missing"),
    ('{"version": 2, "files"', "Expecting"),
])
def test_cli_refuses_a_warehouse_it_cannot_continue(tmp_path: Path, manifest: str, message: str) -> None:
    import os
    import subprocess
    import sys

    from tools.ingest.session import REPO_ROOT

    (tmp_path / "wh" / "_jet_ingest").mkdir(parents=True)
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
    from tools.ingest.warehouse import WarehouseError, locked

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
