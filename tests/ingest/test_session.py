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

from tools.ingest.session import _java
from tools.ingest.session import class_data_sharing

pytestmark = pytest.mark.skipif(_java() is None, reason="needs a java")


@pytest.fixture(autouse=True)
def _default_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("JET_INGEST_CDS_DIR", "SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JET_INGEST_CDS", "1")  # opt-in


def _record(part: str) -> None:
    """What the driver JVM does at exit, done by a small JVM."""
    subprocess.run([_java(), f"-XX:ArchiveClassesAtExit={part}", "-version"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


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
    _record(part)
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
    _record(part)
    data = Path(part).read_bytes()
    Path(part).chmod(0o644)
    Path(part).write_bytes(data[: len(data) // 3])  # cut short, header intact
    _settle(Path(part))
    again = class_data_sharing(str(tmp_path))
    assert _option(again, "SharedArchiveFile") is None
    assert _option(again, "ArchiveClassesAtExit") is not None  # this run writes a new one
    assert not Path(part).exists()


@pytest.mark.parametrize("header", [b"", bytes(4096)], ids=["no bytes yet", "killed before its header"])
def test_a_part_without_its_header_is_never_promoted(tmp_path: Path, header: bytes) -> None:
    part = _option(class_data_sharing(str(tmp_path)), "ArchiveClassesAtExit")
    assert part is not None
    _record(part)
    data = bytearray(Path(part).read_bytes())
    data[: len(header)] = header  # HotSpot writes the header last
    Path(part).chmod(0o644)
    Path(part).write_bytes(bytes(data[: len(data) * 2 // 3]) if header else b"")
    _settle(Path(part))
    assert _option(class_data_sharing(str(tmp_path)), "SharedArchiveFile") is None
    assert not Path(part).exists()


def test_other_installs_archives_are_kept_while_in_use(tmp_path: Path) -> None:
    recent = tmp_path / "spark-driver-1111111111111111.jsa"
    stale = tmp_path / "spark-driver-0000000000000000.jsa"
    recent.write_bytes(b"another pyspark's")
    stale.write_bytes(b"old")
    _settle(stale)
    os.utime(stale, (time.time() - 31 * 86400,) * 2)
    class_data_sharing(str(tmp_path))
    assert recent.exists() and not stale.exists()


def test_off_when_it_cannot_work_or_the_user_owns_the_jvm_options(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert class_data_sharing(str(tmp_path)) is not None
    # Spark splits java options on spaces: a path with one would break the driver's command line.
    assert class_data_sharing(str(tmp_path / "Jane Doe" / "cache")) is None
    assert class_data_sharing("/proc") is None  # exists, cannot be written
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert class_data_sharing(str(blocker / "cache")) is None  # cannot be created
    monkeypatch.setenv("JET_INGEST_CDS", "0")
    assert class_data_sharing(str(tmp_path)) is None
    monkeypatch.delenv("JET_INGEST_CDS")
    assert class_data_sharing(str(tmp_path)) is None  # not asked for
    monkeypatch.setenv("JET_INGEST_CDS", "1")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-java-options -Dmine=1 pyspark-shell")
    assert class_data_sharing(str(tmp_path)) is None
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS")
    conf = tmp_path / "conf"
    conf.mkdir()
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    assert class_data_sharing(str(tmp_path)) is not None  # an empty conf directory is fine
    (conf / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Dmine=1\n")
    assert class_data_sharing(str(tmp_path)) is None
