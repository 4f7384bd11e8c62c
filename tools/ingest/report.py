"""The console summary (rich tables) and ``WAREHOUSE/report.html`` (matplotlib plots
embedded as base64 PNG) of an ingested warehouse."""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Optional
from typing import cast

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

__all__ = ["Summary", "collect_summary", "print_summary", "write_report"]


TOP = 10  # rows of each capped table


@dataclass
class Summary:
    """Small, collected results: everything the console and the HTML report show."""

    rows: dict[str, int]
    top_keys: pd.DataFrame
    latency: pd.DataFrame  # by function, key prefix and status; the TOP most requested OK and not OK
    errors: pd.DataFrame
    per_second: pd.DataFrame  # t, events: every bucket from the first to the last, idle ones 0
    latencies_ms: pd.DataFrame  # status, latency_ms (a sample)
    talkers: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    source: str = ""
    first: Optional[pd.Timestamp] = None
    last: Optional[pd.Timestamp] = None
    damage: pd.DataFrame = field(default_factory=pd.DataFrame)  # what, count
    damage_examples: pd.DataFrame = field(default_factory=pd.DataFrame)  # file, offset, corrupt (TOP)
    restarts: pd.DataFrame = field(default_factory=pd.DataFrame)  # daemon, run_ns, started (runs after the first)
    runs: int = 0
    # runs whose history the warehouse holds only in part (tools.ingest.warehouse.history_notes)
    history: list[str] = field(default_factory=list)
    # per table: its Delta version and what this run added (tools.ingest.cli.table_changes)
    versions: list[dict[str, Any]] = field(default_factory=list)

    def tables(self) -> pd.DataFrame:
        """Rows per table, with each table's version and the rows and files this run
        added when they are known."""
        out = pd.DataFrame({"table": list(self.rows), "rows": list(self.rows.values())})
        if self.versions:
            by_table = {c["table"]: c for c in self.versions}
            for column, key in (("version", "version"), ("rows added", "rows"), ("files added", "files")):
                out[column] = [by_table.get(t, {}).get(key, 0) for t in out["table"]]
        return out

    @property
    def damaged(self) -> bool:
        return bool(len(self.damage)) and int(self.damage["count"].sum()) > 0


def _pandas(df: DataFrame) -> pd.DataFrame:
    return cast(pd.DataFrame, df.toPandas())


def collect_summary(tables: dict[str, DataFrame], *, top: int = TOP, source: str = "",
                    history: Optional[list[str]] = None, versions: Optional[list[dict[str, Any]]] = None) -> Summary:
    """Aggregate the tables with Spark and collect the (small) results. ``source``: the
    log directory, shown in the report's header; ``history``: a line per daemon run whose
    history is partial (:func:`tools.ingest.warehouse.history_notes`), shown first;
    ``versions``: each table's version and what this run added
    (:func:`tools.ingest.cli.table_changes`), shown with the rows per table."""
    rows = {name: df.count() for name, df in tables.items()}
    frames, changes, reqs, conns = (tables[t] for t in ("frames", "state_changes", "requests", "connections"))
    top_keys = _pandas(
        changes.groupBy("key").agg(
            F.count("*").alias("changes"),
            ((F.max("ts_ns") - F.min("ts_ns")) / F.lit(1e9)).alias("span_s"),
        ).withColumn("per_s", F.col("changes") / F.greatest(F.col("span_s"), F.lit(1.0)))
        .orderBy(F.desc("per_s"), F.desc("changes"), "key").limit(top)
    )
    answered = reqs.filter(F.col("latency_ns").isNotNull())
    # By status too: a peak of TIMEOUTs (seconds) must not hide in the OK requests' p99.
    # Capped: the most requested groups answered OK, and as many of the others (so a
    # rare error status is not cut off by the busy OK groups).
    groups = answered.groupBy("function", "key_prefix", "status").agg(
        F.count("*").alias("n"),
        F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], 10000).alias("p"),
        F.max("latency_ms").alias("max_ms"),
    )
    order: list[Any] = [F.desc("n"), "function", "key_prefix", "status"]
    latency = pd.concat([_pandas(groups.filter(F.col("status") == "OK").orderBy(*order).limit(top)),
                         _pandas(groups.filter(F.col("status") != "OK").orderBy(*order).limit(top))],
                        ignore_index=True)
    if len(latency):
        latency[["p50_ms", "p95_ms", "p99_ms"]] = pd.DataFrame(latency.pop("p").tolist(), index=latency.index)
        latency = latency[["function", "key_prefix", "status", "n", "p50_ms", "p95_ms", "p99_ms", "max_ms"]]
    else:
        latency = pd.DataFrame(columns=["function", "key_prefix", "status", "n", "p50_ms", "p95_ms", "p99_ms",
                                        "max_ms"])
    # Error counts and records per second from the traffic rollup (records per second
    # and error status), not from every record; coarsened to at most ~600 buckets here.
    by_second = _pandas(
        tables["traffic"].groupBy(F.unix_seconds("second").alias("s"), F.col("error_status").alias("error"))
        .agg(F.sum("records").alias("count"))
    )
    errors = (by_second.dropna(subset=["error"]).groupby("error", as_index=False)["count"].sum()
              .rename(columns={"error": "status"}).sort_values(["count", "status"], ascending=[False, True])
              .head(top).reset_index(drop=True))
    per_second = pd.DataFrame(columns=["t", "events"])
    first = last = None
    if len(by_second):
        lo, hi = int(by_second["s"].min()), int(by_second["s"].max())
        first, last = pd.Timestamp(lo, unit="s", tz="UTC"), pd.Timestamp(hi, unit="s", tz="UTC")
        width = max(1, (hi - lo) // 600 + 1)  # seconds per bucket
        counts = by_second.groupby((by_second["s"] - lo) // width)["count"].sum()
        # Every bucket, idle ones as 0: a line drawn straight across a gap would show
        # traffic that never happened.
        counts = counts.reindex(range((hi - lo) // width + 1), fill_value=0).sort_index()
        per_second = pd.DataFrame({
            "t": pd.to_datetime((lo + counts.index.to_numpy() * width) * 10**9, unit="ns", utc=True),
            "events": counts.to_numpy() / width,
        })
    # Daemon runs: each starts with its first segment (run_ns = its created_ns).
    runs = _pandas(tables["traffic"].groupBy("daemon", "run_ns").agg(F.min("second").alias("started"))
                   .orderBy("started"))
    restarts = runs.iloc[runs.groupby("daemon").cumcount().to_numpy() > 0].reset_index(drop=True) if len(runs) \
        else runs
    # Damage at the top: what the log could not give (JETLOG.md 5), and requests left open.
    bad = frames.filter(F.col("corrupt").isNotNull())
    kinds = _pandas(bad.groupBy(
        F.when(F.col("corrupt").contains("truncat"), "truncated record")
        .when(F.col("corrupt").startswith("bad segment header"), "bad segment header")
        .otherwise("damaged region").alias("what")).agg(F.count("*").alias("count")))
    unanswered = reqs.filter(F.col("status") == "UNANSWERED").count()
    damage = pd.concat([kinds, pd.DataFrame({"what": ["unanswered request"], "count": [unanswered]})],
                       ignore_index=True)
    damage = damage[damage["count"] > 0].reset_index(drop=True)
    examples = _pandas(bad.select("file", "offset", "corrupt").orderBy("file", "offset").limit(top))
    sample = answered.select("status", "latency_ms")
    n = rows["requests"]
    if n > 200_000:
        sample = sample.sample(fraction=200_000 / n, seed=1)
    latencies = _pandas(sample)
    talkers = _pandas(
        conns.withColumn("frames", F.col("frames_in") + F.col("frames_out"))
        .withColumn("bytes", F.col("bytes_in") + F.col("bytes_out"))
        .orderBy(F.desc("frames"), "conn_id").limit(15)
        .select("run_ns", "conn_id", "name", "address", "frames", "bytes")
    )
    return Summary(rows, top_keys, latency, errors, per_second, latencies, talkers, source=source, first=first,
                   last=last, damage=damage, damage_examples=examples, restarts=restarts, runs=len(runs),
                   history=list(history or []), versions=list(versions or []))


def _table(title: str, df: pd.DataFrame, floats: str = "{:.3f}") -> Table:
    t = Table(title=title, title_justify="left")
    for col in df.columns:
        t.add_column(str(col), justify="right" if pd.api.types.is_numeric_dtype(df[col]) else "left")
    for row in df.itertuples(index=False):
        t.add_row(*[floats.format(v) if isinstance(v, float) else str(v) for v in row])
    return t


def _span(summary: Summary) -> str:
    if summary.first is None or summary.last is None:
        return "no records"
    return f"{summary.first:%Y-%m-%d %H:%M:%S} to {summary.last:%Y-%m-%d %H:%M:%S} UTC"


def print_summary(summary: Summary, console: Console | None = None) -> None:
    """Print the damage found first, then rows per table, top keys, latency percentiles
    by status and error counts."""
    console = console or Console()
    from rich.text import Text

    for note in summary.history:  # first: it says how to read everything below
        console.print(Text(note, style="bold yellow"), soft_wrap=True)
    console.print(f"source: {summary.source or '?'}; records from {_span(summary)}; "
                  f"{summary.runs} daemon run(s)", highlight=False)
    if summary.damaged:
        console.print(_table("[bold red]Damage found[/bold red]", summary.damage))
    else:
        console.print("no damage found: every record read, every request answered")
    console.print(_table("Rows per table", summary.tables()))
    console.print(_table("Top keys by change rate", summary.top_keys))
    console.print(_table("SET/CALL latency (ms) by key prefix and status", summary.latency))
    console.print(_table("Error responses by status", summary.errors))
    for note in summary.notes:
        console.print(note)


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


_STYLE = """
body{font-family:sans-serif;margin:2em;max-width:1100px}
table{border-collapse:collapse;margin-bottom:1em}
td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
header p{color:#333;margin:.2em 0}
.damage{border:3px solid #c00;background:#fff0f0;padding:.5em 1em;margin:1em 0}
.damage h2{color:#c00;margin-top:.2em}
.clean{border:2px solid #2a2;background:#f0fff0;padding:.5em 1em;margin:1em 0}
"""


def write_report(summary: Summary, path: Path) -> None:
    """Write the HTML report with its plots embedded (no external files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    images: list[tuple[str, str]] = []
    fig, ax = plt.subplots(figsize=(9, 3))
    if len(summary.per_second):
        ax.plot(summary.per_second["t"], summary.per_second["events"], lw=1, drawstyle="steps-post")
        ax.set_ylim(bottom=0)
    for _, run in summary.restarts.iterrows():
        ax.axvline(run["started"], color="#c00", ls="--", lw=1)
        ax.annotate("restart", (run["started"], 1), xycoords=("data", "axes fraction"), color="#c00",
                    rotation=90, va="top", ha="right", fontsize=8)
    ax.set_title("Records per second (idle time drawn as 0; dashed: daemon restarts)")
    ax.set_ylabel("records/s")
    images.append(("Records per second over time", _png(fig)))
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(9, 3))
    lat = summary.latencies_ms[summary.latencies_ms["latency_ms"] > 0] if len(summary.latencies_ms) \
        else summary.latencies_ms
    if len(lat):
        lo, hi = float(lat["latency_ms"].min()), float(lat["latency_ms"].max())
        bins = np.logspace(np.log10(lo), np.log10(hi * 1.01 if hi > lo else lo * 2), 50)
        statuses = lat.groupby("status").size().sort_values(ascending=False).index.tolist()
        ax.hist([lat.loc[lat["status"] == st, "latency_ms"] for st in statuses], bins=bins.tolist(),
                label=[str(st) for st in statuses], stacked=True)
        ax.set_xscale("log")
        ax.legend(title="status", fontsize=8)
    ax.set_title("SET/CALL latency by status (request in to response out)")
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

    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>jet ingest report</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<header><h1>jet event-log ingest</h1>",
        *(["<section class='damage' id='history'><h2>Partial history</h2>",
            *[f"<p>{esc(note)}</p>" for note in summary.history], "</section>"] if summary.history else []),
        f"<p id='source'>source: <code>{esc(summary.source or '?')}</code></p>",
        f"<p id='range'>records from {esc(_span(summary))}; {summary.runs} daemon run(s), "
        f"{len(summary.restarts)} restart(s)</p></header>",
    ]
    if summary.damaged:
        parts += ["<section class='damage' id='damage'><h2>Damage found</h2>",
                  summary.damage.to_html(index=False),
                  f"<p>first {TOP} damaged places:</p>" if len(summary.damage_examples) else "",
                  summary.damage_examples.to_html(index=False) if len(summary.damage_examples) else "",
                  "</section>"]
    else:
        parts.append("<section class='clean' id='damage'>No damage found: every record read, every request "
                     "answered.</section>")
    parts += [
        "<h2>Rows per table</h2>", summary.tables().to_html(index=False).replace("<table", "<table id='tables'", 1),
        f"<h2>Top {TOP} keys by change rate</h2>", summary.top_keys.to_html(index=False),
        f"<h2>SET/CALL latency (ms) by key prefix and status (top {TOP} by requests, OK and not)</h2>",
        summary.latency.to_html(index=False, float_format=lambda v: f"{v:.3f}"),
        "<h2>Error responses by status</h2>", summary.errors.to_html(index=False),
    ]
    for title, data in images:
        parts.append(f"<h2>{esc(title)}</h2><img alt='{esc(title)}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts), encoding="utf-8")
