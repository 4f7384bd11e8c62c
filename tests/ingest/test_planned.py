"""Tasks read exactly what the driver planned (issue 27 item 2).

Each partition carries what the driver saw of its segments (the header's identity, the
planned size, the offset and CRC of the last planned record); a task that finds a
shorter file, another segment or another record there fails with a message naming the
file and both sizes, instead of reading what is there (a stale copy lost the rest of the
segment for good). Here the file is changed between planning and reading; the
standalone cluster's executors that see a shorter copy are in tests/ingest/test_cluster.py.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path
from typing import Any

import pytest

from jetwire.log import LogHeader
from jetwire.log import encode_header
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import synthetic_records
from tools.ingest.synth import write_synthetic_log


def _rows(reader: Any, parts: Any) -> list[int]:
    return sorted(o for p in parts for b in reader.read(p) for o in b.column("offset").to_pylist())


def test_a_changed_segment_fails_the_task_that_reads_it(tmp_path: Path) -> None:
    from tools.ingest.parse import SegmentChanged
    from tools.ingest.source import JetlogReader

    path = tmp_path / "jet-0.jetlog"
    write_synthetic_log(str(path), 400)
    data = path.read_bytes()
    reader = JetlogReader({"path": str(tmp_path), "chunksize": "8000"})
    parts = reader.partitions()
    assert len(parts) > 3
    everything = _rows(reader, parts)

    # Shorter (a stale copy): every task fails, naming the file and both sizes.
    path.write_bytes(data[: len(data) // 2])
    for part in parts:
        with pytest.raises(SegmentChanged, match=rf"{path}: shorter .*{len(data) // 2:,} bytes here, "
                                                 rf"{len(data):,} planned"):
            list(reader.read(part))

    # Another segment of the same size (another header).
    other = encode_header(LogHeader("jetd", BASE_NS + 1, 0))
    path.write_bytes(other + data[len(other):])
    with pytest.raises(SegmentChanged, match="another segment"):
        list(reader.read(parts[0]))

    # The same header, other bytes at the last planned record (its CRC field).
    planned = parts[-1].planned[str(path)]  # type: ignore[attr-defined]
    changed = bytearray(data)
    changed[planned.last[0] + 6] ^= 0xFF
    path.write_bytes(bytes(changed))
    with pytest.raises(SegmentChanged, match=rf"last record .* offset {planned.last[0]:,}"):
        list(reader.read(parts[-1]))
    changed = bytearray(data)
    changed[planned.last[0] + 30] ^= 0xFF  # its body: the CRC no longer holds
    path.write_bytes(bytes(changed))
    with pytest.raises(SegmentChanged, match="last record"):
        list(reader.read(parts[-1]))

    # Grown since planning (a live segment): the planned bytes are read, nothing more.
    more = b"".join(synthetic_records(20, start_ns=BASE_NS + 10**9))
    path.write_bytes(data + more)
    assert _rows(reader, parts) == everything


def test_a_segment_whose_header_was_cut_when_planned_is_no_change(tmp_path: Path) -> None:
    from tools.ingest.source import JetlogReader

    path = tmp_path / "jet-0.jetlog"
    write_synthetic_log(str(path), 5)
    data = path.read_bytes()
    path.write_bytes(data[:9])  # being created
    reader = JetlogReader({"path": str(tmp_path)})
    parts = reader.partitions()
    path.write_bytes(data)
    assert [b for p in parts for b in reader.read(p) if b.num_rows] == []


def test_jet_ingest_tasks_check_the_plan_and_read_gzip_segments_whole(tmp_path: Path) -> None:
    """The tasks of jet-ingest check what ingest_once planned; a gzip-compressed segment
    is read whole (its planned limit was the compressed size: the rest was dropped)."""
    from tools.ingest.cli import ingest_once
    from tools.ingest.parse import SegmentChanged
    from tools.ingest.pipeline import TaskSpec
    from tools.ingest.pipeline import run_task
    from tools.ingest.source import plan_files
    from tools.ingest.warehouse import Warehouse

    logs = tmp_path / "logs"
    logs.mkdir()
    n = write_synthetic_log(str(logs / "jet-0.jetlog"), 2000)
    with open(logs / "jet-0.jetlog", "rb") as src, gzip.open(logs / "jet-0.jetlog.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (logs / "jet-0.jetlog").unlink()
    assert ingest_once(None, str(logs), tmp_path / "wh") == n
    assert Warehouse.load(tmp_path / "wh").rows("frames") == n

    path = tmp_path / "plain.jetlog"
    write_synthetic_log(str(path), 50)
    size = path.stat().st_size
    ranges = [(str(path), 0, size)]
    spec = TaskSpec(str(tmp_path / "staging"), {str(path): BASE_NS}, planned=plan_files(ranges))
    report = run_task(0, [(str(path), 0, None, size)], spec)
    assert report["verified"] == [(str(path), 0, size)] and report["rows"] > 0
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(SegmentChanged, match=f"1,000 bytes here, {size:,} planned"):
        run_task(0, [(str(path), 0, None, size)], spec)


@pytest.mark.spark
def test_a_dataframe_over_a_changed_segment_fails_loudly(spark: Any, tmp_path: Path) -> None:
    """Spark keeps a DataFrame's planned partitions for its later queries: a file that
    shrank since is an error naming it, not fewer rows."""
    path = tmp_path / "jet-0.jetlog"
    n = write_synthetic_log(str(path), 300)
    data = path.read_bytes()
    df = spark.read.format("jetlog").load(str(tmp_path))
    assert df.count() == n
    path.write_bytes(data[:3000])
    with pytest.raises(Exception, match=rf"SegmentChanged: {path}: shorter than the driver planned to read "
                                        rf"\(3,000 bytes here, {len(data):,} planned"):
        df.count()
    # A new DataFrame plans what is there now.
    rows = spark.read.format("jetlog").load(str(tmp_path)).select("kind").collect()
    assert 0 < len(rows) < n and rows[-1]["kind"] == "TRUNCATED"
