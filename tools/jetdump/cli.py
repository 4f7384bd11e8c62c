"""The ``jetdump`` command line (see the package docstring for the JSON field names)."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import sys
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import IO
from typing import Any
from typing import Optional

from jetwire import EventCode
from jetwire import FrameType
from jetwire import Function
from jetwire import Status

from . import __doc__ as PACKAGE_DOC
from .capture import DEFAULT_JET_PORT
from .capture import is_capture
from .capture import read_capture
from .dissector import DEFAULT_MAX_BODY
from .dissector import OK
from .dissector import REQUEST_TYPES
from .dissector import Dissector
from .dissector import FrameRecord
from .dissector import NoteRecord
from .dissector import Record
from .events import Data
from .events import End
from .events import Event
from .events import Gap
from .events import InputError
from .events import Note
from .events import Open
from .events import WholeFrame
from .live import DEFAULT_CAPTURE_FILTER
from .live import LiveCapture
from .logs import LogSource
from .logs import cut_header_message
from .logs import expand_log_paths
from .logs import is_cut_log
from .logs import is_log
from .packets import peek_head
from .render import LineFormatter
from .render import field_tree
from .render import hex_dump
from .render import json_record
from .stats import Stats
from .stats import function_name
from .stats import status_name
from .stats import type_name
from .tap import DEFAULT_LISTEN_HOST
from .tap import DEFAULT_OUTPUT_BUFFER
from .tap import DroppingWriter
from .tap import serve_tap

EXIT_UNREADABLE = 1
EXIT_USAGE = 2
EXIT_DAMAGED = 3
RAW_CHUNK = 1 << 20
OUTPUT_BATCH = 4096  # lines written per write() call
GC_THRESHOLD = 100_000  # young-generation allocations between cycle-collector passes

FUNCTION_CHOICES = sorted({f.name for f in Function} | {c.name for c in EventCode})
TYPE_CHOICES = sorted({t.name for t in FrameType} | {"MALFORMED", "TRUNCATED"})
STATUS_CHOICES = [s.name for s in Status]


EXIT_STATUS_HELP = """\
exit status:
  0  every input was decoded (a truncated last log record or capture is reported, not an error)
  1  an input could not be read at all (missing, not a capture or log, unknown log version, bad hex);
     the other inputs are still shown
  2  usage error
  3  every input was read, but event-log input was damaged: a segment with a damaged header
     (cut short, CRC mismatch) was skipped, or damaged records were; each is reported"""


def _json_epilog() -> str:
    doc = PACKAGE_DOC or ""
    start = doc.find("JSON output")
    return doc[start:] if start >= 0 else ""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jetdump",
        description="Decode jet traffic from captures (files, pipes, live with -i), event logs, raw bytes "
        "or hex; live between peers and a daemon with `jetdump tap --listen PORT --upstream HOST:PORT`; "
        "a refreshing view of the busiest keys and peers with `jetdump top` (see `jetdump top --help`).",
        epilog=EXIT_STATUS_HELP + "\n\n" + _json_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="pcap/pcapng capture, event-log segment, directory of segments, or glob; "
                        "'-' (or none, when stdin is not a terminal) reads a capture from stdin, "
                        "e.g. `tcpdump -w - | jetdump -` (with --hex: hex strings)")
    parser.add_argument("-i", "--interface", metavar="IFACE",
                        help="capture live on IFACE through dumpcap or tcpdump (Ctrl-C stops and prints the rest)")
    parser.add_argument("-f", "--capture-filter", metavar="FILTER", default=DEFAULT_CAPTURE_FILTER,
                        help=f"capture filter for -i (default {DEFAULT_CAPTURE_FILTER!r})")
    parser.add_argument("-c", "--capture-count", metavar="N", type=int,
                        help="with -i: stop after N packets")
    parser.add_argument("--raw", metavar="FILE", help="a raw byte stream of one direction ('-' for stdin)")
    parser.add_argument("--hex", action="store_true",
                        help="INPUTs (or stdin) are hex of one direction; whitespace, ':' and '0x' are ignored")
    _output_options(parser)
    parser.add_argument("--port", type=int, default=DEFAULT_JET_PORT,
                        help=f"TCP port of jet streams in captures (default {DEFAULT_JET_PORT})")
    parser.add_argument("--write-pcapng", metavar="FILE",
                        help="write the event log(s) as a pcapng capture (one synthesised TCP stream per "
                        "connection, the daemon's timestamps) for Wireshark/tshark, instead of printing")
    parser.add_argument("--no-heuristic", action="store_true",
                        help="take only streams on --port as jet (by default a stream is also jet when either "
                        "direction starts with an INFO or a whole frame that decodes)")
    return parser


def _output_options(parser: argparse.ArgumentParser) -> None:
    out = parser.add_argument_group("output")
    out.add_argument("-V", "--verbose", action="store_true", help="full field tree with byte offsets and lengths")
    out.add_argument("-x", "--hexdump", action="store_true", help="hex dump of each frame")
    out.add_argument("--json", action="store_true", help="one JSON object per frame (and per note)")
    out.add_argument("--stats", action="store_true",
                     help="print statistics instead of frames (as one JSON object with --json)")
    out.add_argument("--trace", action="store_true",
                     help="in a capture, link each routed SET_STATE/CALL_METHOD to the daemon's request to the owner "
                     "and its answer (by function and key, oldest first: a capture holds no link); an event log "
                     "links them always")
    out.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                     help="colour the summary lines (auto: only on a terminal)")
    out.add_argument("--max-body", type=int, default=DEFAULT_MAX_BODY,
                     help=f"largest body accepted before a frame is reported TOO_LARGE (default {DEFAULT_MAX_BODY})")
    filters = parser.add_argument_group(
        "filters", "Malformed/truncated frames, protocol violations and damage notes (gap, resync, stopped, "
        "capture and log damage) "
        "always pass --key, --function, --type and --status, so that damage is never hidden; other notes pass "
        "them only when they are about a selected frame (a routing note goes with its request).")
    filters.add_argument("--key", metavar="PREFIX", help="frames whose key (or answered request's key) starts with PREFIX")
    filters.add_argument("--function", metavar="NAME", type=_upper, help="function or event code: " + ", ".join(FUNCTION_CHOICES))
    filters.add_argument("--type", metavar="NAME", type=_upper, help="frame type: " + ", ".join(TYPE_CHOICES))
    filters.add_argument("--status", metavar="NAME", type=_upper, help="response or CLOSE status")
    filters.add_argument("--stream", metavar="N[,N...]", type=_streams, action="extend",
                         help="only these streams (connections); repeat or separate with commas")
    filters.add_argument("--no-notes", action="store_true", help="frames only, no notes")


def _streams(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected stream numbers separated by commas") from None


def _upper(text: str) -> str:
    return text.upper().replace("-", "_")


def build_tap_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jetdump tap",
        description="A TCP proxy between jet peers and a daemon that prints every frame both ways as it passes.",
    )
    parser.add_argument("--listen", required=True, type=int, metavar="PORT", help="port to accept peers on (0: any)")
    parser.add_argument("--listen-host", default=DEFAULT_LISTEN_HOST, help=f"address to listen on (default {DEFAULT_LISTEN_HOST})")
    parser.add_argument("--upstream", required=True, metavar="HOST:PORT", help="the daemon to forward to")
    parser.add_argument("--output-buffer", type=int, default=DEFAULT_OUTPUT_BUFFER, metavar="BYTES",
                        help="output held for a slow terminal before lines are dropped (counted, never "
                        f"slowing the traffic; default {DEFAULT_OUTPUT_BUFFER})")
    _output_options(parser)
    return parser


def _check_names(args: argparse.Namespace) -> None:
    for option, value, choices in (("--function", args.function, FUNCTION_CHOICES),
                                   ("--type", args.type, TYPE_CHOICES),
                                   ("--status", args.status, STATUS_CHOICES)):
        if value is not None and value not in choices:
            raise InputError(f"{option} {value}: not one of {', '.join(choices)}")


DAMAGE_NOTES = frozenset({"gap", "resync", "stopped", "capture-truncated", "log-damage", "log-truncated",
                          "violation"})
MAX_SELECTED_REQUESTS = 100_000  # selected requests remembered for the notes about them


def make_filter(args: argparse.Namespace) -> Optional[Callable[[Record], bool]]:
    """The record filter for the options given, or None when nothing is filtered."""
    ftype, function, status, key = args.type, args.function, args.status, args.key
    streams = set(args.stream) if args.stream else None
    no_notes = getattr(args, "no_notes", False)
    frame_filter = any(v is not None for v in (ftype, function, status, key))
    if streams is None and not frame_filter and not no_notes:
        return None
    selected: dict[tuple[int, int], None] = {}  # requests shown: their notes are shown too

    def keep_frame(fr: FrameRecord) -> bool:
        if ftype is not None and ftype != type_name(fr) and ftype != fr.kind.upper():
            return False
        if fr.kind != OK:
            return True
        if function is not None and function_name(fr) != function:
            return False
        if status is not None and status_name(fr) != status:
            return False
        if key is not None:
            frame_key = getattr(fr.message, "key", None)
            if frame_key is None and fr.request is not None:
                frame_key = fr.request.key
            if frame_key is None or not frame_key.startswith(key):
                return False
        return True

    def keep(record: Record) -> bool:
        if streams is not None and record.stream is not None and record.stream not in streams:
            return False
        if type(record) is NoteRecord:
            if no_notes:
                return False
            if not frame_filter or record.kind in DAMAGE_NOTES:
                return True
            return record.about is not None and record.about in selected
        fr: FrameRecord = record  # type: ignore[assignment]
        if not keep_frame(fr):
            return False
        if frame_filter and type(fr.message) in REQUEST_TYPES:
            request_id = getattr(fr.message, "id", None)
            if request_id is not None:
                if len(selected) >= MAX_SELECTED_REQUESTS:
                    del selected[next(iter(selected))]
                selected[(fr.stream, request_id)] = None
        return True

    return keep


class Output:
    """Writes rendered records: plain lines in large batches, or colour through rich."""

    STYLES = {"REQUEST": "cyan", "RESPONSE": "green", "EVENT": "yellow", "INFO": "blue"}

    def __init__(self, stream: IO[str], color: bool) -> None:
        self.stream = stream
        self.lines: list[str] = []
        self.console: Any = None
        if color:
            from rich.console import Console

            self.console = Console(file=stream, force_terminal=True, highlight=False, soft_wrap=True)

    def add(self, line: str, record: Optional[Record] = None) -> None:
        if self.console is not None:
            from rich.text import Text

            self.console.print(Text(line, style=self._style(line, record)))
            return
        self.lines.append(line)
        if len(self.lines) >= OUTPUT_BATCH:
            self.flush()

    def _style(self, line: str, record: Optional[Record]) -> str:
        if record is None or type(record) is NoteRecord:
            return "dim" if record is not None else ""
        fr: FrameRecord = record  # type: ignore[assignment]
        if fr.kind != OK:
            return "bold red"
        if status_name(fr) not in (None, "OK"):
            return "red"
        return self.STYLES.get(type_name(fr), "")

    def flush(self) -> None:
        if self.lines:
            self.lines.append("")  # one write ending in a newline (counted whole by a DroppingWriter)
            self.stream.write("\n".join(self.lines))
            self.lines.clear()
        self.stream.flush()


class Renderer:
    """Renders the records a :class:`Dissector` produces, in the mode asked for."""

    def __init__(self, args: argparse.Namespace, dissector: Dissector, output: Output) -> None:
        self.args = args
        self.dissector = dissector
        self.output = output
        self.keep = make_filter(args)
        self.stats = Stats() if args.stats else None
        self.fmt = LineFormatter(dissector.labels, lambda: dissector.first_ts)

    def drain(self) -> None:
        records = self.dissector.out
        if not records:
            return
        self.dissector.out = []
        keep = self.keep
        if keep is not None:
            records = [r for r in records if keep(r)]
        if self.stats is not None:
            for record in records:
                self.stats.add(record)
            return
        args = self.args
        add = self.output.add
        if args.json:
            for record in records:
                add(json.dumps(json_record(record, self.fmt), ensure_ascii=False), record)
            return
        line = self.fmt.line
        if not (args.verbose or args.hexdump):
            if self.output.console is None:
                self.output.lines.extend(self.fmt.lines(records))
                if len(self.output.lines) >= OUTPUT_BATCH:
                    self.output.flush()
            else:
                for record in records:
                    add(line(record), record)
            return
        for record in records:
            add(line(record), record)
            if type(record) is FrameRecord:
                if args.verbose:
                    for text in field_tree(record):
                        add(text)
                if args.hexdump:
                    for text in hex_dump(record.raw or b""):
                        add(text)

    def finish(self) -> None:
        self.dissector.finish()
        self.drain()
        if self.stats is not None:
            streams = set(self.args.stream) if self.args.stream else None
            for stream, direction, _rid, seen in self.dissector.unanswered():
                if (streams is None or stream in streams) and not self.dissector.explained_by_gap(
                        stream, direction, seen.number):
                    self.stats.add_unanswered(stream, direction, seen.number, seen.function, seen.key, seen.ts)
            labels = self.dissector.labels
            if self.args.json:
                self.output.stream.write(json.dumps(self.stats.report(labels)) + "\n")
            else:
                self.output.stream.write(self.stats.text(labels))
        self.output.flush()


def _parse_hex(text: str) -> bytes:
    cleaned = re.sub(r"0x|[\s:,]", "", text, flags=re.IGNORECASE)
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise InputError("--hex: input is not hexadecimal (pairs of 0-9, a-f)") from None


def _single(stream: int, data_chunks: Iterator[bytes], label: str) -> Iterator[Event]:
    yield Open(stream, (label, "?"), False)  # one direction: answers are out of view
    for chunk in data_chunks:
        yield Data(stream, 0, None, chunk)
    yield End(stream, 0, None)


def _read_chunks(handle: IO[bytes]) -> Iterator[bytes]:
    while chunk := handle.read(RAW_CHUNK):
        yield chunk


def _stdin_capture(args: argparse.Namespace, stream: IO[bytes], label: str,
                   on_wait: Callable[[], None], *, implicit: bool = False) -> Iterator[Event]:
    """A capture read forward only from a pipe (or a redirected file)."""
    head = peek_head(stream)  # type: ignore[arg-type]
    if not head:
        if implicit:
            raise InputError("no input: give a capture, an event log, '-' for a capture on stdin, "
                             "-i IFACE, --raw FILE or --hex (see --help); stdin is empty")
        raise InputError(f"{label}: no data (expected a pcap/pcapng capture)")
    if not is_capture(head):
        raise InputError(f"{label}: not a pcap/pcapng capture (event logs and raw bytes are read from "
                         "files, or with --raw -)")
    yield from read_capture(stream, head, jet_port=args.port,  # type: ignore[arg-type]
                            heuristic=not args.no_heuristic, on_wait=on_wait)


def _input_events(args: argparse.Namespace, errors: list[str], logs: LogSource,
                  on_wait: Callable[[], None] = lambda: None) -> Iterator[Event]:
    """Every input's events in order; unreadable inputs are reported and skipped, and
    so are segments with a damaged header (recorded in ``logs``)."""
    if args.raw is not None:
        if args.raw == "-":
            yield from _single(0, _read_chunks(sys.stdin.buffer), "stdin")
        else:
            try:
                handle = open(args.raw, "rb")  # noqa: SIM115 - closed by the with below
            except OSError as exc:
                raise InputError(f"{args.raw}: {exc.strerror}") from None
            with handle:
                yield from _single(0, _read_chunks(handle), Path(args.raw).name)
        return
    if args.hex:
        text = " ".join(args.inputs) if args.inputs else sys.stdin.read()
        yield from _single(0, iter([_parse_hex(text)]), "hex")
        return
    if args.interface is not None:
        if args.inputs:
            raise InputError("-i: give either an interface or inputs, not both")
        live = LiveCapture(args.interface, args.capture_filter, args.capture_count, sys.stderr)
        live.install_signals()
        try:
            yield from _stdin_capture(args, live.stdout, f"-i {args.interface}", on_wait)
        finally:
            failure = live.close()
            if failure is not None:
                errors.append(failure)
        return
    inputs = list(args.inputs)
    if not inputs:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no input: give a capture, an event log, '-' for a capture on stdin, "
                             "-i IFACE, --raw FILE or --hex (see --help)")
        yield from _stdin_capture(args, sys.stdin.buffer, "stdin", on_wait, implicit=True)
        return
    if "-" in inputs:
        if inputs != ["-"]:
            raise InputError("'-' (stdin) cannot be mixed with other inputs")
        yield from _stdin_capture(args, sys.stdin.buffer, "stdin", on_wait)
        return
    stream_offset = 0
    for spec in inputs:
        try:
            paths = expand_log_paths(spec)
        except InputError as exc:
            errors.append(str(exc))
            continue
        for path in paths:
            try:
                with open(path, "rb") as handle:
                    head = handle.read(8)
                    if is_capture(head):
                        # A later capture's streams are numbered after an earlier one's.
                        seen: list[int] = []
                        yield from read_capture(handle, head, jet_port=args.port, heuristic=not args.no_heuristic,
                                                on_wait=on_wait, stream_base=stream_offset, streams_seen=seen)
                        stream_offset += sum(seen)
                        continue
                if is_log(head):
                    yield from logs.read(path)
                elif is_cut_log(head, path):
                    yield logs.damaged_header(cut_header_message(path, len(head)))
                elif path.is_dir():
                    errors.append(f"{path}: is a directory")
                else:
                    errors.append(f"{path}: not a pcap/pcapng capture or jet event log (use --raw for raw bytes)")
            except InputError as exc:
                errors.append(str(exc))
            except OSError as exc:
                errors.append(f"{path}: {exc.strerror or exc}")


def _use_color(args: argparse.Namespace, stream: IO[str]) -> bool:
    if args.json or args.stats:
        return False
    if args.color == "always":
        return True
    return args.color == "auto" and stream.isatty()


def run_dump(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    # Frames are decoded into short-lived objects that form no reference cycles and
    # are freed by reference counting as each batch is printed; the cycle collector's
    # frequent young-generation passes cost about a third of the summary mode's time
    # (measured), so they run less often here.
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, 50, 1000)
    errors: list[str] = []
    logs = LogSource()
    dissector = Dissector(keep_raw=args.verbose or args.hexdump or args.json, max_body=args.max_body)
    dissector.infer_routes = args.trace
    renderer = Renderer(args, dissector, Output(stdout, _use_color(args, stdout)))
    handle = dissector.event
    try:
        _check_names(args)
    except InputError as exc:
        stderr.write(f"jetdump: {exc}\n")
        return EXIT_USAGE
    if args.write_pcapng:
        return _write_pcapng(args, errors, logs, stderr)
    try:
        def on_wait() -> None:
            # Before each read from the input: what is decoded so far is shown (live
            # input is not held back; a file pays this once per 1 MB chunk).
            renderer.drain()
            if not args.stats:
                renderer.output.flush()

        for event in _input_events(args, errors, logs, on_wait):
            handle(event)
            if len(dissector.out) >= 4096:
                renderer.drain()
    except InputError as exc:
        errors.append(str(exc))
    renderer.finish()
    for message in errors + logs.damaged_headers:
        stderr.write(f"jetdump: {message}\n")
    if logs.damaged_regions:
        stderr.write(f"jetdump: {logs.damaged_regions} damaged region(s) of event-log records skipped "
                     "(the log-damage notes say where)\n")
    if errors:
        return EXIT_UNREADABLE
    return EXIT_DAMAGED if logs.damaged_headers or logs.damaged_regions else 0


def _write_pcapng(args: argparse.Namespace, errors: list[str], logs: LogSource, stderr: IO[str]) -> int:
    from .export import export_pcapng

    try:
        handle = open(args.write_pcapng, "wb")  # noqa: SIM115 - closed below
    except OSError as exc:
        stderr.write(f"jetdump: --write-pcapng {args.write_pcapng}: {exc.strerror or exc}\n")
        return EXIT_UNREADABLE
    streams = frames = 0
    with handle:
        try:
            streams, frames = export_pcapng(_input_events(args, errors, logs), handle, server_port=args.port)
        except InputError as exc:
            errors.append(str(exc))
    for message in errors + logs.damaged_headers:
        stderr.write(f"jetdump: {message}\n")
    stderr.write(f"jetdump: wrote {frames} frame(s) of {streams} connection(s) to {args.write_pcapng}\n")
    if errors:
        return EXIT_UNREADABLE
    return EXIT_DAMAGED if logs.damaged_headers or logs.damaged_regions else 0


def run_tap(args: argparse.Namespace, stdout: IO[str], stderr: IO[str]) -> int:
    try:
        _check_names(args)
    except InputError as exc:
        stderr.write(f"jetdump: {exc}\n")
        return EXIT_USAGE
    host, sep, port_text = args.upstream.rpartition(":")
    # isascii: '¹' passes isdigit() and fails int(); a port is 1..65535.
    if not sep or not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        stderr.write(f"jetdump: --upstream {args.upstream}: expected HOST:PORT\n")
        return EXIT_USAGE
    dissector = Dissector(keep_raw=args.verbose or args.hexdump or args.json, max_body=args.max_body)
    dissector.infer_routes = args.trace
    fmt = LineFormatter(dissector.labels, lambda: dissector.first_ts)

    def dropped_note(count: int) -> str:
        note = NoteRecord(time.time(), None, None, "dropped",
                          f"{count} line(s) dropped: the output was slower than the traffic")
        return json.dumps(json_record(note, fmt)) if args.json else fmt.line(note)

    writer = DroppingWriter(stdout, dropped_note, max_bytes=args.output_buffer)
    renderer = Renderer(args, dissector, Output(writer, _use_color(args, stdout)))  # type: ignore[arg-type]

    def sink(event: Event) -> None:
        dissector.event(event)
        if not args.stats:
            renderer.drain()
            renderer.output.flush()

    def ready(listen_host: str, listen_port: int) -> None:
        stderr.write(f"jetdump tap listening on {listen_host}:{listen_port}, upstream {host}:{port_text}\n")
        stderr.flush()

    try:
        import uvloop

        runner: Callable[..., Any] = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(serve_tap(args.listen_host, args.listen, host.strip("[]"), int(port_text), sink, on_ready=ready))
    except OSError as exc:
        stderr.write(f"jetdump: cannot listen on {args.listen_host}:{args.listen}: {exc.strerror or exc}\n")
        return EXIT_UNREADABLE
    finally:
        renderer.finish()
        writer.close()
    if writer.dropped:
        stderr.write(f"jetdump: {writer.dropped} line(s) dropped: the output was slower than the traffic "
                     "(see --output-buffer)\n")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``jetdump`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["top"]:
            from .top import run_top

            return run_top(argv[1:], sys.stdout, sys.stderr)
        if argv[:1] == ["tap"]:
            return run_tap(build_tap_parser().parse_args(argv[1:]), sys.stdout, sys.stderr)
        return run_dump(build_parser().parse_args(argv), sys.stdout, sys.stderr)
    except BrokenPipeError:
        # `jetdump ... | head`: the reader left; that is not an error of the input.
        # Point stdout at devnull so the interpreter's final flush does not fail again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


__all__ = ["Data", "Gap", "Note", "WholeFrame", "build_parser", "build_tap_parser", "main", "make_filter"]
