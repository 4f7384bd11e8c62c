"""One session-scoped local[2] SparkSession for the Spark tests of tools/ingest."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from tools.ingest.session import spark_session

    session = spark_session("local[2]", app="jet-ingest-tests", conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
