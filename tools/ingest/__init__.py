"""Spark ingest of jet event logs (spec/JETLOG.md): the ``jetlog`` data source and ``jet-ingest``.

- :func:`register` adds the ``jetlog`` Python Data Source to a SparkSession.
- :mod:`tools.ingest.parse` is the JVM-free vectorised parser the source runs.
- :mod:`tools.ingest.cli` is ``jet-ingest LOGDIR --out WAREHOUSE``.
- :func:`read_table` reads a table of a warehouse's current snapshot.
"""

from __future__ import annotations

from typing import Any

__all__ = ["read_table", "register"]


def register(spark: Any) -> None:
    """Register the ``jetlog`` data source with ``spark`` (see :mod:`tools.ingest.source`)."""
    from .source import register as _register

    _register(spark)


def read_table(spark: Any, warehouse: Any, name: str) -> Any:
    """Table ``name`` of ``warehouse``'s current snapshot as a DataFrame (see
    :func:`tools.ingest.cli.read_table`)."""
    from .cli import read_table as _read_table

    return _read_table(spark, warehouse, name)
