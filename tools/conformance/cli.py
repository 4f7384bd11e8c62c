"""``jet-conformance HOST:PORT [options]``: run the conformance cases against a daemon."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any
from typing import Optional

from .cases import CaseError
from .cases import default_case_dir
from .cases import evaluate
from .cases import load_cases
from .cases import select_cases
from .report import add_report_options
from .report import write_case_list
from .report import write_console
from .report import write_report_files
from .runner import RunConfig
from .runner import run_cases

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # bad arguments or case files, daemon unreachable


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _variable(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=NUMBER, got {text!r}")
    try:
        return name, evaluate(value, {})
    except CaseError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(
        prog="jet-conformance",
        description="Run the jet protocol conformance cases (spec/conformance) against a daemon.",
        epilog="To test a peer library instead: jet-conformance peer --agent CMD (spec/conformance/PEER.md; "
               "jet-conformance peer --help).",
    )
    parser.add_argument("address", nargs="?", type=_address, help="the daemon, HOST:PORT")
    parser.add_argument("--web", type=_address, metavar="HOST:PORT",
                        help="the daemon's HTTP listener (PROTOCOL.md 13): runs the web cases, skipped without it")
    parser.add_argument("--cases", metavar="GLOB", help="only cases whose id, group or file matches GLOB")
    parser.add_argument("--section", metavar="N.N", help="only cases of this PROTOCOL.md section (and subsections)")
    parser.add_argument("--strict", action="store_true", help="count NON-STRICT (unmet SHOULD) as failed")
    parser.add_argument("--timeout", type=_positive, default=5.0, metavar="S",
                        help="how long a step waits for an expected frame (default 5)")
    parser.add_argument("--route-timeout", type=_positive, default=5.0, metavar="S",
                        help="the daemon's configured route timeout, PROTOCOL.md 10.3 (default 5)")
    parser.add_argument("--var", type=_variable, action="append", default=[], metavar="NAME=N",
                        help="set a case variable, e.g. max_key_length=256 for a daemon with other limits")
    parser.add_argument("--jobs", type=int, default=16, metavar="N", help="cases run at once (default 16)")
    parser.add_argument("--case-dir", type=Path, default=None, help="directory of case files (default spec/conformance)")
    add_report_options(parser)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point; returns the exit status (0 all passed, 1 failures, 2 usage errors)."""
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["peer"]:
        from . import peer  # the peer suite (issue 17): jet-conformance peer --agent CMD

        return guard_broken_pipe(peer.main, argv[1:])
    return guard_broken_pipe(_main, argv)


def guard_broken_pipe(entry: Any, argv: Optional[list[str]]) -> int:
    """Run ``entry(argv, status)``; when stdout is a pipe whose reader closed (``| head``),
    stop writing quietly instead of dying with a BrokenPipeError traceback (issue 17).
    ``entry`` stores the run's exit status in ``status["code"]`` before it prints the
    console report (the --json/--junit/--html files are written before it too), so the
    exit status is the run's either way."""
    status: dict[str, int] = {}
    try:
        return int(entry(argv, status))
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull so the interpreter's own
        # flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return status.get("code", EXIT_OK)


def _main(argv: Optional[list[str]], status: dict[str, int]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    case_dir = args.case_dir or default_case_dir()
    try:
        cases = load_cases(case_dir.glob("*.json"))
    except CaseError as exc:
        print(f"jet-conformance: invalid case file: {exc}", file=sys.stderr)
        return EXIT_USAGE
    selected = select_cases(cases, args.cases, args.section)
    if args.list:
        write_case_list(selected, sys.stdout)
        return EXIT_OK
    if args.address is None:
        parser.error("HOST:PORT is required unless --list is given")
    if not selected:
        print("jet-conformance: no case matches the selection", file=sys.stderr)
        return EXIT_USAGE
    host, port = args.address
    config = RunConfig(
        host=host,
        port=port,
        timeout=args.timeout,
        route_timeout=args.route_timeout,
        strict=args.strict,
        jobs=max(1, args.jobs),
        variables=dict(args.var),
        web=args.web,
    )
    try:
        results = asyncio.run(run_cases(selected, config))
    except ConnectionError as exc:
        print(f"jet-conformance: {exc}", file=sys.stderr)
        return EXIT_USAGE
    write_report_files(results, config, json_path=args.json, junit_path=args.junit, html_path=args.html)
    failed = any(result.counts_as_failure(config.strict) for result in results)
    status["code"] = EXIT_FAILED if failed else EXIT_OK
    write_console(results, config, sys.stdout, verbose=args.verbose)
    sys.stdout.flush()
    return status["code"]
