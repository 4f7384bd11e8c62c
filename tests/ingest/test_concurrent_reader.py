"""A reader that reads the warehouse while runs are committed sees whole versions only
(issue 31): a thread reads the latest version of every table with delta-rs, again and
again, while another thread ingests run after run (compactions included); every count
it read is the count of a table after one of the runs, and no frames read holds a
record twice. So is every version each table has, read afterwards: a read at the wrong
moment would need luck to happen.

The ingest runs its tasks in this process (``ingest_once(None, ...)``, no JVM); the
cluster's runs are checked the same way in test_cluster.py.
"""

from __future__ import annotations

import itertools
import os
import threading
from pathlib import Path

from deltalake import DeltaTable
from rich.console import Console

from tools.ingest.cli import ingest_once
from tools.ingest.synth import BASE_NS
from tools.ingest.synth import write_synthetic_log
from tools.ingest.warehouse import TABLES

QUIET = Console(file=open(os.devnull, "w"))  # noqa: SIM115 (lives as long as the module)
RUNS = 10


def read_whole_versions(wh: Path, stop: threading.Event, seen: list[tuple[str, int, int, int]],
                        errors: list[BaseException]) -> None:
    """Until ``stop`` (and once more after it): (table, version, rows, distinct frames
    keys) of each table's latest version, read with delta-rs."""
    try:
        while True:
            last = stop.is_set()
            for table in TABLES:
                if not (wh / table / "_delta_log").exists():
                    continue
                dt = DeltaTable(str(wh / table))
                t = dt.to_pyarrow_table()
                keys = len(set(zip(t.column("file").to_pylist(), t.column("offset").to_pylist(), strict=True))) \
                    if table == "frames" else t.num_rows
                seen.append((table, dt.version(), t.num_rows, keys))
            if last:
                return
    except BaseException as exc:  # handed to the test
        errors.append(exc)


def test_a_concurrent_reader_sees_whole_versions_only(tmp_path: Path) -> None:
    logs, wh = tmp_path / "logs", tmp_path / "wh"
    logs.mkdir()
    # Per table: (its version, its rows) after each run, from (-1, 0) before the first.
    marks: dict[str, list[tuple[int, int]]] = {t: [(-1, 0)] for t in TABLES}
    stop = threading.Event()
    seen: list[tuple[str, int, int, int]] = []
    errors: list[BaseException] = []
    reader = threading.Thread(target=read_whole_versions, args=(wh, stop, seen, errors), daemon=True)
    reader.start()
    total = 0
    try:
        for run in range(RUNS):
            total += write_synthetic_log(str(logs / f"jet-{run:03d}.jetlog"), 40, segment=run,
                                         start_ns=BASE_NS + run * 10**10)
            assert ingest_once(None, str(logs), wh, console=QUIET) > 0
            for table in TABLES:  # no other writer now: the table as this run left it
                dt = DeltaTable(str(wh / table))
                marks[table].append((dt.version(), dt.to_pyarrow_table().num_rows))
    finally:
        stop.set()
        reader.join(timeout=600)
    assert not reader.is_alive() and not errors, errors
    assert marks["frames"][-1][1] == total
    # Compactions ran (10 runs of small files): their commits change no counts either.
    assert any(h.get("jet.operation") == "compact" for h in DeltaTable(str(wh / "frames")).history())

    def whole(table: str, version: int) -> set[int]:
        """The counts a version between two runs' ends may have: the first run's or the second's."""
        pairs = itertools.pairwise(marks[table])
        return next({before, after} for (v0, before), (v1, after) in pairs if v0 < version <= v1)

    assert {table for table, *_ in seen} == set(TABLES)
    torn = [r for r in seen if r[2] not in whole(r[0], r[1])]
    assert not torn, (torn[:5], marks)
    assert all(rows == keys for _, _, rows, keys in seen)  # no frames record twice in a read
    # Whether the reader happened to read at the wrong moment is up to the scheduler: so
    # every version ever committed, each of which a reader could have read, is checked too.
    for table in TABLES:
        for v in range(DeltaTable(str(wh / table)).version() + 1):
            rows = DeltaTable(str(wh / table), version=v).to_pyarrow_table().num_rows
            assert rows in whole(table, v), (table, v, rows, marks[table])
