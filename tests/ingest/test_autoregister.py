"""PySpark finds the jetlog source on its own, through its own lookup code (no JVM)."""

from __future__ import annotations

import io
import struct

import pytest


def test_pyspark_lookup_finds_jetlog() -> None:
    lookup = pytest.importorskip("pyspark.sql.worker.lookup_data_sources")

    def read_blob(stream: io.BytesIO) -> bytes:
        (length,) = struct.unpack(">i", stream.read(4))
        return stream.read(length)

    out = io.BytesIO()
    lookup._main(io.BytesIO(), out)  # what a Spark worker runs on the first data source use
    out.seek(0)
    (count,) = struct.unpack(">i", out.read(4))
    names = []
    for _ in range(count):
        names.append(read_blob(out).decode("utf-8"))
        read_blob(out)  # the pickled class
    assert "jetlog" in names
