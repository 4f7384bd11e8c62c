"""``jetdump top``: a live, refreshing view of the bus (rich): the busiest keys and peers,
rates, error statuses and p50/p99 latency.

Sources: the tap (``--listen PORT --upstream HOST:PORT``), a live capture (``-i IFACE``),
an event-log directory followed as the daemon writes it (``LOGDIR --follow``), or any
finished input (captures, logs), shown once at the end. Rates are per second over the
last refresh interval; latencies are over the last ``WINDOW`` answers of each key (and
of the whole bus), as the requester sees them (a routed request's legs are not counted
twice; see :mod:`.stats`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import threading
import time
from collections import Counter
from collections import deque
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from typing import Any
from typing import Optional

from .dissector import OK
from .dissector import Dissector
from .dissector import FrameRecord
from .dissector import NoteRecord
from .dissector import Record
from .events import Event
from .events import InputError
from .stats import bounded_entry
from .stats import is_leg
from .stats import percentile
from .stats import status_name
from .tap import DEFAULT_LISTEN_HOST
from .tap import serve_tap

WINDOW = 1000  # answers per key (and overall) the latency percentiles are taken over
TOP = 10  # rows per table


class _Row:
    __slots__ = ("errors", "frames", "latency", "requests", "shown_frames", "shown_requests")

    def __init__(self) -> None:
        self.frames = 0
        self.requests = 0
        self.errors = 0
        self.latency: deque[float] = deque(maxlen=WINDOW)
        self.shown_frames = 0  # counts at the previous refresh, for rates
        self.shown_requests = 0


class TopView:
    """Counts records and renders the view; ``lock`` guards both (records are added by
    the reading thread, the view is drawn by rich's refresh thread)."""

    def __init__(self, labels: dict[int, tuple[str, str]], source: str) -> None:
        self.labels = labels
        self.source = source
        self.lock = threading.Lock()
        self.total = _Row()
        self.keys: dict[str, _Row] = {}
        self.peers: dict[int, _Row] = {}
        self.statuses: Counter[str] = Counter()
        self.problems = 0
        self.violations = 0
        self.started = time.monotonic()
        self.last_refresh = self.started
        self.first_ts: Optional[float] = None  # input time of the first and last frames
        self.last_ts: Optional[float] = None
        self.whole = False  # a finished input: rates over its whole time span

    def _key(self, key: str) -> _Row:
        return bounded_entry(self.keys, key, _Row, "(other keys)")

    def add(self, records: list[Record]) -> None:
        with self.lock:
            for record in records:
                if type(record) is NoteRecord:
                    if record.kind == "violation":
                        self.violations += 1
                    continue
                fr: FrameRecord = record  # type: ignore[assignment]
                self.total.frames += 1
                if fr.ts is not None:
                    if self.first_ts is None:
                        self.first_ts = fr.ts
                    self.last_ts = fr.ts
                peer = self.peers.get(fr.stream)
                if peer is None:
                    peer = self.peers[fr.stream] = _Row()
                peer.frames += 1
                if fr.kind != OK:
                    self.problems += 1
                    continue
                if is_leg(fr):
                    continue
                message = fr.message
                key = getattr(message, "key", None)
                if fr.direction == 0 and getattr(message, "id", None) is not None and hasattr(message, "function"):
                    self.total.requests += 1
                    peer.requests += 1
                    if key is not None:
                        row = self._key(key)
                        row.requests += 1
                        row.frames += 1
                elif key is not None:
                    self._key(key).frames += 1
                if fr.request is not None:
                    status = status_name(fr)
                    answered = self._key(fr.request.key) if fr.request.key is not None else None
                    if status is not None and status != "OK":
                        self.statuses[status] += 1
                        self.total.errors += 1
                        peer.errors += 1
                        if answered is not None:
                            answered.errors += 1
                    if fr.rtt is not None:
                        self.total.latency.append(fr.rtt)
                        if answered is not None:
                            answered.latency.append(fr.rtt)

    def render(self) -> Any:
        """The view as a rich renderable (a group of tables)."""
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        with self.lock:
            now = time.monotonic()
            interval = max(now - self.last_refresh, 1e-6)
            self.last_refresh = now
            if self.whole:  # everything counts, over the input's own time span
                span = (self.last_ts - self.first_ts) if self.last_ts is not None and self.first_ts is not None else 0
                interval = max(span, 1e-6)
                for row in (self.total, *self.keys.values(), *self.peers.values()):
                    row.shown_frames = row.shown_requests = 0
            total = self.total
            fps = (total.frames - total.shown_frames) / interval
            rps = (total.requests - total.shown_requests) / interval
            total.shown_frames, total.shown_requests = total.frames, total.requests
            p50, p99 = _percentiles(total.latency)
            head = Text.assemble(
                ("jetdump top", "bold"), f"  {self.source}  {interval if self.whole else now - self.started:.3g} s  ",
                f"frames {total.frames:,} ({fps:,.0f}/s)  requests {total.requests:,} ({rps:,.0f}/s)  ",
                (f"errors {total.errors:,}", "red" if total.errors else ""),
                f"  p50 {p50}  p99 {p99} ms",
                (f"  malformed/truncated {self.problems}", "bold red") if self.problems else "",
                (f"  violations {self.violations}", "bold red") if self.violations else "",
            )
            keys = Table(title="busiest keys", title_justify="left", expand=False)
            for name, justify in (("key", "left"), ("requests", "right"), ("req/s", "right"),
                                  ("errors", "right"), ("p50 ms", "right"), ("p99 ms", "right")):
                keys.add_column(name, justify=justify)  # type: ignore[arg-type]
            busiest = sorted(self.keys.items(), key=lambda item: -(item[1].frames - item[1].shown_frames
                                                                   + item[1].frames / 1e9))[:TOP]
            for key, row in busiest:
                rate = (row.requests - row.shown_requests) / interval
                k50, k99 = _percentiles(row.latency)
                keys.add_row(key, f"{row.requests:,}", f"{rate:,.0f}", str(row.errors) if row.errors else "",
                             k50, k99)
            for row in self.keys.values():
                row.shown_frames, row.shown_requests = row.frames, row.requests
            peers = Table(title="busiest peers", title_justify="left", expand=False)
            for name in ("peer", "frames", "frames/s", "requests", "errors"):
                peers.add_column(name, justify="left" if name == "peer" else "right")
            ranked = sorted(self.peers.items(), key=lambda item: -(item[1].frames - item[1].shown_frames
                                                                   + item[1].frames / 1e9))[:TOP]
            for stream, row in ranked:
                label = self.labels.get(stream, (f"stream {stream}", ""))[0]
                peers.add_row(label, f"{row.frames:,}", f"{(row.frames - row.shown_frames) / interval:,.0f}",
                              f"{row.requests:,}", str(row.errors) if row.errors else "")
            for row in self.peers.values():
                row.shown_frames, row.shown_requests = row.frames, row.requests
            errors = Table(title="error statuses", title_justify="left", expand=False)
            errors.add_column("status")
            errors.add_column("count", justify="right")
            for status, count in self.statuses.most_common(TOP):
                errors.add_row(status, f"{count:,}")
            return Group(head, keys, peers, errors)


def _percentiles(values: deque[float]) -> tuple[str, str]:
    if not values:
        return "-", "-"
    ordered = sorted(values)
    return f"{percentile(ordered, 50) * 1000:.3f}", f"{percentile(ordered, 99) * 1000:.3f}"


def build_top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jetdump top",
        description="A live view of the bus: busiest keys and peers, rates, error statuses, p50/p99 latency. "
        "From the tap (--listen/--upstream), a live capture (-i), an event-log directory as it grows "
        "(LOGDIR --follow), or a finished capture or log (shown once).",
    )
    parser.add_argument("inputs", nargs="*", metavar="INPUT", help="capture(s) or event log(s)/directory")
    parser.add_argument("--follow", action="store_true",
                        help="keep reading the newest segment of a log directory as the daemon writes it")
    parser.add_argument("-i", "--interface", metavar="IFACE", help="capture live on IFACE (dumpcap or tcpdump)")
    parser.add_argument("-f", "--capture-filter", metavar="FILTER", default="tcp", help="capture filter for -i")
    parser.add_argument("--listen", type=int, metavar="PORT", help="run the tap: port to accept peers on (0: any)")
    parser.add_argument("--listen-host", default=DEFAULT_LISTEN_HOST, help="address the tap listens on")
    parser.add_argument("--upstream", metavar="HOST:PORT", help="the daemon the tap forwards to")
    parser.add_argument("--port", type=int, default=11124, help="TCP port of jet streams in captures")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)")
    return parser


def _follow_directory(directory: Path, stop: Callable[[], bool]) -> Iterator[Event]:
    """Events of a log directory's segments in order, the newest one followed as it grows
    (and the next ones as the daemon starts them) until ``stop()``."""
    from .logs import LogSource

    logs = LogSource()
    done: set[Path] = set()
    while not stop():
        segments = sorted(p for p in directory.glob("*.jetlog") if p not in done)
        if not segments:
            time.sleep(0.2)
            continue
        current = segments[0]

        def wait(current: Path = current) -> bool:
            if stop():
                return False
            if any(p != current and p not in done for p in directory.glob("*.jetlog")):
                return False  # the daemon moved on to a newer segment
            time.sleep(0.2)
            return not stop()

        yield from logs.read(current, wait if len(segments) == 1 else None)
        done.add(current)


def run_top(argv: list[str], stdout: IO[str], stderr: IO[str]) -> int:
    from rich.console import Console
    from rich.live import Live

    from .cli import EXIT_UNREADABLE
    from .cli import EXIT_USAGE
    from .cli import _input_events
    from .cli import build_parser

    args = build_top_parser().parse_args(argv)
    deadline = time.monotonic() + args.duration if args.duration is not None else None
    stopped = threading.Event()

    def stop() -> bool:
        if deadline is not None and time.monotonic() >= deadline:
            stopped.set()
        return stopped.is_set()

    dissector = Dissector()
    modes = sum(bool(x) for x in (args.interface, args.listen is not None, args.inputs))
    if modes != 1:
        stderr.write("jetdump top: give one source: INPUT..., -i IFACE, or --listen PORT --upstream HOST:PORT\n")
        return EXIT_USAGE
    if args.interface:
        source = f"-i {args.interface}"
    elif args.listen is not None:
        source = f"tap :{args.listen} -> {args.upstream}"
    else:
        source = " ".join(args.inputs)
    view = TopView(dissector.labels, source)
    console = Console(file=stdout, force_terminal=stdout.isatty())
    live_input = bool(args.interface or args.listen is not None or args.follow)

    def feed(event: Event) -> None:
        dissector.event(event)
        if dissector.out:
            records, dissector.out = dissector.out, []
            view.add(records)

    errors: list[str] = []
    if not live_input:  # a finished input: read it all, show the view once
        from .cli import build_parser as dump_parser
        from .logs import LogSource

        try:
            for event in _input_events(dump_parser().parse_args([*args.inputs, "--port", str(args.port)]),
                                       errors, LogSource()):
                feed(event)
        except InputError as exc:
            errors.append(str(exc))
        dissector.finish()
        view.add(dissector.out)
        view.whole = True
        console.print(view.render())
        for message in errors:
            stderr.write(f"jetdump: {message}\n")
        return EXIT_UNREADABLE if errors else 0
    try:
        with Live(get_renderable=view.render, console=console, refresh_per_second=1 / args.interval,
                  auto_refresh=live_input, transient=False) as live:
            if args.listen is not None:
                if not args.upstream or ":" not in args.upstream:
                    stderr.write("jetdump top: --listen needs --upstream HOST:PORT\n")
                    return EXIT_USAGE
                host, _, port = args.upstream.rpartition(":")
                _run_tap(args, host.strip("[]"), int(port), feed, deadline, stderr)
            elif args.follow:
                if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
                    stderr.write("jetdump top: --follow takes one log directory\n")
                    return EXIT_USAGE
                for event in _follow_directory(Path(args.inputs[0]), stop):
                    feed(event)
            else:
                dump_args = build_parser().parse_args(
                    [*args.inputs, "--port", str(args.port)]
                    + (["-i", args.interface, "-f", args.capture_filter] if args.interface else []))
                from .logs import LogSource

                if args.interface and deadline is not None:
                    # LiveCapture stops dumpcap on SIGTERM and the input then ends.
                    threading.Timer(args.duration, os.kill, (os.getpid(), signal.SIGTERM)).start()
                for event in _input_events(dump_args, errors, LogSource()):
                    feed(event)
                    if stop():
                        break
            dissector.finish()
            view.add(dissector.out)
            dissector.out = []
            live.refresh()
    except InputError as exc:
        errors.append(str(exc))
    except KeyboardInterrupt:
        pass
    for message in errors:
        stderr.write(f"jetdump: {message}\n")
    return EXIT_UNREADABLE if errors else 0


def _run_tap(args: argparse.Namespace, host: str, port: int, feed: Callable[[Event], None],
             deadline: Optional[float], stderr: IO[str]) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if deadline is not None:
            loop.call_later(max(0.0, deadline - time.monotonic()), stop.set)

        def ready(listen_host: str, listen_port: int) -> None:
            stderr.write(f"jetdump top: tap listening on {listen_host}:{listen_port}, upstream {host}:{port}\n")
            stderr.flush()

        await serve_tap(args.listen_host, args.listen, host, port, feed, on_ready=ready, stop=stop)

    asyncio.run(main())
