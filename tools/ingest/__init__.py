"""Spark ingest of jet event logs (spec/JETLOG.md): the ``jetlog`` data source and ``jet-ingest``.

- :func:`register` adds the ``jetlog`` Python Data Source to a SparkSession.
- :mod:`tools.ingest.parse` is the JVM-free vectorised parser the source runs.
- :mod:`tools.ingest.cli` is ``jet-ingest LOGDIR --out WAREHOUSE``.
- :func:`read_table` reads a table of a warehouse (Delta Lake), at a version or time if asked.
"""

from __future__ import annotations

from typing import Any

__all__ = ["read_table", "register"]


def register(spark: Any) -> None:
    """Register the ``jetlog`` data source with ``spark`` (see :mod:`tools.ingest.source`)."""
    from .source import register as _register

    _register(spark)


def read_table(spark: Any, warehouse: Any, name: str, *, version: Any = None, timestamp: Any = None) -> Any:
    """Table ``name`` of ``warehouse`` (a Delta Lake table) as a DataFrame, at a
    ``version`` or ``timestamp`` or its latest (see :func:`tools.ingest.cli.read_table`)."""
    from .cli import read_table as _read_table

    return _read_table(spark, warehouse, name, version=version, timestamp=timestamp)
