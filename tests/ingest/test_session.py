"""The driver JVM's class-data-sharing archive (tools.ingest.session.class_data_sharing):
written once, checked by a throwaway JVM before any driver maps it, never half-written."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tools.ingest.session import _java, class_data_sharing

pytestmark = pytest.mark.skipif(_java() is None, reason="needs a java")


def _option(opts: str | None, name: str) -> str | None:
    found = re.search(rf"-XX:{name}=(\S+)", opts or "")
    return found.group(1) if found else None


def _settle(path: Path) -> None:
    old = time.time() - 120
    os.utime(path, (old, old))


def test_first_run_writes_a_part_and_a_settled_complete_one_is_used(tmp_path: Path) -> None:
    first = class_data_sharing(str(tmp_path))
    part = _option(first, "ArchiveClassesAtExit")
    assert part is not None and part.endswith(f".{os.getpid()}.part"), first
    assert "-Xlog:cds=off" in first  # type: ignore[operator]
    # What the driver JVM does at exit, done by a small JVM here.
    subprocess.run([_java(), f"-XX:ArchiveClassesAtExit={part}", "-version"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert Path(part).stat().st_size > 0
    # Just written: its JVM may still be writing, so no run uses or rewrites it yet.
    assert class_data_sharing(str(tmp_path)) is None
    _settle(Path(part))
    used = _option(class_data_sharing(str(tmp_path)), "SharedArchiveFile")
    assert used is not None and Path(used).exists() and not Path(part).exists()
    assert used == _option(class_data_sharing(str(tmp_path)), "SharedArchiveFile")  # from now on


def test_a_truncated_archive_is_never_used(tmp_path: Path) -> None:
    part = _option(class_data_sharing(str(tmp_path)), "ArchiveClassesAtExit")
    assert part is not None
    subprocess.run([_java(), f"-XX:ArchiveClassesAtExit={part}", "-version"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    data = Path(part).read_bytes()
    Path(part).chmod(0o644)
    Path(part).write_bytes(data[: len(data) // 3])  # a driver killed while writing it
    _settle(Path(part))
    again = class_data_sharing(str(tmp_path))
    assert _option(again, "SharedArchiveFile") is None
    assert _option(again, "ArchiveClassesAtExit") is not None  # this run writes a new one
    assert not Path(part).exists()


def test_archives_of_another_java_or_pyspark_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / "spark-driver-0000000000000000.jsa"
    stale.write_bytes(b"old")
    class_data_sharing(str(tmp_path))
    assert not stale.exists()


def test_off_switch_and_unwritable_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JET_INGEST_CDS", "0")
    assert class_data_sharing(str(tmp_path)) is None
    monkeypatch.delenv("JET_INGEST_CDS")
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert class_data_sharing(str(blocker / "cache")) is None  # cannot create the directory
