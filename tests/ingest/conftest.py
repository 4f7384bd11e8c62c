"""One session-scoped local[2] SparkSession for the Spark tests of tools/ingest."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark")
    import os

    from tools.ingest.session import spark_session

    # The driver's class-data-sharing archive (opt-in, tools/ingest/README.md): the first
    # run records it, later runs start their JVM about 3 s sooner and run the cold first
    # queries faster (the Spark part: ~45 s instead of ~64 s). It lives in pytest's cache,
    # not in the user's ~/.cache/jet. JET_INGEST_CDS=0 turns it off.
    cache = getattr(request.config, "cache", None)
    where = cache.mkdir("jet-cds") if cache is not None else tmp_path_factory.mktemp("jet-cds")
    os.environ.setdefault("JET_INGEST_CDS", "1")
    os.environ.setdefault("JET_INGEST_CDS_DIR", str(where))

    session = spark_session("local[2]", app="jet-ingest-tests", conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()
