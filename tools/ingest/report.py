"""The console summary (rich tables) and ``WAREHOUSE/report.html`` (matplotlib plots
embedded as base64 PNG) of an ingested warehouse."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

__all__ = ["Summary", "collect_summary", "print_summary", "write_report"]


@dataclass
class Summary:
    """Small, collected results: everything the console and the HTML report show."""

    rows: dict[str, int]
    top_keys: pd.DataFrame
    latency: pd.DataFrame
    errors: pd.DataFrame
    per_second: pd.DataFrame
    latencies_ms: pd.Series
    talkers: pd.DataFrame
    notes: list[str] = field(default_factory=list)


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


def collect_summary(tables: dict[str, DataFrame], *, top: int = 10, source: str = "") -> Summary:
    """Aggregate the tables with Spark and collect the (small) results."""
    rows = {name: df.count() for name, df in tables.items()}
    changes, reqs, conns = (tables[t] for t in ("state_changes", "requests", "connections"))
    top_keys = _pandas(
        changes.groupBy("key").agg(
            F.count("*").alias("changes"),
            ((F.max("ts_ns") - F.min("ts_ns")) / F.lit(1e9)).alias("span_s"),
        ).withColumn("per_s", F.col("changes") / F.greatest(F.col("span_s"), F.lit(1.0)))
        .orderBy(F.desc("per_s"), F.desc("changes"), "key").limit(top)
    )
    answered = reqs.filter(F.col("latency_ns").isNotNull())
    latency = _pandas(
        answered.groupBy("function", "key_prefix").agg(
            F.count("*").alias("n"),
            F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], 10000).alias("p"),
        ).orderBy("function", "key_prefix")
    )
    if len(latency):
        latency[["p50_ms", "p95_ms", "p99_ms"]] = pd.DataFrame(latency.pop("p").tolist(), index=latency.index)
    else:
        latency = pd.DataFrame(columns=["function", "key_prefix", "n", "p50_ms", "p95_ms", "p99_ms"])
    # Error counts and records per second from the traffic rollup (records per second
    # and error status), not from every record; coarsened to at most ~600 buckets here.
    by_second = _pandas(
        tables["traffic"].groupBy(F.unix_seconds("second").alias("s"), F.col("error_status").alias("error"))
        .agg(F.sum("records").alias("count"))
    )
    errors = (by_second.dropna(subset=["error"]).groupby("error", as_index=False)["count"].sum()
              .rename(columns={"error": "status"}).sort_values(["count", "status"], ascending=[False, True])
              .reset_index(drop=True))
    per_second = pd.DataFrame(columns=["t", "events"])
    if len(by_second):
        lo, hi = int(by_second["s"].min()), int(by_second["s"].max())
        width = max(1, (hi - lo) // 600 + 1)  # seconds per bucket
        counts = by_second.groupby((by_second["s"] - lo) // width)["count"].sum().sort_index()
        per_second = pd.DataFrame({
            "t": pd.to_datetime((lo + counts.index.to_numpy() * width) * 10**9, unit="ns", utc=True),
            "events": counts.to_numpy() / width,
        })
    sample = answered.select("latency_ms")
    n = rows["requests"]
    if n > 200_000:
        sample = sample.sample(fraction=200_000 / n, seed=1)
    latencies = _pandas(sample)["latency_ms"]
    talkers = _pandas(
        conns.withColumn("frames", F.col("frames_in") + F.col("frames_out"))
        .withColumn("bytes", F.col("bytes_in") + F.col("bytes_out"))
        .orderBy(F.desc("frames"), "conn_id").limit(15)
        .select("run_ns", "conn_id", "name", "address", "frames", "bytes")
    )
    return Summary(rows, top_keys, latency, errors, per_second, latencies, talkers)


def _table(title: str, df: pd.DataFrame, floats: str = "{:.3f}") -> Table:
    t = Table(title=title, title_justify="left")
    for col in df.columns:
        t.add_column(str(col), justify="right" if pd.api.types.is_numeric_dtype(df[col]) else "left")
    for row in df.itertuples(index=False):
        t.add_row(*[floats.format(v) if isinstance(v, float) else str(v) for v in row])
    return t


def print_summary(summary: Summary, console: Console | None = None) -> None:
    """Print rows per table, top keys, latency percentiles and error counts."""
    console = console or Console()
    console.print(_table("Rows per table", pd.DataFrame({"table": list(summary.rows), "rows": list(summary.rows.values())})))
    console.print(_table("Top keys by change rate", summary.top_keys))
    console.print(_table("SET/CALL latency (ms) by key prefix", summary.latency))
    console.print(_table("Error responses by status", summary.errors))
    for note in summary.notes:
        console.print(note)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def write_report(summary: Summary, path: Path) -> None:
    """Write the HTML report with its plots embedded (no external files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images: list[tuple[str, str]] = []
    fig, ax = plt.subplots(figsize=(9, 3))
    if len(summary.per_second):
        ax.plot(summary.per_second["t"], summary.per_second["events"], lw=1)
    ax.set_title("Records per second")
    ax.set_ylabel("records/s")
    images.append(("Events per second over time", _png(fig)))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 3))
    lat = summary.latencies_ms[summary.latencies_ms > 0]
    if len(lat):
        import numpy as np

        bins = np.logspace(np.log10(lat.min()), np.log10(lat.max() * 1.01), 50)
        ax.hist(lat, bins=bins.tolist())
        ax.set_xscale("log")
    ax.set_title("SET/CALL latency (request in to response out)")
    ax.set_xlabel("ms")
    images.append(("Latency histogram", _png(fig)))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 4))
    if len(summary.talkers):
        labels = [f"{n or '?'} (conn {c})" for n, c in zip(summary.talkers["name"], summary.talkers["conn_id"], strict=True)]
        ax.barh(labels[::-1], summary.talkers["frames"][::-1])
    ax.set_title("Top talkers (frames in + out)")
    images.append(("Top talkers", _png(fig)))
    plt.close(fig)

    rows = pd.DataFrame({"table": list(summary.rows), "rows": list(summary.rows.values())})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>jet ingest report</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style></head><body>",
        "<h1>jet event-log ingest</h1>",
        "<h2>Rows per table</h2>", rows.to_html(index=False),
        "<h2>Top keys by change rate</h2>", summary.top_keys.to_html(index=False),
        "<h2>SET/CALL latency (ms) by key prefix</h2>", summary.latency.to_html(index=False),
        "<h2>Error responses by status</h2>", summary.errors.to_html(index=False),
    ]
    for title, data in images:
        parts.append(f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
