"""Automatic registration of the ``jetlog`` Spark data source.

PySpark (4.0 and later) imports every top-level module named ``pyspark_*`` it finds on
the Python path of its workers and registers the ``DefaultSource`` it defines, so with
jet installed ``spark.read.format("jetlog")`` works without any call. The source itself
lives in :mod:`tools.ingest.source`.
"""

from __future__ import annotations

from tools.ingest.source import JetlogDataSource as DefaultSource

__all__ = ["DefaultSource"]
