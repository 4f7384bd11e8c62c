"""One session-scoped local[2] SparkSession for the Spark tests of tools/ingest, and the
JVM options every JVM these tests start runs with."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

# C1 only (no C2 compiler threads): the tests' JVMs are short-lived and their data small,
# so C2's compilations cost more CPU than they save. Measured on test_cluster's
# shorter-copy test (master, worker, driver, executor): 42.4 CPU s -> 25.8 CPU s; adding
# -XX:+UseSerialGC saved nothing more (25.3). JAVA_TOOL_OPTIONS reaches every JVM: the
# session's driver, jet-ingest's in subprocesses, and the standalone cluster's master,
# worker and executors (the worker passes its environment on). Each JVM prints one
# "Picked up JAVA_TOOL_OPTIONS" line to its stderr.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


@pytest.fixture(scope="session", autouse=True)
def _test_jvm_options() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        given = os.environ.get("JAVA_TOOL_OPTIONS", "")
        if TEST_JVM_OPTIONS not in given:
            mp.setenv("JAVA_TOOL_OPTIONS", f"{given} {TEST_JVM_OPTIONS}".strip())
        yield


@pytest.fixture(scope="session")
def spark(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("pyspark")
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
