"""``jet``: the jet command line, in the spirit of mosquitto_pub/sub, redis-cli and nats.

    jet info
    jet get plant/temp
    jet set plant/temp 22.5
    jet call plant/reset '[1, 2]'
    jet fetch plant/                 # streams add/change/remove until Ctrl-C
    jet fetch players/ --where 'gender == "female"' --sort-by score --desc --top 10
    jet ls plant/ --where 'value > 20'   # one-shot query: matching keys, then exit
    jet serve-state demo/led false   # owns a state, accepts and prints sets

Run ``jet --help`` for the options and the exit codes.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING
from typing import Any
from typing import NoReturn
from typing import Optional
from typing import TextIO
from typing import TypeVar
from typing import Union

from .defaults import DEFAULT_PORT
from .defaults import DEFAULT_TIMEOUT

if TYPE_CHECKING:  # imported where used: `jet get` must start fast (issue 18, BENCHMARKS.md)
    import ssl

    from .aio import FetchEvent
    from .sync import Peer

__all__ = ["EXIT_CODES", "format_value", "main", "parse_value", "value_to_json"]

EXIT_OK = 0
EXIT_ERROR = 1  # any other failure status from the daemon or an owner
EXIT_USAGE = 2  # bad arguments or a value that does not parse (argparse uses 2 too)
EXIT_CONNECTION = 3  # cannot connect, or the connection was lost / closed
EXIT_NOT_FOUND = 4
EXIT_REJECTED = 5
EXIT_TIMEOUT = 6
EXIT_INTERRUPTED = 130  # Ctrl-C: 128 + SIGINT, as shells report a command ended by it
# A daemon sends INFO at once (PROTOCOL.md 4.4): a server silent for this long (or for
# --timeout, if shorter) is reported as not a jet daemon, rather than after --timeout.
INFO_TIMEOUT = 5.0

EXIT_CODES = {
    EXIT_OK: "success (also after SIGTERM in fetch and the serve commands)",
    EXIT_ERROR: "the daemon or the owner answered another error status",
    EXIT_USAGE: "bad arguments, or a VALUE that does not parse as --type",
    EXIT_CONNECTION: "cannot connect, not a jet daemon, or the connection was closed or lost",
    EXIT_NOT_FOUND: "NOT_FOUND: no such state or method",
    EXIT_REJECTED: "REJECTED: the owner refused the set or call",
    EXIT_TIMEOUT: "TIMEOUT: no answer in time",
    EXIT_INTERRUPTED: "interrupted by Ctrl-C (SIGINT)",
}
_STATUS_EXIT = {1: EXIT_NOT_FOUND, 4: EXIT_REJECTED, 5: EXIT_TIMEOUT}  # PROTOCOL.md 8: NOT_FOUND, REJECTED, TIMEOUT
# PROTOCOL.md 5.3 names, for the fast path that does not load jetwire.
_TYPE_NAMES = ("NONE", "BOOL", "INT64", "FLOAT64", "STRING", "JSON", "BYTES", "CBOR", "MSGPACK")

TYPES = ("auto", "none", "bool", "int", "float", "string", "json", "hex", "bytes")


class UsageError(Exception):
    """A command-line value that cannot be used."""


def parse_value(text: Union[str, bytes], vtype: str = "auto") -> Any:
    """Parse a command-line VALUE.

    ``auto`` reads JSON when it can (``42`` -> int, ``3.5`` -> float, ``true`` -> bool,
    ``null`` -> None, ``"text"`` -> str, objects and arrays -> JSON) and takes anything
    else as a string (``hello`` -> ``"hello"``), except text that starts like JSON
    (``{``, ``[`` or ``"``) but does not parse: that is an error. The other types force one reading:
    ``none``, ``bool`` (true/false/1/0/yes/no/on/off), ``int``, ``float``, ``string``
    (the text as is), ``json`` (must parse; sent as a JSON value even for scalars),
    ``hex`` (bytes written as hex digits), ``bytes`` (the bytes of a file or stdin as
    they are, or of the text in UTF-8).

    Raises:
        UsageError: the text does not parse as the type asked for.
    """
    if isinstance(text, bytes):
        if vtype == "bytes":
            return text
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError("the value is not UTF-8 text: give --type bytes to send it as bytes") from None
    try:
        if vtype == "auto":
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                if text.lstrip()[:1] in ('{', '[', '"'):
                    # Silently storing the text would hide the typo: say so instead.
                    raise UsageError(
                        f"{_shorten(text)} looks like JSON but does not parse ({exc}); "
                        "give --type string to send it as text"
                    ) from None
                return text
            if isinstance(parsed, float) and parsed != parsed:  # NaN: keep the words
                return text
            return parsed
        if vtype == "none":
            if text.strip().lower() not in ("", "none", "null"):
                raise UsageError(f"--type none takes no value (got {text!r})")
            return None
        if vtype == "bool":
            lowered = text.strip().lower()
            if lowered in ("true", "1", "yes", "on"):
                return True
            if lowered in ("false", "0", "no", "off"):
                return False
            raise UsageError(f"not a bool: {text!r} (true/false, 1/0, yes/no, on/off)")
        if vtype == "int":
            try:
                number = int(text.strip().replace("_", "") or "x", 0)
            except ValueError:
                raise UsageError(
                    f"--type int: {_shorten(text)} is not a whole number (examples: 42, -7, 0x2A)"
                ) from None
            if not -(2**63) <= number < 2**63:
                raise UsageError(f"--type int: {_shorten(text)} does not fit in 64 bits (-2**63 .. 2**63-1)")
            return number
        if vtype == "float":
            try:
                return float(text)
            except ValueError:
                raise UsageError(f"--type float: {_shorten(text)} is not a number (examples: 3.5, -1e3, 42)") from None
        if vtype == "string":
            return text
        if vtype == "json":
            from jetwire import Value
            from jetwire import ValueType

            try:
                json.loads(text)
            except ValueError as exc:
                raise UsageError(f"--type json: {_shorten(text)} does not parse as JSON ({exc})") from None
            return Value(ValueType.JSON, text.encode("utf-8"))
        if vtype == "hex":
            try:
                return bytes.fromhex(text.removeprefix("0x"))
            except ValueError:
                raise UsageError(
                    f"--type hex: {_shorten(text)} is not hex bytes (two hex digits a byte, e.g. 00ff or 0x00ff)"
                ) from None
        if vtype == "bytes":
            # read_value_source gave the file's or stdin's bytes as they are; a literal
            # VALUE is sent as its UTF-8 bytes.
            return text.encode("utf-8", "surrogateescape")
    except ValueError as exc:
        raise UsageError(f"--type {vtype}: {_shorten(text)} does not parse: {exc}") from None
    raise UsageError(f"unknown --type {vtype!r}")


def _shorten(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def short_key(key: str, limit: int = 60) -> str:
    """KEY for a message: whole up to ``limit`` characters, else its first ``limit``
    characters and its length (``plant/aaaa… (2000 bytes)``)."""
    if len(key) <= limit:
        return key
    size = len(key.encode("utf-8", "surrogateescape"))
    return f"{key[:limit]}… ({size} bytes)"


MAX_KEY_BYTES = 0xFFFF  # PROTOCOL.md 5.1: a key is 1..65535 UTF-8 bytes


def check_key(key: str, what: str = "KEY") -> str:
    """A KEY argument as the protocol carries it.

    Raises:
        UsageError: the key is empty, not UTF-8, or longer than 65535 bytes.
    """
    if not key:
        raise UsageError(f"{what} is empty: it must be 1 to {MAX_KEY_BYTES} UTF-8 bytes")
    return check_text(key, what, "a key is at most")


def check_text(text: str, what: str, limit: str = "at most") -> str:
    """A prefix, name or field argument: UTF-8, at most 65535 bytes (PROTOCOL.md 5.1).

    Raises:
        UsageError: it is not UTF-8, or too long.
    """
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise UsageError(f"{what} {short_key(text)!r} is not valid UTF-8") from None
    if size > MAX_KEY_BYTES:
        raise UsageError(f"{what} {text[:60]}… is {size} bytes long; {limit} {MAX_KEY_BYTES}")
    return text


def read_value_source(text: str, vtype: str = "auto") -> Union[str, bytes]:
    """A VALUE argument as given: ``-`` reads stdin, ``@FILE`` reads FILE (one trailing
    newline dropped in both), ``@@text`` is the literal ``@text``. With ``vtype``
    ``bytes`` stdin and files are read as bytes, exactly (no newline dropped).

    Raises:
        UsageError: the file cannot be read, or is not UTF-8 (and vtype is not bytes).
    """
    if text.startswith("@@"):
        return text[1:]
    source_name = "stdin" if text == "-" else text[1:]
    try:
        if text == "-":
            data = sys.stdin.buffer.read()
        elif text.startswith("@"):
            with open(text[1:], "rb") as source:
                data = source.read()
        else:
            return text
        if vtype == "bytes":
            return data
        read = data.decode("utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {source_name}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{source_name} is not UTF-8 text: give --type bytes to send it as bytes") from None
    return read[:-1] if read.endswith("\n") else read


def value_to_json(value: Any) -> Any:
    """A JSON-serialisable form of a mapped value: bytes as ``{"hex": ...}``, other
    typed values as ``{"vtype": n, "hex": ...}``."""
    if isinstance(value, (bytes, bytearray)):
        return {"hex": bytes(value).hex()}
    if _is_typed(value):
        json_value = _json_of(value)
        if json_value is not _NOT_JSON:
            return json_value
        return {"vtype": value.vtype, "hex": value.data.hex()}
    return value


_NOT_JSON = object()


def _json_of(value: Any) -> Any:
    """The object of a typed JSON value (--type json keeps values so), else _NOT_JSON."""
    if value.vtype != 5:  # PROTOCOL.md 5.3: JSON
        return _NOT_JSON
    try:
        return json.loads(value.data)
    except ValueError:
        return _NOT_JSON


def _is_typed(value: Any) -> bool:
    """A jetwire Value or a peer.tiny Raw: a value with no natural Python form."""
    return hasattr(value, "vtype") and hasattr(value, "data")


def format_value(value: Any) -> str:
    """Human-readable text of a mapped value (JSON notation where possible)."""
    if isinstance(value, (bytes, bytearray)):
        return "0x" + bytes(value).hex()
    if _is_typed(value):
        json_value = _json_of(value)
        if json_value is not _NOT_JSON:
            return json.dumps(json_value, ensure_ascii=False)
        return f"<{_vtype_name(value.vtype)} {value.data.hex()}>"
    return json.dumps(value, ensure_ascii=False)


class Output:
    """Writes results as readable lines (colour on a terminal) or JSON lines."""

    def __init__(self, as_json: bool, stream: TextIO = sys.stdout, timestamps: bool = False) -> None:
        self.as_json = as_json
        self.timestamps = timestamps  # jet fetch --timestamps: when each line was received
        self.stream = stream
        self.lock = threading.Lock()
        self.console: Any = None
        if not as_json and stream.isatty():
            from rich.console import Console

            self.console = Console(file=stream, highlight=False)

    def emit(self, obj: dict[str, Any], text: str, markup: Optional[str] = None) -> None:
        if self.timestamps:
            stamp = received_at()
            obj = {"time": stamp, **obj}
            text = f"{stamp} {text}"
            markup = None if markup is None else f"[dim]{stamp}[/] {markup}"
        with self.lock:
            if self.as_json:
                self.stream.write(json.dumps(obj, ensure_ascii=False) + "\n")
            elif self.console is not None and markup is not None:
                self.console.print(markup)
            else:
                self.stream.write(text + "\n")
            self.stream.flush()


def received_at() -> str:
    """Now as ISO 8601 local time with milliseconds and the UTC offset, as
    ``mosquitto_sub -F %I`` prints it (``2026-11-27T23:20:01.123+00:00``)."""
    import datetime

    return datetime.datetime.now().astimezone().isoformat(timespec="milliseconds")


FEATURE_NAMES = ((0x1, "CONFLATION"), (0x2, "QUERIES"), (0x4, "AUTH_REQUIRED"), (0x8, "LIMITS"),
                 (0x10, "DAEMON_STATES"))  # PROTOCOL.md 4.4


def feature_names(features: int) -> list[str]:
    """The names of an INFO's feature bits (PROTOCOL.md 4.4); an unknown bit as hex."""
    names = [name for bit, name in FEATURE_NAMES if features & bit]
    known = sum(bit for bit, _ in FEATURE_NAMES)
    names += [f"0x{1 << n:08X}" for n in range(32) if features & ~known & (1 << n)]
    return names


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


_KIND_STYLE = {"add": "green", "change": "yellow", "remove": "red", "set": "cyan", "reject": "red"}


def _event_line(out: Output, kind: str, key: str, value: Any, vtype: str) -> None:
    shown = format_value(value)
    out.emit(
        {"event": kind, "key": key, "value": value_to_json(value), "type": vtype},
        f"{kind:<6} {key} = {shown}",
        f"[{_KIND_STYLE.get(kind, 'white')}]{kind:<6}[/] [bold]{_escape(key)}[/] = {_escape(shown)}",
    )


def _type_name(raw: Any) -> str:
    return _vtype_name(raw.vtype)


def _vtype_name(vtype: int) -> str:
    return _TYPE_NAMES[vtype] if vtype < len(_TYPE_NAMES) else f"0x{vtype:02X}"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``jet``."""
    codes = "\n".join(f"  {code}  {text}" for code, text in EXIT_CODES.items())
    parser = argparse.ArgumentParser(
        prog="jet",
        description="Talk to a jet daemon: read, set, call, fetch, or own a state.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "VALUE parsing (--type auto): 42 -> int, 3.5 -> float, true -> bool, null -> none,\n"
            '\'"text"\' -> string, \'{"a": 1}\' -> JSON, any other word -> string.\n\n'
            f"exit codes:\n{codes}\n\n"
            f"environment: JET_HOST, JET_PORT (default 127.0.0.1:{DEFAULT_PORT}), JET_PASSWORD\n"
            "(the password of --user; without it, jet asks on the terminal)"
        ),
    )
    _connection_arguments(parser, command=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, timeout: bool = True, **kwargs: Any) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        _connection_arguments(sub, command=True, timeout=timeout)
        return sub

    command("info", help="show the daemon's INFO")
    get = command("get", help="print a state's cached value")
    get.add_argument("key")
    set_ = command("set", help="ask a state's owner to take a value; print the value in effect",
                   description="Ask a state's owner to take VALUE; print the value in effect.",
                   epilog=VALUE_SOURCES)
    set_.add_argument("key")
    set_.add_argument("value", help="the value; - reads stdin, @FILE reads a file")
    set_.add_argument("--type", choices=TYPES, default="auto", help="how to read VALUE (default auto)")
    set_.add_argument("--no-wait", action="store_true", help="fire and forget: send without waiting")
    call = command("call", help="call a method; print its result",
                   description="Call a method with ARGS; print its result.", epilog=VALUE_SOURCES)
    call.add_argument("key")
    call.add_argument("args", nargs="?", default=None, help="the argument (default none); - reads stdin, @FILE a file")
    call.add_argument("--type", choices=TYPES, default="auto", help="how to read ARGS (default auto)")
    fetch = command(
        timeout=False,
        name=        "fetch",
        help="stream add/change/remove of states by key prefix (and query) until Ctrl-C",
        description="Stream a fetch. With --where, --sort-by, --methods or --nodes it is a query "
        "fetch (protocol 1.1): EXPR is 'FIELD OP JSONVALUE' or 'value OP JSONVALUE', OP one of "
        "== != < <= > >=, e.g. --where 'gender == \"female\"'. A sorted fetch prints its whole "
        "window after each update.",
    )
    fetch.add_argument("prefix", nargs="?", default="", help="key prefix (default: every state)")
    _query_arguments(fetch)
    _sort_arguments(fetch)
    fetch.add_argument("--methods", action="store_true", help="also methods")
    fetch.add_argument("--nodes", action="store_true", help="also nodes (hierarchy levels split on /)")
    fetch.add_argument("--count", type=_at_least_one, metavar="N", help="exit after N events (N window updates when sorted)")
    fetch.add_argument(
        "--timeout", dest="exit_after", type=_seconds, metavar="S",
        help="exit after S seconds (here --timeout is not the request timeout: give that before 'fetch')",
    )
    fetch.add_argument("--timestamps", action="store_true",
                       help="begin each line with the time jet received it (ISO 8601, local time with its "
                       "UTC offset, as mosquitto_sub -F %%I); with --json a \"time\" field")
    ls = command("ls", help="one-shot query: print the matching keys, then exit",
                 description="Answer a query once (QUERY_ONCE): the matching keys in byte order of key, "
                 "or in the order of --sort-by (its window: --top N, or --from N --to M), then exit.")
    ls.add_argument("prefix", nargs="?", default="", help="key prefix (default: every key)")
    _query_arguments(ls)
    _sort_arguments(ls)
    serve = command(
        "serve-state", help="own a state; accept and print every set until Ctrl-C",
        description="Own a state; accept and print every set until Ctrl-C. With a --type other than auto "
        "the state keeps that type: a set with a value of another type is rejected (an int is "
        "taken as a float by a float state, any JSON-mappable value by a json state).",
        epilog=VALUE_SOURCES,
    )
    serve.add_argument("key")
    serve.add_argument("value", help="the initial value; - reads stdin, @FILE reads a file")
    serve.add_argument("--type", choices=TYPES, default="auto", help="how to read VALUE and the type kept (default auto)")
    serve.add_argument("--read-only", action="store_true", help="reject every set")
    method = command(
        "serve-method", help="own a method; print each call and answer it until Ctrl-C",
        description="Own a method; print each call and answer it until Ctrl-C: with --result "
        "(default none), or with the output of COMMAND, run once per call with the call's "
        "argument as JSON on its stdin. COMMAND's stdout (one trailing newline dropped) is "
        "read as --type; a non-zero exit or no answer within --timeout is answered REJECTED "
        "with its last line of stderr. Calls are answered one at a time.",
        epilog="example: jet serve-method calc/double -- python3 -c "
        "'import json,sys; print(2 * json.load(sys.stdin))'",
    )
    method.add_argument("key")
    method.add_argument("run", nargs="*", metavar="-- COMMAND", help="the command that answers each call")
    method.add_argument("--result", metavar="VALUE", help="the fixed answer (default none)")
    method.add_argument("--type", choices=TYPES, default="auto", help="how to read the answer (default auto)")
    return parser


VALUE_SOURCES = (
    "VALUE sources: - reads the value from stdin, @FILE from FILE (one trailing newline\n"
    "is dropped); @@text is the literal text @text. Use them for large values. With\n"
    "--type bytes, a file or stdin is sent as it is (binary, every byte kept)."
)


def _connection_arguments(parser: argparse.ArgumentParser, *, command: bool, timeout: bool = True) -> None:
    """The options of every command. They are accepted before and after the command: on a
    command they default to SUPPRESS, so only an option given there replaces the global."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if command else value

    group = parser.add_argument_group("connection")
    group.add_argument("--host", default=default(os.environ.get("JET_HOST", "127.0.0.1")), help="daemon host ($JET_HOST)")
    group.add_argument("--port", type=_port_number, default=default(None),
                       help=f"daemon port ($JET_PORT, default {DEFAULT_PORT})")
    group.add_argument("--json", action="store_true", default=default(False), help="print one JSON object per line")
    if timeout:
        group.add_argument("--timeout", type=_seconds, default=default(DEFAULT_TIMEOUT),
                           help=f"seconds to wait for an answer (default {DEFAULT_TIMEOUT})")
    group.add_argument("--name", default=default("jet-cli"), help="peer name sent to the daemon (default jet-cli)")
    security = parser.add_argument_group("security (PROTOCOL.md 15)")
    security.add_argument("--user", metavar="NAME", default=default(None),
                          help="authenticate as NAME (password: $JET_PASSWORD, else a prompt)")
    security.add_argument("--tls", action="store_true", default=default(False),
                          help="connect with TLS (system CAs unless --ca)")
    security.add_argument("--ca", metavar="FILE", default=default(None),
                          help="PEM CA bundle to verify the daemon with (implies --tls)")
    security.add_argument("--cert", dest="tls_cert", metavar="FILE", default=default(None),
                          help="PEM client certificate (implies --tls; with --key)")
    # dest: "key" is the positional KEY of get/set/call.
    security.add_argument("--key", dest="tls_key", metavar="FILE", default=default(None), help="PEM private key of --cert")


_N = TypeVar("_N", int, float)


def _number(convert: Callable[[str], _N], accept: Callable[[_N], bool], what: str) -> Callable[[str], _N]:
    """An argparse ``type`` that reads a number and refuses it, naming ``what``, unless
    ``accept`` takes it."""

    def parse(text: str) -> _N:
        try:
            number = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not accept(number):
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}")
        return number

    return parse


_port_number = _number(int, lambda port: 1 <= port <= 65535, "a port number (1-65535)")
_seconds = _number(float, lambda seconds: seconds > 0 and math.isfinite(seconds), "a positive number of seconds")
_at_least_one = _number(int, lambda number: number >= 1, "a whole number of at least 1")


def _query_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--where", action="append", default=[], metavar="EXPR", help="FIELD OP JSONVALUE or value OP JSONVALUE"
    )


def _sort_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sort-by", metavar="key|value|FIELD", help="sort by key, by the value, or by a field")
    parser.add_argument("--desc", action="store_true", help="sort descending")
    parser.add_argument("--top", type=_at_least_one, metavar="N", help="the window 1..N of the sort")
    parser.add_argument("--from", dest="window_from", type=_at_least_one, metavar="N",
                        help="first position of the window")
    parser.add_argument("--to", dest="window_to", type=_at_least_one, metavar="M", help="last position of the window")


_EXPR = re.compile(r"^\s*(\S+?)\s*(==|!=|<=|>=|<|>)\s*(.+?)\s*$")
_OPS = {
    "==": lambda f, x: f == x,
    "!=": lambda f, x: f != x,
    "<": lambda f, x: f < x,
    "<=": lambda f, x: f <= x,
    ">": lambda f, x: f > x,
    ">=": lambda f, x: f >= x,
}


def parse_where(text: str) -> Any:
    """``FIELD OP JSONVALUE`` (or ``value OP JSONVALUE``) as a value filter.

    Raises:
        UsageError: for anything else, or a JSON value that is not a scalar.
    """
    match = _EXPR.match(text)
    if match is None:
        raise UsageError(f"--where {text!r}: expected FIELD OP JSONVALUE, OP one of == != < <= > >=")
    from .query import field
    from .query import value as value_itself

    name, op, literal = match.groups()
    try:
        operand = json.loads(literal)
    except ValueError:
        raise UsageError(f"--where {text!r}: {literal!r} is not a JSON value (strings need double quotes)") from None
    if isinstance(operand, (dict, list)):
        raise UsageError(f"--where {text!r}: compare with a number, string, true, false or null")
    target = value_itself if name == "value" else field(name)
    return _OPS[op](target, operand)


def _query_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"where": [parse_where(text) for text in args.where]}
    window = None
    if args.top is not None and (args.window_from is not None or args.window_to is not None):
        raise UsageError("give --top N or --from N --to M, not both")
    if (args.window_from is None) != (args.window_to is None):
        raise UsageError("--from and --to go together")
    if args.window_from is not None:
        if args.window_to < args.window_from:
            raise UsageError(f"--to {args.window_to} is before --from {args.window_from}")
        window = (args.window_from, args.window_to)
    if (args.top is not None or window is not None or args.desc) and args.sort_by is None:
        raise UsageError("--top, --from/--to and --desc need --sort-by")
    kwargs.update(sort_by=args.sort_by, descending=args.desc, top=args.top, window=window)
    if args.command == "fetch":
        kwargs.update(methods=args.methods, nodes=args.nodes)
    return kwargs


def _port(args: argparse.Namespace) -> int:
    if args.port is not None:
        return int(args.port)
    text = os.environ.get("JET_PORT")
    if not text:
        return DEFAULT_PORT
    try:
        return _port_number(text)
    except argparse.ArgumentTypeError:
        raise UsageError(f"JET_PORT is not a port number (1-65535): {text!r}") from None


def _password(user: Optional[str]) -> Optional[str]:
    """The password of ``--user``: $JET_PASSWORD, else asked on the terminal."""
    if user is None:
        return None
    password = os.environ.get("JET_PASSWORD")
    if password is not None:
        return password
    if not sys.stdin.isatty():
        raise UsageError("--user needs a password: set JET_PASSWORD (stdin is not a terminal)")
    return getpass.getpass(f"password for {user}: ")


def _ssl_context(args: argparse.Namespace) -> Optional[ssl.SSLContext]:
    """The TLS context of ``--tls/--ca/--cert/--key``, or None without TLS."""
    if not (args.tls or args.ca or args.tls_cert or args.tls_key):
        return None
    import ssl

    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--cert and --key go together")
    try:
        context = ssl.create_default_context(cafile=args.ca)
    except ssl.SSLError as exc:
        raise UsageError(f"--ca {args.ca}: no CA certificate in it ({exc.reason or exc})") from None
    except OSError as exc:
        raise UsageError(f"--ca {args.ca}: {exc.strerror or exc}") from None
    if args.tls_cert is not None:
        try:
            context.load_cert_chain(args.tls_cert, args.tls_key)
        except ssl.SSLError as exc:
            raise UsageError(_pem_problem(exc, args.tls_cert, args.tls_key)) from None
        except OSError as exc:
            flag, name = next(((flag, path) for flag, path in (("--cert", args.tls_cert), ("--key", args.tls_key))
                               if not os.access(path, os.R_OK)), ("--cert/--key", exc.filename))
            raise UsageError(f"{flag} {name}: {exc.strerror or exc}") from None
    return context


def _pem_problem(exc: BaseException, cert_path: str, key_path: str) -> str:
    """What ``load_cert_chain`` failed on, in words (OpenSSL says ``[SSL] PEM lib``)."""
    if getattr(exc, "reason", None) == "KEY_VALUES_MISMATCH":
        return f"--key {key_path} is not the key of the certificate in --cert {cert_path}"
    heads = []
    for path in (cert_path, key_path):
        try:
            with open(path, "rb") as source:
                heads.append(source.read(1 << 16).decode("ascii", "replace"))
        except OSError:
            heads.append("")
    if "CERTIFICATE-----" not in heads[0]:
        held = "a private key" if "PRIVATE KEY-----" in heads[0] else "no PEM certificate"
        return f"--cert {cert_path} holds {held}: it takes the certificate (-----BEGIN CERTIFICATE-----)"
    if "PRIVATE KEY-----" not in heads[1]:
        held = "a certificate" if "CERTIFICATE-----" in heads[1] else "no PEM private key"
        return f"--key {key_path} holds {held}: it takes the private key (-----BEGIN PRIVATE KEY-----)"
    return str(getattr(exc, "reason", "") or exc)


def _fail(message: str, code: int) -> NoReturn:
    print(f"jet: {message}", file=sys.stderr)
    raise SystemExit(code)


class _Terminated(BaseException):
    """SIGTERM arrived: end the command cleanly (a BaseException, as KeyboardInterrupt,
    so that no ``except Exception`` on the way takes it for an error)."""


def _exit_interrupted() -> NoReturn:
    """Exit with 130 now. CPython 3.11 remembers a KeyboardInterrupt that went through an
    ``exec`` of source text (dataclasses and namedtuple make their methods so, while a
    module imports) even when it was caught later, and then ends the process by SIGINT
    itself at exit instead of with our code: leave before that."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


def _interrupt(signum: int, frame: Optional[FrameType]) -> None:
    raise KeyboardInterrupt


def _terminate(signum: int, frame: Optional[FrameType]) -> None:
    raise _Terminated


def run(args: argparse.Namespace, out: Output) -> int:
    """Run one parsed command; return the exit code (errors propagate as exceptions)."""
    host, port = args.host, _port(args)
    _check_arguments(args)
    value: Any = None
    if args.command in ("set", "serve-state"):
        value = parse_value(read_value_source(args.value, args.type), args.type)
    elif args.command == "call":
        value = None if args.args is None else parse_value(read_value_source(args.args, args.type), args.type)
    elif args.command == "serve-method":
        if args.run and args.result is not None:
            raise UsageError("give --result VALUE or -- COMMAND, not both")
        if args.result is not None:
            value = parse_value(read_value_source(args.result, args.type), args.type)
    password = _password(args.user)
    if args.command in ("get", "call") or (args.command == "set" and not args.no_wait):
        return _one_request(args, host, port, password, value, out)
    from .errors import PeerError
    from .sync import Peer

    with Peer(host, port, name=args.name, timeout=args.timeout, user=args.user, password=password,
              ssl=_ssl_context(args), info_timeout=INFO_TIMEOUT) as peer:
        if args.command == "info":
            info = peer.info
            names = feature_names(info.features)
            out.emit(
                {"name": info.name, "version": f"{info.major}.{info.minor}", "max_body": info.max_body,
                 "features": info.features, "feature_names": names, "host": host, "port": port,
                 "max_key_length": info.max_key_length, "route_timeout_ms": info.route_timeout_ms},
                f"{info.name} at {host}:{port}: protocol {info.major}.{info.minor}, "
                f"max_body {info.max_body}, features 0x{info.features:08X} ({', '.join(names) or 'none'})"
                + ("" if info.max_key_length is None else
                   f", max_key_length {info.max_key_length}, route timeout {info.route_timeout_ms} ms"),
            )
        elif args.command == "get":
            raw = peer.get_raw(args.key)
            got = raw.to_python()
            out.emit({"key": args.key, "value": value_to_json(got), "type": _type_name(raw)}, format_value(got))
        elif args.command == "set":
            if args.no_wait:
                peer.set_nowait(args.key, value)
                # A round trip after it: the event has reached the daemon before we
                # close. Its outcome is not reported (PROTOCOL.md 7.1), nor this one's.
                with contextlib.suppress(PeerError):
                    peer.get_raw(args.key)
                return EXIT_OK
            now = peer.set(args.key, value)
            out.emit({"key": args.key, "value": value_to_json(now)}, format_value(now))
        elif args.command == "call":
            result = peer.call(args.key, value)
            out.emit({"key": args.key, "result": value_to_json(result)}, format_value(result))
        elif args.command == "fetch":
            return _fetch(peer, args, out)
        elif args.command == "ls":
            for entry in peer.query(args.prefix, **_query_kwargs(args)):
                try:
                    shown: Any = entry.value
                except PeerError:
                    shown = entry.raw
                out.emit(
                    {"kind": entry.kind, "key": entry.key, "value": value_to_json(shown), "type": _type_name(entry.raw)},
                    entry.key,
                )
        elif args.command == "serve-state":
            return _serve_state(peer, args, value, out)
        elif args.command == "serve-method":
            return _serve_method(peer, args, value, out)
    return EXIT_OK


def _check_arguments(args: argparse.Namespace) -> None:
    """What argparse cannot check: keys, prefixes and names the protocol can carry.

    Raises:
        UsageError: an empty key, text that is not UTF-8, or a string over 65535 bytes.
    """
    if hasattr(args, "key"):
        check_key(args.key)
    if hasattr(args, "prefix"):
        check_text(args.prefix, "PREFIX")
    check_text(args.name, "--name")
    if args.user is not None:
        check_key(args.user, "--user")
    for text in getattr(args, "where", ()):
        check_text(text, "--where")
    sort_by = getattr(args, "sort_by", None)
    if sort_by is not None:
        if not sort_by.strip():
            raise UsageError("--sort-by is empty: give key, value or a FIELD name")
        check_text(sort_by, "--sort-by")


def _one_request(
    args: argparse.Namespace, host: str, port: int, password: Optional[str], value: Any, out: Output
) -> int:
    """get, set and call through :mod:`peer.tiny`: one request needs neither asyncio nor a
    thread, and the command starts in a third of the time (BENCHMARKS.md, jet start-up)."""
    from .tiny import Raw
    from .tiny import TinyPeer
    from .tiny import from_value

    if _is_typed(value):
        value = Raw(value.vtype, value.data)  # --type json
    try:
        peer = TinyPeer(host, port, name=args.name, timeout=args.timeout, user=args.user, password=password or "",
                        ssl=_ssl_context(args), info_timeout=INFO_TIMEOUT)
    except OSError as exc:
        raise _Unreachable(host, port, exc) from None
    with peer:
        if args.command == "get":
            raw = peer.get_raw(args.key)
            got = _from_raw(raw, from_value)
            out.emit({"key": args.key, "value": value_to_json(got), "type": _type_name(raw)}, format_value(got))
        elif args.command == "set":
            now = _from_raw(peer.set_raw(args.key, value), from_value)
            out.emit({"key": args.key, "value": value_to_json(now)}, format_value(now))
        else:
            result = _from_raw(peer.call_raw(args.key, value), from_value)
            out.emit({"key": args.key, "result": value_to_json(result)}, format_value(result))
    return EXIT_OK


def _from_raw(raw: Any, from_value: Any) -> Any:
    """A value as the full peer maps it: tiny's mapping for the types it knows, jetwire's
    (CBOR, MSGPACK) for the rest."""
    if raw.vtype <= 6:
        return from_value(raw.vtype, raw.data)
    from jetwire import Value

    return Value(raw.vtype, raw.data).to_python()


class _Unreachable(Exception):
    """The daemon cannot be reached (the fast path's connection error)."""

    def __init__(self, host: str, port: int, exc: OSError) -> None:
        import ssl

        if isinstance(exc, ConnectionRefusedError):
            why = "is jetd running? (connection refused)"
        elif isinstance(exc, ssl.SSLError):
            from .errors import describe_tls_failure

            why = describe_tls_failure(exc, host)
        else:
            why = exc.strerror or str(exc)
        super().__init__(f"cannot connect to {host}:{port}: {why}")


def _fetch(peer: Peer, args: argparse.Namespace, out: Output) -> int:
    """``jet fetch``: print events until Ctrl-C, ``--count`` events (window updates when
    sorted) or ``--timeout`` seconds."""

    kwargs = _query_kwargs(args)
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    deadline = None if args.exit_after is None else time.monotonic() + args.exit_after
    seen = 0
    with peer.fetch(args.prefix, **kwargs) as fetch:
        while args.count is None or seen < args.count:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            try:
                event = fetch.next(timeout=remaining)
            except TimeoutError:
                break
            except StopAsyncIteration:
                break
            seen += 1
            if event.rows or str(event.kind) == "window":
                _print_window(out, event)
            else:
                _print_event(out, event)
    return EXIT_OK


def _print_window(out: Output, event: FetchEvent) -> None:
    """PROTOCOL.md 14.2: the whole window after the update, in index order."""
    from .errors import PeerError

    rows = []
    lines = [f"window ({len(event.rows)} rows)"]
    for row in event.rows:
        try:
            shown: Any = row.value
        except PeerError:
            shown = row.raw
        rows.append({"index": row.index, "key": row.key, "value": value_to_json(shown), "type": _type_name(row.raw)})
        lines.append(f"{row.index:>4}  {row.key} = {format_value(shown)}")
    out.emit({"event": "window", "rows": rows}, "\n".join(lines))


def _print_event(out: Output, event: FetchEvent) -> None:
    from .errors import PeerError

    try:
        value: Any = event.value
    except PeerError:
        value = event.raw
    _event_line(out, str(event.kind), event.key, value, _type_name(event.raw))


def _serve_state(peer: Peer, args: argparse.Namespace, value: Any, out: Output) -> int:
    from jetwire import Value

    from .errors import Rejected

    def on_set(requested: Any) -> Any:
        # Runs on the peer's thread (see peer.sync); checking and printing is all it does.
        # Only a set that was taken prints as "set"; a refused one says so (issue 32).
        try:
            if args.read_only:
                raise Rejected(f"state {short_key(args.key)!r} is read-only (serve-state --read-only)")
            kept = conform(requested, args.type, args.key)
        except Rejected as exc:
            shown = format_value(requested)
            out.emit(
                {"event": "rejected", "key": args.key, "value": value_to_json(requested),
                 "type": _type_name(Value.of(requested)), "reason": exc.message},
                f"{'reject':<6} {args.key} = {shown}  ({exc.message})",
                f"[red]reject[/] [bold]{_escape(args.key)}[/] = {_escape(shown)}  [dim]({_escape(exc.message)})[/]",
            )
            raise
        _event_line(out, "set", args.key, kept, _type_name(Value.of(kept)))
        return kept

    peer.add_state(args.key, value, on_set=on_set)
    shown = format_value(value)
    shown = shown if len(shown) <= 200 else f"{shown[:200]}… ({len(shown)} characters)"
    print(f"jet: serving {short_key(args.key)} = {shown} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    peer.wait_closed()
    _fail("the daemon closed the connection", EXIT_CONNECTION)


def conform(value: Any, vtype: str, key: str) -> Any:
    """VALUE as a state declared with ``--type VTYPE`` holds it.

    Raises:
        Rejected: VALUE is of another type (the owner's answer to the set).
    """
    from jetwire import Value
    from jetwire import ValueType

    from .errors import Rejected

    if vtype in ("auto", "string") and (vtype == "auto" or isinstance(value, str)):
        return value
    if vtype == "none" and value is None:
        return None
    if vtype == "bool" and isinstance(value, bool):
        return value
    if vtype in ("int", "float") and isinstance(value, int) and not isinstance(value, bool):
        return value if vtype == "int" else float(value)
    if vtype == "float" and isinstance(value, float):
        return value
    if vtype in ("hex", "bytes") and isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if vtype == "json":
        if isinstance(value, Value) and value.vtype == ValueType.JSON:
            return value
        with contextlib.suppress(TypeError, ValueError):
            return Value(ValueType.JSON, json.dumps(value, allow_nan=False).encode("utf-8"))
    raise Rejected(f"{short_key(key)} holds {vtype} values (serve-state --type {vtype}); got {format_value(value)[:80]}")


def _serve_method(peer: Peer, args: argparse.Namespace, result: Any, out: Output) -> int:
    import asyncio

    from .errors import Rejected

    key, command, timeout = args.key, list(args.run), args.timeout

    async def answer(call_args: Any) -> Any:
        # Runs on the peer's event loop: the command runs without blocking the peer.
        out.emit(
            {"event": "call", "key": key, "args": value_to_json(call_args)},
            f"call   {key}({format_value(call_args)})",
            f"[cyan]call  [/] [bold]{_escape(key)}[/]({_escape(format_value(call_args))})",
        )
        if not command:
            return result
        stdin = json.dumps(value_to_json(call_args), ensure_ascii=False).encode("utf-8")
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise Rejected(f"cannot run {command[0]}: {exc.strerror or exc}") from None
        try:
            stdout, stderr = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise Rejected(f"{command[0]} gave no answer within {timeout} s") from None
        if proc.returncode != 0:
            lines = stderr.decode("utf-8", "replace").strip().splitlines()
            detail = f": {lines[-1]}" if lines else ""
            raise Rejected(f"{command[0]} failed with exit status {proc.returncode}{detail}")
        text = stdout.decode("utf-8", "replace")
        try:
            return parse_value(text[:-1] if text.endswith("\n") else text, args.type)
        except UsageError as exc:
            raise Rejected(f"{command[0]} answered {exc}") from None

    peer.add_method(key, answer)
    how = f"with the output of {' '.join(command)}" if command else f"with {format_value(result)}"
    print(f"jet: serving method {short_key(key)}, answering {how} (Ctrl-C to stop)", file=sys.stderr, flush=True)
    peer.wait_closed()
    _fail("the daemon closed the connection", EXIT_CONNECTION)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``jet``; returns (and exits with) the exit code.

    Ctrl-C anywhere in it ends the command with exit code 130 and no traceback; SIGTERM
    ends fetch and the serve commands cleanly (0).
    """
    on_main_thread = threading.current_thread() is threading.main_thread()
    as_program = argv is None  # the jet command itself, not a caller in the same process
    # Before anything else (argument parsing, rich's import on a terminal, the
    # connection): a Ctrl-C from here on is ours to report (issue 32).
    previous = (
        (signal.signal(signal.SIGINT, _interrupt), signal.signal(signal.SIGTERM, _terminate))
        if on_main_thread else None
    )
    args: Optional[argparse.Namespace] = None
    try:
        parser = build_parser()
        argv = list(sys.argv[1:] if argv is None else argv)
        run_command: list[str] = []
        if "serve-method" in argv and "--" in argv[argv.index("serve-method"):]:
            # argparse cannot take "-- COMMAND" after options that follow KEY: cut it off here.
            cut = argv.index("--", argv.index("serve-method"))
            argv, run_command = argv[:cut], argv[cut + 1 :]
            if not run_command:
                parser.error("serve-method: give a COMMAND after --")
        args = parser.parse_args(argv)
        if run_command:
            args.run = [*args.run, *run_command]
        return run(args, Output(args.json, timestamps=getattr(args, "timestamps", False)))
    except KeyboardInterrupt:
        if as_program:
            _exit_interrupted()
        return EXIT_INTERRUPTED
    except _Terminated:
        return EXIT_OK
    except UsageError as exc:
        _fail(str(exc), EXIT_USAGE)
    except _Unreachable as exc:
        _fail(str(exc), EXIT_CONNECTION)
    except BrokenPipeError:
        # `jet fetch | head`: the reader left; that is not an error.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:
        _fail_for(exc, getattr(args, "key", None))
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous[0])
            signal.signal(signal.SIGTERM, previous[1])


def _fail_for(exc: Exception, key: Optional[str]) -> NoReturn:
    """The message and exit code of an error from either peer (the full one or tiny)."""
    from jetwire import JetError
    from jetwire import LocalProtocolError
    from jetwire import Status

    from .errors import ConnectionClosed
    from .errors import NotJetDaemon
    from .errors import PeerError
    from .tiny import NotJetDaemon as TinyNotJetDaemon
    from .tiny import TinyError

    shown_key = "" if key is None else short_key(key)
    if isinstance(exc, (NotJetDaemon, TinyNotJetDaemon)):
        hint = " (connect with --tls, and --ca FILE for your own CA)" if exc.tls else ""
        _fail(f"{exc.message}{hint}", EXIT_CONNECTION)
    if isinstance(exc, TinyError):
        text = _shorten_in(exc.message, key)
        if text.startswith(("connection", "daemon closed")):
            _fail(text, EXIT_CONNECTION)
        if exc.status == Status.TIMEOUT and text.startswith("no response in time"):
            _fail(f"TIMEOUT: {text}", EXIT_TIMEOUT)
        about = "" if _names_key(text, shown_key) else f"{shown_key}: "
        _fail(f"{exc.status_name}: {about}{text}", _STATUS_EXIT.get(exc.status, EXIT_ERROR))
    if isinstance(exc, ConnectionClosed):
        _fail(_shorten_in(exc.message, key) or "connection closed", EXIT_CONNECTION)
    if isinstance(exc, PeerError):
        status = exc.status
        code = _STATUS_EXIT.get(status, EXIT_ERROR) if status is not None else EXIT_ERROR
        text = _shorten_in(exc.message, key)
        about = "" if _names_key(text, shown_key) else f"{shown_key}: "
        _fail(f"{status.name if status else 'ERROR'}: {about}{text}", code)
    if isinstance(exc, LocalProtocolError):
        _fail(_shorten_in(exc.message, key), EXIT_USAGE)
    if isinstance(exc, JetError):
        _fail(_shorten_in(str(exc), key), EXIT_ERROR)
    if isinstance(exc, ValueError):
        # peer.tiny refuses what the protocol cannot carry (an int beyond INT64, ...).
        _fail(_shorten_in(str(exc), key), EXIT_USAGE)
    if os.environ.get("JET_TRACEBACK"):
        raise exc
    _fail(f"unexpected error: {type(exc).__name__}: {exc} (JET_TRACEBACK=1 shows where)", EXIT_ERROR)


def _names_key(text: str, key: str) -> bool:
    """Whether the message names KEY already (as a word of its own: key ``a`` is not
    named by ``no such state``)."""
    return not key or re.search(rf"(?<![\w/.-]){re.escape(key)}(?![\w/.-])", text) is not None


def _shorten_in(text: str, key: Optional[str]) -> str:
    """TEXT with a long KEY in it shortened (messages echo the key, which may be huge)."""
    if key is None or len(key) <= 60 or not text:
        return text
    return text.replace(repr(key), short_key(key)).replace(key, short_key(key))


if __name__ == "__main__":
    sys.exit(main())
