"""``python -m tools.chaos``: run the attacks, print one row per attack."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from .attacks import ATTACKS
from .attacks import Row
from .attacks import Run
from .attacks import iter_attacks
from .harness import HOST
from .harness import NeedsOwnDaemon
from .harness import Target
from .together import ALL_AT_ONCE_PARTS

REPO = Path(__file__).resolve().parents[2]
COLUMNS = [  # (key, heading)
    ("attack", "attack"),
    ("rss_base_mb", "RSS before MB"),
    ("rss_peak_mb", "RSS peak MB"),
    ("rss_growth_mb", "growth MB"),
    ("health_max_ms", "health max ms"),
    ("health_p99_ms", "health p99 ms"),
    ("log_lost", "log lost"),
    ("seconds", "s"),
    ("outcome", "outcome"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.chaos",
        description="Run issue 12's hostile-peer attacks against jetd on 127.0.0.1 and print memory peaks "
        "(daemon VmRSS sampled every 20 ms), health-peer waits (GET + NOTIFY every 50 ms: max and p99) and "
        "event-log losses. By default each attack gets a fresh `python -m jetd` from --repo, with the flags "
        "it needs, stopped afterwards.",
        epilog="attacks:\n" + "\n".join(f"  {name:15} {text}" for name, (text, _) in ATTACKS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--attack", action="append", choices=list(ATTACKS), metavar="NAME",
                        help="run only this attack (repeatable; default: all, listed below)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="shrink counts and waits for a quick run (default 1: the issue's sizes)")
    parser.add_argument("--repo", type=Path, default=REPO, help=f"where to run `python -m jetd` from (default {REPO})")
    parser.add_argument("--jetd-args", default="", metavar="ARGS",
                        help="extra flags for every jetd chaos starts, one shell-quoted string")
    parser.add_argument("--connect", metavar="HOST:PORT",
                        help="attack this running daemon (127.0.0.1 only) instead; attacks that need flags, "
                        "signals or the event log are skipped")
    parser.add_argument("--pid", type=int, help="pid of the --connect daemon (for the memory columns)")
    parser.add_argument("--without", action="append", default=[], choices=list(ALL_AT_ONCE_PARTS), metavar="PART",
                        help="all-at-once: leave this part out (repeatable; " + ", ".join(ALL_AT_ONCE_PARTS) + ")")
    parser.add_argument("--json", action="store_true", help="one JSON object per attack instead of a table")
    return parser


def _target(args: argparse.Namespace) -> Target:
    extra = shlex.split(args.jetd_args)
    if args.connect is None:
        return Target(args.repo.resolve(), extra_args=extra)
    host, sep, port = args.connect.rpartition(":")
    if not sep or host != HOST or not port.isdigit():
        raise SystemExit(f"chaos: --connect {args.connect}: expected {HOST}:PORT")
    return Target(args.repo.resolve(), connect=(host, int(port)), pid=args.pid, extra_args=extra)


def run_attacks(args: argparse.Namespace) -> tuple[list[Row], bool]:
    """Every selected attack's row, and whether any of them failed."""
    run = Run(_target(args), args.scale, frozenset(args.without))
    rows: list[Row] = []
    failed = False
    try:
        for name, description, attack in iter_attacks(args.attack):
            started = time.monotonic()
            try:
                row = attack(run)
            except NeedsOwnDaemon as exc:
                row = {"outcome": f"skipped: {exc}"}
            except Exception as exc:
                failed = True
                traceback.print_exc(file=sys.stderr)
                row = {"outcome": f"error: {type(exc).__name__}: {exc}"}
            row = {"attack": name, "description": description, **row, "seconds": round(time.monotonic() - started, 1)}
            rows.append(row)
            if not args.json:
                print(f"{name}: {row['outcome']} ({row['seconds']} s)", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(run.target.workdir, ignore_errors=True)
    return rows, failed


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value)


def print_table(rows: Sequence[Row], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    title = (f"python -m tools.chaos --scale {args.scale:g}" + (f" --connect {args.connect}" if args.connect else "")
             + "".join(f" --without {part}" for part in args.without))
    table = Table(title=title)
    for key, heading in COLUMNS:
        table.add_column(heading, justify="left" if key in ("attack", "outcome", "log_lost") else "right",
                         overflow="fold")
    for row in rows:
        cells = {key: _cell(row.get(key)) for key, _ in COLUMNS}
        if row.get("health_timeouts"):  # the health peer gave up waiting: the stall was longer
            cells["health_max_ms"] = "> " + cells["health_max_ms"]
        table.add_row(*cells.values())
    console = Console(width=max(200, shutil.get_terminal_size().columns))
    console.print(table)
    for row in rows:
        if isinstance(row.get("targets"), dict):
            print_targets(row, console)


def print_targets(row: Row, console: object) -> None:
    """The probe's figures and issue 29's targets, PASS or FAIL (all-at-once)."""
    from rich.console import Console
    from rich.table import Table

    assert isinstance(console, Console)
    table = Table(title=f"{row['attack']}: other peers' waits (ms) and the targets")
    for heading in ("", "p50", "p99", "max"):
        table.add_column(heading, justify="right" if heading else "left")
    for kind in ("get", "set"):
        table.add_row("GET" if kind == "get" else "routed SET",
                      *(_cell(row.get(f"{kind}_{q}_ms")) for q in ("p50", "p99", "max")))
    console.print(table)
    console.print(f"RSS {_cell(row.get('rss_base_mb'))} MB before the attacks, peak {_cell(row.get('rss_peak_mb'))} "
                  f"MB, growth {_cell(row.get('rss_growth_mb'))} MB (budget {_cell(row.get('rss_budget_mb'))} MB); "
                  f"load average {os.getloadavg()[0]:.2f}")
    targets = row["targets"]
    assert isinstance(targets, dict)
    for name, verdict in targets.items():
        console.print(f"  {name}: {verdict}")
    # The same figures as one markdown row, for BENCHMARKS.md.
    waits = [" / ".join(_cell(row.get(f"{kind}_{q}_ms")) for q in ("p50", "p99", "max")) for kind in ("get", "set")]
    print("\n| GET p50 / p99 / max ms | routed SET p50 / p99 / max ms | RSS before → peak (growth) MB | "
          "fetches answered | load |\n|---|---|---|---|---:|")
    print(f"| {waits[0]} | {waits[1]} | {_cell(row.get('rss_base_mb'))} → {_cell(row.get('rss_peak_mb'))} "
          f"({_cell(row.get('rss_growth_mb'))}) | {row.get('fetches_answered')} | {os.getloadavg()[0]:.2f} |")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the attacks; 0 when every attack ran (whatever it measured), 1 if one failed."""
    args = build_parser().parse_args(argv)
    rows, failed = run_attacks(args)
    if args.json:
        for row in rows:
            print(json.dumps(row))
    else:
        print_table(rows, args)
    return 1 if failed else 0
