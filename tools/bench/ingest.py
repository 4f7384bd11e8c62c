"""Benchmark of the Spark ingest: ``python -m tools.bench.ingest [--records N] [--repeat R]``.

1. Writes N records (default 2,000,000) of a realistic routed-request mix
   (:mod:`tools.ingest.synth`) as jet log segments of about 1M records each.
2. Writes the same records as JSON lines (the ``jetlog`` rows, value as base64).
3. In one local[2] SparkSession, times R times each: ``format("jetlog")`` -> Parquet,
   and Spark's native JSON reader (explicit schema, no inference) -> Parquet.
4. Times the whole ``jet-ingest LOGDIR --out WAREHOUSE`` as a subprocess into a fresh
   warehouse (JVM start, frames, derived tables, summary and report included): once with
   ``JET_INGEST_CDS=1`` and no archive yet (that run records one), then R times each,
   interleaved, as by default (no archive) and with the archive.

Prints a markdown table of medians and the jetlog/JSON ratio.

``--against TREE`` times only the whole ``jet-ingest`` (step 4, no class-data-sharing
archive), from this tree and from another checkout ``TREE`` (e.g. ``git archive`` of an
older commit unpacked), interleaved, each into a fresh warehouse: wall time and the CPU
of the command and every process under it (the driver JVM and its Python workers),
sampled from ``/proc`` until it exits. On a shared machine the CPU is the steadier figure.

``--mode source`` times the ``jetlog`` source alone against ``spark.read.json`` on the
same records, in one session, interleaved: ``count()``, and a time-range filter
matching about 1% of the records (``ts`` between two times; for jetlog both as a plain
filter, which reads the whole log, and with the ``since``/``until`` options, which read
only that time's byte ranges), with the share of the log's bytes the jetlog planner
hands to its tasks for the options (what is read). Beside the
times, it reads the CPU each query costs the Spark JVM and every process under it (the
Python workers): on a shared machine, steadier than the times.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """User and system CPU seconds of process ``root`` and all its descendants, with the
    children they have reaped (``/proc/PID/stat``: utime, stime, cutime, cstime)."""
    children: dict[int, list[int]] = {}
    used: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                text = stat.read()
        except OSError:  # exited meanwhile
            continue
        fields = text[text.rindex(b")") + 2 :].split()  # after the command name: state, ppid, ...
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        used[int(entry.name)] = sum(int(f) for f in fields[11:15])
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0)
        todo += children.get(pid, [])
    return total / _TICKS_PER_SECOND


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    parser.add_argument("--mode", choices=["all", "source"], default="all",
                        help="source: only the jetlog source against the JSON reader (count, 1%% time filter)")
    parser.add_argument("--against", metavar="TREE",
                        help="only the whole jet-ingest, this tree against the checkout TREE, interleaved")
    args = parser.parse_args(argv)

    from tools.ingest.session import REPO_ROOT
    from tools.ingest.session import spark_session
    from tools.ingest.synth import BASE_NS
    from tools.ingest.synth import write_synthetic_log

    work = Path(args.keep or tempfile.mkdtemp(prefix="jet-bench-ingest-"))
    logs = work / "logs"
    shutil.rmtree(work / "logs", ignore_errors=True)
    logs.mkdir(parents=True)
    rounds = int(args.records / 7.4)  # tools.ingest.synth: 7.4 records per round on average
    total = 0
    per_segment = max(1, rounds // max(1, round(args.records / 1_000_000)))
    segment = 0
    t = time.perf_counter()
    while rounds > 0:
        n = min(per_segment, rounds)
        total += write_synthetic_log(str(logs / f"jet-bench-{segment:06d}.jetlog"), n, segment=segment,
                                     start_ns=BASE_NS + segment * 10**12)
        rounds -= n
        segment += 1
    gen_s = time.perf_counter() - t
    log_bytes = sum(f.stat().st_size for f in logs.iterdir())

    if args.against:
        _against(logs, work, total, log_bytes, segment, args)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    spark = spark_session(args.master, app="jet-bench-ingest")
    from tools.ingest.parse import SPARK_SCHEMA

    jsonl = work / "json"
    if not jsonl.exists():
        spark.read.format("jetlog").load(str(logs)).write.mode("overwrite").json(str(jsonl))
    json_bytes = sum(f.stat().st_size for f in jsonl.glob("*.json"))
    out = work / "parquet"

    def jetlog_run() -> None:
        spark.read.format("jetlog").load(str(logs)).write.mode("overwrite").parquet(str(out / "jetlog"))

    def json_run() -> None:
        spark.read.schema(SPARK_SCHEMA).json(str(jsonl)).write.mode("overwrite").parquet(str(out / "json"))

    if args.mode == "source":
        _source_bench(spark, logs, jsonl, total, log_bytes, json_bytes, segment, args)
        spark.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    jetlog_run()  # warm-up: the first Python data source query pays for worker start-up
    json_run()
    jet_t, json_t = [], []
    for _ in range(args.repeat):  # interleaved, so both see the same machine load
        jet_t.append(_timed(jetlog_run))
        json_t.append(_timed(json_run))
    counted = spark.read.parquet(str(out / "jetlog")).count()
    spark.stop()
    assert counted == total, (counted, total)

    warehouse = work / "warehouse"
    cds_dir = work / "cds"  # the class-data-sharing archive (tools/ingest/README.md), this run's own
    shutil.rmtree(cds_dir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "JET_INGEST_CDS_DIR": str(cds_dir)}
    cmd = [sys.executable, "-m", "tools.ingest", str(logs), "--out", str(warehouse)]
    if args.master:
        cmd += ["--master", args.master]

    def ingest(extra_env: dict[str, str]) -> float:
        shutil.rmtree(warehouse, ignore_errors=True)  # a first ingest of everything
        return _timed(lambda: subprocess.run(cmd, env={**env, **extra_env}, check=True, stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL))

    first_t = ingest({"JET_INGEST_CDS": "1"})  # records the archive: its driver JVM writes it after the CLI returns
    from tools.ingest.session import class_data_sharing

    deadline = time.monotonic() + 180
    os.environ["JET_INGEST_CDS"] = "1"
    while "SharedArchiveFile" not in (class_data_sharing(str(cds_dir)) or ""):  # settled, checked, promoted
        if time.monotonic() > deadline:
            raise SystemExit(f"no usable class-data-sharing archive in {cds_dir} after the first run")
        time.sleep(2)
    with_t, without_t = [], []
    for _ in range(args.repeat):  # interleaved: the default (no archive), and with the archive
        without_t.append(ingest({"JET_INGEST_CDS": "0"}))
        with_t.append(ingest({"JET_INGEST_CDS": "1"}))
    if not any(cds_dir.glob("spark-driver-*.jsa")):
        raise SystemExit("the class-data-sharing archive was not written or not kept")
    ingest_s, plain_s = statistics.median(with_t), statistics.median(without_t)

    jm, sm = statistics.median(jet_t), statistics.median(json_t)
    print(f"\n{total:,} records, {log_bytes / 2**20:.0f} MiB of jet log in {segment} segments "
          f"({json_bytes / 2**20:.0f} MiB as JSON lines); generated in {gen_s:.1f} s; "
          f"master {args.master}; medians of {args.repeat} interleaved runs\n")
    print("| what | time (s) | records/s |")
    print("|---|---|---|")
    print(f"| `format(\"jetlog\")` -> Parquet | {jm:.1f} | {total / jm:,.0f} |")
    print(f"| native JSON reader (explicit schema) -> Parquet | {sm:.1f} | {total / sm:,.0f} |")
    print(f"| jetlog / JSON speed ratio | | {sm / jm:.2f}x |")
    print(f"| whole `jet-ingest` (JVM start, all tables, summary, report) | {plain_s:.1f} | {total / plain_s:,.0f} |")
    print(f"| same, with the class-data-sharing archive (`JET_INGEST_CDS=1`) | {ingest_s:.1f} "
          f"| {total / ingest_s:,.0f} |")
    print(f"| same, `JET_INGEST_CDS=1`, first run (records the archive) | {first_t:.1f} | {total / first_t:,.0f} |")
    print(f"\nwhole `jet-ingest` runs with the archive: {', '.join(f'{t:.1f}' for t in with_t)} s; "
          f"without: {', '.join(f'{t:.1f}' for t in without_t)} s")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run_with_cpu(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``cmd``; returns its wall time and the CPU seconds of it and every process
    under it (sampled every 0.1 s until it exits: at most the last 0.1 s is missed;
    its own and its waited-for children's from ``wait4``, whichever is more)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen(cmd, env=env, stdout=output, stderr=subprocess.STDOUT)
        seen = 0.0
        while True:
            try:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            except ChildProcessError:
                raise SystemExit(f"lost {cmd}") from None
            if pid:
                break
            seen = max(seen, tree_cpu_seconds(proc.pid))
            time.sleep(0.1)
        took = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            output.seek(0)
            tail = output.read().decode(errors="replace")[-3000:]
            raise SystemExit(f"{cmd} exited with {proc.returncode}:\n{tail}")
    return took, max(seen, usage.ru_utime + usage.ru_stime)


def _against(logs: Path, work: Path, total: int, log_bytes: int, segments: int, args: argparse.Namespace) -> None:
    """Whole ``jet-ingest`` runs, this tree and ``args.against``, interleaved."""
    from tools.ingest.session import REPO_ROOT

    trees = {"this tree": REPO_ROOT, f"{args.against}": str(Path(args.against).resolve())}
    wall: dict[str, list[float]] = {name: [] for name in trees}
    cpu: dict[str, list[float]] = {name: [] for name in trees}
    warehouse = work / "warehouse"
    for _ in range(args.repeat):
        for name, tree in trees.items():
            shutil.rmtree(warehouse, ignore_errors=True)  # a first ingest of everything
            env = {**os.environ, "PYTHONPATH": tree, "JET_INGEST_CDS": "0"}
            cmd = [sys.executable, "-m", "tools.ingest", str(logs), "--out", str(warehouse), "--master", args.master]
            took, used = run_with_cpu(cmd, env)
            wall[name].append(took)
            cpu[name].append(used)
    load = os.getloadavg()
    print(f"\n{total:,} records, {log_bytes / 2**20:.0f} MiB of jet log in {segments} segments; master {args.master}; "
          f"{args.repeat} interleaved runs each; load average at the end {load[0]:.1f} / {load[1]:.1f} / "
          f"{load[2]:.1f}\n")
    print("| tree | wall, median (s) | records/s (wall) | CPU, median (s) | records/s of CPU |")
    print("|---|---|---|---|---|")
    for name in trees:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(f"| {name} | {w:.1f} | {total / w:,.0f} | {c:.1f} | {total / c:,.0f} |")
    for name in trees:
        print(f"- {name}: wall {', '.join(f'{x:.1f}' for x in wall[name])} s; "
              f"CPU {', '.join(f'{x:.1f}' for x in cpu[name])} s")


def _source_bench(spark: Any, logs: Path, jsonl: Path, total: int, log_bytes: int, json_bytes: int, segments: int,
                  args: argparse.Namespace) -> None:
    """``count()`` and a 1% time-range filter: jetlog against the JSON reader."""
    import datetime

    from pyspark.sql import functions as F

    from tools.ingest.parse import SPARK_SCHEMA
    from tools.ingest.source import JetlogReader
    from tools.ingest.synth import BASE_NS

    # The synthetic records are 1 us apart from each segment's start (BASE_NS + s * 1e12):
    # a window of total/100 us in the middle of the last segment holds about 1% of them.
    mid = BASE_NS + (segments - 1) * 10**12 + 100 * 10**6
    lo = datetime.datetime.fromtimestamp(mid / 1e9, datetime.UTC)
    hi = lo + datetime.timedelta(milliseconds=max(1, total // 100_000))  # whole ms: JSON keeps ts to the ms
    window = (F.col("ts") >= F.lit(lo)) & (F.col("ts") < F.lit(hi))

    def jet() -> Any:
        return spark.read.format("jetlog").load(str(logs))

    def js() -> Any:
        return spark.read.schema(SPARK_SCHEMA).json(str(jsonl))

    bounds = {"since": lo.isoformat(), "until": hi.isoformat()}

    def jet_window() -> Any:
        return spark.read.format("jetlog").options(**bounds).load(str(logs))

    runs: dict[str, Callable[[], int]] = {
            "jetlog count": lambda: jet().count(), "JSON count": lambda: js().count(),
            "jetlog 1% time range": lambda: jet_window().filter(window).count(),
            "jetlog 1% time range, filter only": lambda: jet().filter(window).count(),
            "JSON 1% time range": lambda: js().filter(window).count()}
    results = {name: fn() for name, fn in runs.items()}  # warm-up, and the answers
    assert results["jetlog count"] == results["JSON count"] == total, results
    assert (results["jetlog 1% time range"] == results["jetlog 1% time range, filter only"]
            == results["JSON 1% time range"] > 0), results
    times: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    jvm = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
    for _ in range(args.repeat):  # interleaved, so all see the same machine load
        for name, fn in runs.items():
            before = tree_cpu_seconds(jvm)
            times[name].append(_timed(fn))
            cpu[name].append(tree_cpu_seconds(jvm) - before)
    reader = JetlogReader({"path": str(logs), **bounds})
    planned = sum((stop if stop is not None else lim or 0) - start
                  for part in reader.partitions() for _, start, stop, lim in part.ranges  # type: ignore[attr-defined]
                  )
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{total:,} records, {log_bytes / 2**20:.0f} MiB of jet log in {segments} segments "
          f"({json_bytes / 2**20:.0f} MiB as JSON lines); master {args.master}; medians of {args.repeat} "
          f"interleaved runs; the time range matches {results['jetlog 1% time range']:,} records "
          f"({100 * results['jetlog 1% time range'] / total:.2f}%)\n")
    cpu_med = {name: statistics.median(t) for name, t in cpu.items()}
    print("| query | jetlog (s) | JSON (s) | jetlog / JSON time | jetlog CPU (s) | JSON CPU (s) | jetlog / JSON CPU |")
    print("|---|---|---|---|---|---|---|")
    for what, other in (("count", "count"), ("1% time range", "1% time range"),
                        ("1% time range, filter only", "1% time range")):
        j, s = med[f"jetlog {what}"], med[f"JSON {other}"]
        jc, sc = cpu_med[f"jetlog {what}"], cpu_med[f"JSON {other}"]
        print(f"| `{what}` | {j:.2f} | {s:.2f} | {j / s:.2f}x | {jc:.2f} | {sc:.2f} | {jc / sc:.2f}x |")
    print(f"\njetlog bytes planned for the time range (since/until options): {planned:,} of {log_bytes:,} ({100 * planned / log_bytes:.2f}%)")
    for name, t in times.items():
        print(f"- {name}: {', '.join(f'{x:.2f}' for x in t)} s; CPU {', '.join(f'{x:.2f}' for x in cpu[name])} s")


if __name__ == "__main__":
    sys.exit(main())
