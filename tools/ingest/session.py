"""Building a SparkSession that can run the ``jetlog`` source.

The Python workers import ``tools.ingest`` and ``jetwire``. On one machine they inherit
``PYTHONPATH`` from the driver's environment, which :func:`spark_session` extends with
this repository. On a cluster, numpy and pyarrow cannot travel with ``--py-files``
(they are compiled): install the project with its ``spark`` extra on every node
(``pip install 'jet[spark]'``), or ship a packed environment with
``spark-submit --archives jet-env.tar.gz#env`` (made with ``venv-pack`` or
``conda-pack``) and ``--conf spark.pyspark.python=./env/bin/python``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Optional

__all__ = ["REPO_ROOT", "spark_session"]

REPO_ROOT = str(Path(__file__).resolve().parent.parent.parent)
DEFAULT_LOCAL_MEMORY = "4g"


def _with_repo(pythonpath: str) -> str:
    parts = [p for p in pythonpath.split(os.pathsep) if p]
    return os.pathsep.join([REPO_ROOT, *[p for p in parts if p != REPO_ROOT]])


def spark_session(master: Optional[str] = None, *, app: str = "jet-ingest", ui: bool = False,
                  conf: Optional[dict[str, str]] = None) -> Any:
    """Get or create a SparkSession with the ``jetlog`` source registered.

    ``master`` None leaves the master to ``spark-submit`` (or pyspark's own default,
    ``local[*]``); it is never hard-coded here. For local masters the driver binds to
    127.0.0.1 and the workers get this repository on their ``PYTHONPATH``.
    """
    from pyspark.sql import SparkSession

    from .source import register

    local = master is None or master.startswith("local")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYTHONPATH"] = _with_repo(os.environ.get("PYTHONPATH", ""))
    builder = SparkSession.builder.appName(app)
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.ui.enabled": "true" if ui else "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "8",
        "spark.executorEnv.PYTHONPATH": os.environ["PYTHONPATH"],
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        # Date-partitioned writes without the per-task sort Spark otherwise adds: a log
        # spans few dates, so a writer per date is cheap.
        "spark.sql.maxConcurrentOutputFileWriters": "32",
    }
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        if "spark.driver.memory" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
            # In local mode the driver JVM runs every task: Spark's default 1 GiB heap
            # makes the derived tables' sorts spill and collect garbage most of the time.
            settings["spark.driver.memory"] = DEFAULT_LOCAL_MEMORY
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
