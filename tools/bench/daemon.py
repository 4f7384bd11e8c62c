"""Daemon benchmark: jetd against node-jet 3 (classic JSON Jet) on workloads W1-W5 of issue 3.

Usage::

    python -m tools.bench.daemon [--workloads W1,W2,...] [--quick] [--against jetd|nodejet|both|all]

Each workload runs on a fresh daemon started as a child process on 127.0.0.1 (jetd as
``python -m jetd --host 127.0.0.1 --port 0``; node-jet 3.0.17 installed with npm into a
scratch directory on first use). The load generator is this process: plain sockets, one
``selectors`` loop, header-only scanning. The daemon's own CPU seconds come from the
scheduler's counts (``/proc/PID/task/*/schedstat``) around every measured window, so
"CPU per operation" figures hold even when the generator saturates its core. Figures are medians over repetitions; the
ratio column compares numbers from the same invocation. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path

from . import daemon_procs
from .daemon_procs import DEFAULT_NODEJET_PREFIX
from .daemon_procs import REPO
from .daemon_procs import DaemonProcess
from .daemon_procs import DaemonUnavailable
from .daemon_procs import ensure_nodejet
from .daemon_procs import start_daemon
from .daemon_wire import dialect_for
from .daemon_workloads import WORKLOADS
from .daemon_workloads import Sample
from .daemon_workloads import Sizes

KIND_LABELS = {
    "jetd": "jetd",
    "jetd-log": "jetd --log-dir",
    "jetd-always": "jetd --log-dir --log-fsync always",
    "jetd-auth": "jetd --auth",
    "nodejet": "node-jet 3",
}
AGAINST = {
    "jetd": ["jetd"],
    "nodejet": ["nodejet"],
    "both": ["jetd", "nodejet"],
    "all": ["jetd", "jetd-log", "nodejet"],
    "auth": ["jetd", "jetd-auth"],
}

# jetd --auth for the benchmark (PROTOCOL.md 15): the load generator does not
# authenticate, so the anonymous entry carries the permissions. They are prefixes of the
# workloads' keys (never "", which would skip every check): each routed set takes the
# write check (cached per connection and key) and each fetch of everything is indexed
# under these prefixes, as for any user with restricted permissions.
BENCH_USERS = """\
[anonymous]
own = ["w1/", "w2/", "w3/", "w4/", "w5/"]
read = ["w1/", "w2/", "w3/", "w4/", "w5/", "bench/"]
write = ["w1/", "w2/", "w3/", "w4/", "w5/"]
"""


@dataclass(frozen=True)
class Target:
    """A target from issue 3 for jetd: ``value`` with ``op`` "<=" or ">="."""

    op: str
    value: float
    text: str

    def met(self, measured: float) -> bool:
        return measured <= self.value if self.op == "<=" else measured >= self.value


def target_for(sample: Sample) -> Target | None:
    """The issue's target for a metric, if it has one."""
    metric = sample.metric
    if metric.startswith("pipelined"):
        return Target(">=", 150_000, "≥ 150,000/s")
    if metric.startswith("daemon CPU per routed set"):
        return Target("<=", 5.0, "≤ 5 µs")
    if sample.workload.startswith("W2") and metric.endswith("delivered events/s"):
        return Target(">=", 1_000_000, "≥ 1,000,000/s")
    if metric.endswith("daemon CPU per delivered event"):
        return Target("<=", 1.0, "≤ 1 µs")
    if "time to last add" in metric:
        return Target("<=", 15.0, "≤ 15 ms")
    if metric.startswith("RSS per cached state"):
        return Target("<=", 300.0, "≤ 300 B")
    if metric.startswith("RSS per idle connection"):
        return Target("<=", 10.0, "≤ 10 KiB")
    if metric.startswith("rate with / without") or metric.startswith("CPU per event without / with"):  # W5
        return Target(">=", 0.9, "≥ 0.90 (within 10%)")
    return None


def higher_is_better(sample: Sample) -> bool:
    return sample.unit in ("/s", "ratio")


def format_value(value: float, unit: str) -> str:
    """A human-readable number with its unit."""
    if unit == "/s":
        return f"{value:,.0f}/s"
    if unit == "count":
        return f"{value:,.0f}"
    if unit == "cores":
        return f"{value:.2f} cores"
    if unit == "ratio":
        return f"{value:.2f}"
    if unit in ("µs", "ms"):
        return f"{value:,.1f} {unit}" if value >= 10 else f"{value:.2f} {unit}"
    if unit == "B":
        return f"{value:,.0f} B"
    if unit in ("KiB", "MiB"):
        return f"{value:,.1f} {unit}"
    return f"{value:g} {unit}"


@dataclass
class Results:
    """Samples per daemon kind, and why a kind or workload produced none."""

    kinds: list[str]
    samples: dict[str, dict[tuple[str, str], Sample]]
    problems: dict[str, list[str]]

    def rows(self) -> list[tuple[str, str]]:
        seen: dict[tuple[str, str], None] = {}
        for kind in self.kinds:
            for key in self.samples.get(kind, {}):
                seen.setdefault(key, None)
        return list(seen)


def _ratio(jetd: Sample | None, other: Sample | None) -> str:
    if jetd is None or other is None or not jetd.values or not other.values or jetd.unit in ("ratio", "cores", "count"):
        return ""
    a, b = jetd.median, other.median
    if a <= 0 or b <= 0:
        return ""
    factor = a / b if higher_is_better(jetd) else b / a
    return f"{factor:.1f}x better" if factor >= 1 else f"{1 / factor:.1f}x worse"


def render_table(results: Results) -> str:
    """The markdown table: one row per metric, one column per daemon."""
    header = ["Workload", "Metric", *(KIND_LABELS[k] for k in results.kinds)]
    compare = "jetd" in results.kinds and "nodejet" in results.kinds
    if compare:
        header.append("jetd vs node-jet")
    header += ["Target (jetd)", "Met"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in results.rows():
        cells = list(key)
        per_kind = {kind: results.samples.get(kind, {}).get(key) for kind in results.kinds}
        for kind in results.kinds:
            sample = per_kind[kind]
            cells.append(format_value(sample.median, sample.unit) if sample and sample.values else "n/a")
        if compare:
            cells.append(_ratio(per_kind["jetd"], per_kind["nodejet"]))
        any_sample = next(s for s in per_kind.values() if s is not None)
        target = target_for(any_sample)
        jetd = per_kind.get("jetd")
        cells.append(target.text if target else "")
        if target and jetd is not None and jetd.values:
            cells.append("yes" if target.met(jetd.median) else "**no**")
        else:
            cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    for kind in results.kinds:
        for problem in results.problems.get(kind, []):
            lines.append(f"\n- {KIND_LABELS[kind]}: {problem}")
    return "\n".join(lines)


@contextlib.contextmanager
def _daemon_factory(kind: str, nodejet_prefix: Path,
                    jetd_source: Path) -> Iterator[Callable[[], contextlib.AbstractContextManager[DaemonProcess]]]:
    """A no-argument function starting a fresh daemon of ``kind`` (jetd-log writes to a temp dir)."""
    with tempfile.TemporaryDirectory(prefix="bench-jetd-log-") as log_dir:
        if kind == "jetd-log":
            yield lambda: start_daemon("jetd", jetd_args=["--log-dir", log_dir], jetd_source=jetd_source)
        elif kind == "jetd-auth":
            users = Path(log_dir) / "users.toml"
            users.write_text(BENCH_USERS, encoding="utf-8")
            yield lambda: start_daemon("jetd", jetd_args=["--auth", str(users)], jetd_source=jetd_source)
        elif kind == "jetd-always":
            yield lambda: start_daemon(
                "jetd", jetd_args=["--log-dir", log_dir, "--log-fsync", "always"], jetd_source=jetd_source
            )
        else:
            yield lambda: start_daemon(kind, nodejet_prefix=nodejet_prefix, jetd_source=jetd_source)


def run_benchmark(kinds: Sequence[str], workloads: Sequence[str], sizes: Sizes, *,
                  nodejet_prefix: Path = DEFAULT_NODEJET_PREFIX, jetd_source: Path = REPO,
                  progress: Callable[[str], None] = lambda line: None) -> Results:
    """Run ``workloads`` against every daemon kind in ``kinds``; failures become problems."""
    results = Results(list(kinds), {}, {})
    for kind in kinds:
        results.samples[kind] = {}
        problems = results.problems.setdefault(kind, [])
        if kind == "nodejet":
            try:
                ensure_nodejet(nodejet_prefix)
            except DaemonUnavailable as exc:
                problems.append(f"skipped: {exc}")
                progress(f"node-jet skipped: {exc}")
                continue
        dialect = dialect_for("jetd" if kind.startswith("jetd") else kind)
        with _daemon_factory(kind, nodejet_prefix, jetd_source) as start:
            for name in workloads:
                progress(f"{KIND_LABELS[kind]}: {name} ...")
                began = time.monotonic()
                try:
                    for sample in WORKLOADS[name](start, dialect, sizes):
                        results.samples[kind][(sample.workload, sample.metric)] = sample
                        progress(f"  {sample.metric}: {format_value(sample.median, sample.unit)} "
                                 f"(runs: {', '.join(f'{v:.4g}' for v in sample.values)})")
                except Exception as exc:  # one broken workload must not hide the others
                    problems.append(f"{name} failed: {type(exc).__name__}: {exc}")
                    progress(f"  {name} FAILED: {type(exc).__name__}: {exc}")
                progress(f"  ({time.monotonic() - began:.1f} s)")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; prints the markdown table on stdout, progress on stderr."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of W1..W5")
    parser.add_argument("--quick", action="store_true", help="short windows, smaller sizes, 3 repetitions")
    parser.add_argument("--against", default="both",
                        help="comma-separated: jetd, jetd-log (--log-dir), jetd-always (--log-dir --log-fsync always), "
                             "nodejet, both (jetd,nodejet; default), all (jetd,jetd-log,nodejet) or auth (jetd,jetd-auth)")
    parser.add_argument("--repeat", type=int, help="repetitions per measurement (median reported)")
    parser.add_argument("--window", type=float, help="seconds per measured window")
    parser.add_argument("--nodejet-prefix", type=Path, default=DEFAULT_NODEJET_PREFIX,
                        help="scratch directory for npm install of node-jet (default: %(default)s)")
    parser.add_argument("--jetd-source", type=Path, default=REPO,
                        help="directory with the jetd and jetwire packages to run (default: this checkout); "
                             "e.g. a `git archive` of one commit, so that a long run sees one jetd")
    parser.add_argument("--json", type=Path, help="also write every sample to this JSON file")
    parser.add_argument("--pin", metavar="DAEMON_CPU:GENERATOR_CPU",
                        help="pin jetd (taskset -c, all its threads) and this load generator to one CPU each, "
                             "e.g. 0:1 (NOTES.md: per-message CPU is far steadier pinned)")
    args = parser.parse_args(argv)
    if args.pin:
        try:
            daemon_cpu, generator_cpu = (int(part) for part in args.pin.split(":"))
        except ValueError:
            parser.error("--pin takes DAEMON_CPU:GENERATOR_CPU, e.g. 0:1")
        daemon_procs.JETD_CPU = daemon_cpu
        os.sched_setaffinity(0, {generator_cpu})
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads: {', '.join(unknown)}")
    kinds = [k for part in args.against.split(",") for k in AGAINST.get(part.strip(), [part.strip()])]
    if any(k not in KIND_LABELS for k in kinds):
        parser.error(f"--against takes {', '.join(AGAINST)}")
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.repeat:
        sizes = replace(sizes, repeat=args.repeat)
    if args.window:
        sizes = replace(sizes, window=args.window)
    load_before = os.getloadavg()
    results = run_benchmark(kinds, workloads, sizes, nodejet_prefix=args.nodejet_prefix, jetd_source=args.jetd_source,
                            progress=lambda line: print(line, file=sys.stderr, flush=True))
    load_after = os.getloadavg()
    print(f"Medians of {sizes.repeat} runs ({sizes.window:g} s windows); {os.cpu_count()} cores; "
          f"1-min load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"jetd from {args.jetd_source}.\n")
    print(render_table(results))
    if args.json:
        args.json.write_text(json.dumps({
            kind: [{"workload": s.workload, "metric": s.metric, "unit": s.unit, "values": s.values}
                   for s in results.samples[kind].values()]
            for kind in results.kinds
        }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
