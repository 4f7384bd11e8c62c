"""Spark ingest of jet event logs (spec/JETLOG.md): the ``jetlog`` data source and ``jet-ingest``.

- :func:`register` adds the ``jetlog`` Python Data Source to a SparkSession.
- :mod:`tools.ingest.parse` is the JVM-free vectorised parser the source runs.
- :mod:`tools.ingest.cli` is ``jet-ingest LOGDIR --out WAREHOUSE``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``jetlog`` data source with ``spark`` (see :mod:`tools.ingest.source`)."""
    from .source import register as _register

    _register(spark)
