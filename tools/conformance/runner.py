"""Run conformance cases against a daemon over raw TCP sockets, with jetwire only.

The runner knows nothing about any daemon's internals: it opens connections, sends the
bytes a case describes and checks what comes back against the case's patterns.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Optional

from jetwire import FEATURE_AUTH_REQUIRED
from jetwire import Decoder
from jetwire import Info
from jetwire import Message
from jetwire import Status
from jetwire import decode_body
from jetwire import encode
from jetwire.errors import JetError
from jetwire.errors import RemoteProtocolError

from .cases import Case
from .cases import CaseError
from .cases import Env
from .cases import Pattern
from .cases import build_message
from .cases import build_raw
from .cases import describe_message
from .cases import evaluate
from .cases import match_message

__all__ = [
    "OUTCOMES",
    "CaseResult",
    "ExchangeEntry",
    "RunConfig",
    "probe",
    "run_case",
    "run_cases",
]

# Autobahn-style outcomes (issue 7). FAILED covers a MUST not met and runner errors.
OK = "OK"
NON_STRICT = "NON-STRICT"
FAILED = "FAILED"
INFORMATIONAL = "INFORMATIONAL"
SKIPPED = "SKIPPED"
OUTCOMES = (OK, NON_STRICT, FAILED, INFORMATIONAL, SKIPPED)

# What we accept from the daemon in one frame: generous (cases send bodies up to the
# daemon's max_body and the daemon echoes them in events), but still bounded.
RECEIVE_MAX_BODY = 64 * 1024 * 1024
HEX_SHOWN = 512  # bytes of a frame shown in hex in reports; the rest is elided
READ_SIZE = 256 * 1024


@dataclass
class RunConfig:
    """Settings of one run; ``variables`` seeds every case's environment."""

    host: str
    port: int
    timeout: float = 5.0
    route_timeout: float = 5.0
    strict: bool = False
    jobs: int = 16
    case_timeout: float = 120.0
    variables: dict[str, Any] = field(default_factory=dict)
    run_token: str = field(default_factory=lambda: secrets.token_hex(3))
    subject: str = ""  # what was tested, for reports; default HOST:PORT (the peer suite names its agent)
    web: Optional[tuple[str, int]] = None  # the daemon's HTTP listener (PROTOCOL.md 13), for the web cases

    def label(self) -> str:
        """What reports name as the thing tested."""
        return self.subject or f"{self.host}:{self.port}"

    def base_env(self) -> Env:
        """Variables every case sees before its first step."""
        return {
            "timeout": self.timeout,
            "route_timeout": self.route_timeout,
            # PROTOCOL.md 10.7: defaults of jetd, overridable with --var for other daemons.
            "max_key_length": 1024,
            "max_fetches_per_connection": 1000,
            "max_states_per_connection": 100_000,
            "max_pending_per_owner": 10_000,
            "web": 1 if self.web is not None else 0,
            **self.variables,
        }


@dataclass
class ExchangeEntry:
    """One line of a case's exchange: a frame sent or received, or a runner note."""

    time: float
    conn: str
    direction: str  # "send", "recv", "note", "fail"
    text: str
    hex: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"t": round(self.time, 4), "conn": self.conn, "dir": self.direction, "text": self.text,
                "hex": self.hex}


@dataclass
class CaseResult:
    """The outcome of one case with everything a report shows."""

    case: Case
    outcome: str
    duration: float = 0.0
    reason: str = ""
    expected: list[Any] = field(default_factory=list)
    received: list[dict[str, Any]] = field(default_factory=list)
    exchange: list[ExchangeEntry] = field(default_factory=list)
    namespace: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome == FAILED

    def counts_as_failure(self, strict: bool) -> bool:
        """FAILED always; NON-STRICT too under ``--strict``."""
        return self.outcome == FAILED or (strict and self.outcome == NON_STRICT)

    def to_json(self) -> dict[str, Any]:
        case = self.case
        return {
            "id": case.id,
            "title": case.title,
            "group": case.group,
            "source": case.source,
            "section": case.section,
            "requirement": case.requirement,
            "quote": case.quote,
            "outcome": self.outcome,
            "duration": round(self.duration, 4),
            "reason": self.reason,
            "expected": self.expected,
            "received": self.received,
            "namespace": self.namespace,
            "exchange": [entry.to_json() for entry in self.exchange],
        }


class StepFailed(Exception):
    """The daemon did not do what a step expects."""

    def __init__(
        self, reason: str, expected: Optional[list[Any]] = None, received: Optional[list[dict[str, Any]]] = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.expected = expected or []
        self.received = received or []


class ConnectionEnded(Exception):
    """The daemon closed the connection (EOF or reset)."""


def _hex(data: bytes) -> str:
    shown = data[:HEX_SHOWN].hex(" ")
    if len(data) > HEX_SHOWN:
        shown += f" ... ({len(data)} bytes in all)"
    return shown


@dataclass
class Received:
    """A frame from the daemon: decoded, or the error that decoding it raised."""

    raw: bytes
    message: Optional[Message] = None
    error: Optional[str] = None

    def describe(self) -> dict[str, Any]:
        decoded: Any = describe_message(self.message) if self.message is not None else None
        return {"decoded": decoded, "error": self.error, "hex": _hex(self.raw)}

    def text(self) -> str:
        if self.message is not None:
            return json.dumps(describe_message(self.message), ensure_ascii=False)
        return f"undecodable frame: {self.error}"


class Connection:
    """One TCP connection of a case, with a jetwire stream decoder."""

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: CaseLog):
        self.name = name
        self.reader = reader
        self.writer = writer
        self.log = log
        self.decoder = Decoder(max_body=RECEIVE_MAX_BODY)
        self.ended = False
        self.broken: Optional[str] = None

    async def send(self, data: bytes, text: str, timeout: float) -> None:
        """Write ``data``; a daemon that already closed is noted, not an error here
        (the next expect step sees the CLOSE or the disconnect)."""
        self.log.add(self.name, "send", text, data)
        try:
            self.writer.write(data)
            await asyncio.wait_for(self.writer.drain(), timeout)
        except (ConnectionError, OSError) as exc:
            self.log.add(self.name, "note", f"write failed: {exc!r}")
        except TimeoutError:
            self.log.add(self.name, "note", f"write did not drain within {timeout} s (daemon not reading)")

    async def receive(self, deadline: float) -> Optional[Received]:
        """The next frame, or None when ``deadline`` (monotonic) passes first.

        Raises:
            ConnectionEnded: when the daemon closed the connection.
        """
        while True:
            if self.broken is not None:
                raise ConnectionEnded(self.broken)
            try:
                frame = self.decoder.next_frame()
            except RemoteProtocolError as exc:
                # Fatal: an unknown frame type or a body over our bound; nothing after
                # it can be framed (PROTOCOL.md 9.2 applies to us as receiver too).
                self.broken = f"daemon sent an unframeable stream: {exc.message}"
                self.log.add(self.name, "recv", self.broken)
                return Received(b"", None, self.broken)
            if frame is not None:
                ftype, body = frame
                raw = bytes([ftype]) + len(body).to_bytes(4, "big") + body
                try:
                    received = Received(raw, decode_body(ftype, body))
                except RemoteProtocolError as exc:
                    received = Received(raw, None, exc.message)
                self.log.add(self.name, "recv", received.text(), raw)
                return received
            if self.ended:
                raise ConnectionEnded("the daemon closed the connection")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                data = await asyncio.wait_for(self.reader.read(READ_SIZE), remaining)
            except TimeoutError:
                return None
            except (ConnectionError, OSError) as exc:
                data = b""
                self.log.add(self.name, "note", f"read failed: {exc!r}")
            if not data:
                self.ended = True
                self.log.add(self.name, "note", "connection closed by the daemon")
            else:
                self.decoder.receive_data(data)

    async def close(self, abort: bool = False) -> None:
        if abort:
            self.writer.transport.abort()
        else:
            self.writer.close()
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            await asyncio.wait_for(self.writer.wait_closed(), 2.0)


class CaseLog:
    """The exchange of one case, timestamped from its start."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.entries: list[ExchangeEntry] = []

    def add(self, conn: str, direction: str, text: str, raw: bytes = b"") -> None:
        self.entries.append(ExchangeEntry(time.monotonic() - self.start, conn, direction, text, _hex(raw)))


class CaseExecution:
    """Executes the steps of one case (PROTOCOL.md-neutral: the case says what to check)."""

    def __init__(self, case: Case, config: RunConfig, env: Env, namespace: str):
        self.case = case
        self.config = config
        self.env = env
        self.namespace = namespace
        self.log = CaseLog()
        self.conns: dict[str, Connection] = {}

    def _seconds(self, spec: Any, default: float) -> float:
        return float(evaluate(spec, self.env)) if spec is not None else default

    def _conn(self, step: Mapping[str, Any]) -> Connection:
        name = str(step.get("conn", "a"))
        if name not in self.conns:
            raise CaseError(f"connection {name!r} is not open")
        return self.conns[name]

    async def run(self, steps: list[dict[str, Any]]) -> None:
        for step in steps:
            await self.step(step)

    async def step(self, step: dict[str, Any]) -> None:
        op = step["op"]
        handler = getattr(self, f"op_{op}")
        try:
            await handler(step)
        except StepFailed as exc:
            exc.reason = f"step {op}" + (f" on {step.get('conn', 'a')}" if "conn" in step or op not in ("sleep", "http") else "") \
                + f": {exc.reason}"
            exc.requirement = step.get("requirement")  # type: ignore[attr-defined]
            raise

    async def op_connect(self, step: dict[str, Any]) -> None:
        name = str(step.get("conn", "a"))
        if name in self.conns:
            raise CaseError(f"connection {name!r} is already open")
        timeout = self._seconds(step.get("timeout"), self.config.timeout)
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.config.host, self.config.port, limit=READ_SIZE), timeout
            )
        except (OSError, TimeoutError) as exc:
            raise StepFailed(f"cannot connect to {self.config.host}:{self.config.port}: {exc!r}") from None
        conn = Connection(name, reader, writer, self.log)
        self.conns[name] = conn
        self.log.add(name, "note", "connected")
        expect_info = step.get("info", True)
        if expect_info is False:
            return
        # PROTOCOL.md 4.4: "The daemon MUST send INFO as its first frame on every
        # accepted connection" -- checked on every connect unless the case opts out.
        pattern = Pattern(expect_info if isinstance(expect_info, dict) else {"msg": "INFO", "major": 1})
        await self._expect_sequence(conn, [pattern], timeout)
        info = self.env.get(f"_info_{name}")
        if isinstance(info, Info):
            self.env["max_body"] = info.max_body
            self.env["features"] = info.features

    def _encode(self, spec: dict[str, Any]) -> tuple[bytes, str]:
        message = build_message(spec, self.env, self.namespace)
        try:
            data = encode(message)
        except JetError as exc:
            raise CaseError(f"cannot encode {spec}: {exc}") from None
        return data, json.dumps(describe_message(message), ensure_ascii=False)

    async def op_send(self, step: dict[str, Any]) -> None:
        conn = self._conn(step)
        if "message" in step:
            data, text = self._encode(step["message"])
        elif "messages" in step:
            # Several frames in one write (PROTOCOL.md 3: several frames in one read).
            encoded = [self._encode(spec) for spec in step["messages"]]
            data = b"".join(item[0] for item in encoded)
            text = " + ".join(item[1] for item in encoded)
        else:
            data = build_raw(step, self.env, self.namespace)
            text = "raw " + str(step.get("note", "bytes"))
        chunk = int(evaluate(step.get("chunk", 0), self.env))
        if chunk > 0:
            # PROTOCOL.md 3: frames split across any number of reads; pausing between
            # writes keeps the kernel from coalescing the pieces again.
            for offset in range(0, len(data), chunk):
                await conn.send(data[offset : offset + chunk], f"{text} [bytes {offset}..]", self.config.timeout)
                await asyncio.sleep(0.002)
            return
        await conn.send(data, text, self.config.timeout)

    async def op_http(self, step: dict[str, Any]) -> None:
        """One HTTP request to the daemon's HTTP listener (PROTOCOL.md 13) and a check of
        the response's status and headers. ``{web}``, ``{web_host}`` and ``{web_port}`` in
        the request's strings name the listener."""
        if self.config.web is None:
            raise CaseError("an http step needs --web HOST:PORT (add requires: web == 1)")
        web_host, web_port = self.config.web
        shown = f"[{web_host}]" if ":" in web_host else web_host
        names = {"web": f"{shown}:{web_port}", "web_host": shown, "web_port": str(web_port)}

        def fill(text: str) -> str:
            return _TEMPLATE.sub(lambda m: names.get(m.group(1), m.group(0)), text)

        request, expect = step["request"], step["expect"]
        lines = [f"{request.get('method', 'GET')} {fill(request.get('path', '/'))} HTTP/1.1"]
        if request.get("host", "{web}") is not None:
            lines.append(f"Host: {fill(request.get('host', '{web}'))}")
        if request.get("upgrade"):
            lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                      "Sec-WebSocket-Version: 13"]
        else:
            lines.append("Connection: close")
        lines += [f"{name}: {fill(value)}" for name, value in request.get("headers", [])]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        timeout = self._seconds(step.get("timeout"), self.config.timeout)
        self.log.add("http", "send", "\n".join(lines), data)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(web_host, web_port), timeout)
        except (OSError, TimeoutError) as exc:
            raise StepFailed(f"cannot connect to the HTTP listener {web_host}:{web_port}: {exc!r}") from None
        try:
            writer.write(data)
            head, body = await asyncio.wait_for(_read_http_response(reader), timeout)
        except asyncio.IncompleteReadError as exc:
            # Not an HTTP server (the jet port given as --web, say): it closed first.
            raise StepFailed(f"no HTTP response: the server closed after {len(exc.partial)} bytes "
                             f"without an HTTP head ({exc.partial[:16]!r})") from None
        except asyncio.LimitOverrunError:
            raise StepFailed("no HTTP response: no end of an HTTP head in the first 64 KiB") from None
        except (OSError, TimeoutError, ValueError) as exc:
            raise StepFailed(f"no HTTP response: {exc!r}") from None
        finally:
            writer.transport.abort()
        status_line, *header_lines = head.split("\r\n")
        self.log.add("http", "recv", head + ("\n\n" + body[:300].decode("utf-8", "replace") if body else ""))
        parts = status_line.split(" ", 2)
        received = [{"decoded": {"status_line": status_line, "headers": header_lines}}]
        if len(parts) < 2 or not (parts[1].isascii() and parts[1].isdigit()):
            raise StepFailed(f"not an HTTP response: {status_line!r}", [expect], received)
        fields: dict[str, list[str]] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            fields.setdefault(name.strip().lower(), []).append(value.strip())
        wanted = expect["status"] if isinstance(expect["status"], list) else [expect["status"]]
        if int(parts[1]) not in wanted:
            raise StepFailed(f"HTTP status {parts[1]}, expected {' or '.join(map(str, wanted))}", [expect], received)
        for name, pattern in expect.get("headers", {}).items():
            values = fields.get(name.lower())
            if pattern is None:
                if values:
                    raise StepFailed(f"header {name} must be absent, got {values}", [expect], received)
                continue
            if not values or len(values) > 1:
                raise StepFailed(f"header {name}: expected one, got {values or 'none'}", [expect], received)
            if isinstance(pattern, str) and values[0] != fill(pattern):
                raise StepFailed(f"header {name}: {values[0]!r}, expected {fill(pattern)!r}", [expect], received)
            if isinstance(pattern, dict):
                items = [item.strip() for item in values[0].split(";")]
                missing = [fill(p) for p in pattern["contains"] if fill(p) not in items]
                if missing:
                    raise StepFailed(f"header {name}: {values[0]!r} lacks {missing}", [expect], received)
        if "body_contains" in expect and fill(expect["body_contains"]).encode() not in body:
            raise StepFailed(f"the body lacks {expect['body_contains']!r}", [expect], received)

    async def op_assert(self, step: dict[str, Any]) -> None:
        if not evaluate(step["expr"], self.env):
            raise StepFailed(f"expected {step['expr']} to hold", [step["expr"]],
                             [{"decoded": {name: value for name, value in self.env.items()
                                           if isinstance(value, (int, float)) and not name.startswith("_")}}])

    async def op_expect(self, step: dict[str, Any]) -> None:
        conn = self._conn(step)
        specs = step.get("messages") or [step["message"]]
        patterns = [Pattern(spec) for spec in specs]
        timeout = self._seconds(step.get("timeout"), self.config.timeout)
        if step.get("skip_unmatched"):
            await self._expect_eventually(conn, patterns, timeout)
        elif step.get("unordered"):
            await self._expect_set(conn, patterns, timeout)
        else:
            await self._expect_sequence(conn, patterns, timeout)

    async def _next(self, conn: Connection, timeout: float, waiting_for: list[Pattern]) -> Received:
        try:
            received = await conn.receive(time.monotonic() + timeout)
        except ConnectionEnded as exc:
            raise StepFailed(f"{exc}, still expecting {len(waiting_for)} message(s)",
                             [p.spec for p in waiting_for]) from None
        if received is None:
            raise StepFailed(f"nothing received within {timeout:g} s, still expecting {len(waiting_for)} message(s)",
                             [p.spec for p in waiting_for])
        return received

    def _bind(self, conn: Connection, received: Received, captures: dict[str, Any]) -> None:
        self.env.update(captures)
        if isinstance(received.message, Info):
            self.env[f"_info_{conn.name}"] = received.message

    async def _expect_sequence(self, conn: Connection, patterns: list[Pattern], timeout: float) -> None:
        for index, pattern in enumerate(patterns):
            received = await self._next(conn, timeout, patterns[index:])
            if received.message is None:
                raise StepFailed(f"undecodable frame: {received.error}", [pattern.spec], [received.describe()])
            reason, captures = match_message(pattern, received.message, self.env, self.namespace)
            if reason is not None:
                where = f"message {index + 1} of {len(patterns)}: " if len(patterns) > 1 else ""
                raise StepFailed(where + reason, [pattern.spec], [received.describe()])
            self._bind(conn, received, captures)

    async def _expect_eventually(self, conn: Connection, patterns: list[Pattern], timeout: float) -> None:
        """Each pattern in order, passing over messages that match none (for example
        intermediate values a daemon may conflate, PROTOCOL.md 10.8)."""
        skipped = 0
        for index, pattern in enumerate(patterns):
            while True:
                received = await self._next(conn, timeout, patterns[index:])
                if received.message is not None:
                    reason, captures = match_message(pattern, received.message, self.env, self.namespace)
                    if reason is None:
                        self._bind(conn, received, captures)
                        break
                skipped += 1
        self.log.add(conn.name, "note", f"passed over {skipped} message(s) matching no pattern")

    async def _expect_set(self, conn: Connection, patterns: list[Pattern], timeout: float) -> None:
        remaining = list(patterns)
        while remaining:
            received = await self._next(conn, timeout, remaining)
            if received.message is None:
                raise StepFailed(f"undecodable frame: {received.error}", [p.spec for p in remaining],
                                 [received.describe()])
            reasons = []
            for pattern in remaining:
                reason, captures = match_message(pattern, received.message, self.env, self.namespace)
                if reason is None:
                    remaining.remove(pattern)
                    self._bind(conn, received, captures)
                    break
                reasons.append(reason)
            else:
                raise StepFailed(
                    "received a message matching none of the expected set: " + "; ".join(reasons),
                    [p.spec for p in remaining],
                    [received.describe()],
                )

    async def op_expect_silence(self, step: dict[str, Any]) -> None:
        conn = self._conn(step)
        duration = self._seconds(step.get("seconds"), 0.3)
        try:
            received = await conn.receive(time.monotonic() + duration)
        except ConnectionEnded as exc:
            raise StepFailed(f"expected {duration:g} s of silence, but {exc}") from None
        if received is not None:
            raise StepFailed(f"expected {duration:g} s of silence, received a frame",
                             ["(nothing)"], [received.describe()])

    async def op_expect_close(self, step: dict[str, Any]) -> None:
        conn = self._conn(step)
        timeout = self._seconds(step.get("timeout"), self.config.timeout)
        spec: dict[str, Any] = {"msg": "CLOSE"}
        if "status" in step:
            spec["status"] = step["status"]
        if "message" in step:
            spec["message"] = step["message"]
        # PROTOCOL.md 7.3: "The sender closes the connection right after sending it and
        # sends nothing more."
        await self._expect_sequence(conn, [Pattern(spec)], timeout)
        await self._expect_end(conn, timeout, "after its CLOSE")

    async def op_expect_disconnect(self, step: dict[str, Any]) -> None:
        conn = self._conn(step)
        await self._expect_end(conn, self._seconds(step.get("timeout"), self.config.timeout), "")

    async def _expect_end(self, conn: Connection, timeout: float, when: str) -> None:
        deadline = time.monotonic() + timeout
        try:
            received = await conn.receive(deadline)
        except ConnectionEnded:
            return
        if received is None:
            raise StepFailed(f"the daemon did not close the connection within {timeout:g} s {when}".rstrip(),
                             ["(disconnect)"])
        raise StepFailed(f"the daemon sent a frame {when} instead of closing".replace("  ", " "),
                         ["(disconnect)"], [received.describe()])

    async def op_disconnect(self, step: dict[str, Any]) -> None:
        conn = self._conn(step)
        del self.conns[conn.name]
        self.log.add(conn.name, "note", "disconnect" + (" (reset)" if step.get("abort") else ""))
        await conn.close(abort=bool(step.get("abort")))

    async def op_sleep(self, step: dict[str, Any]) -> None:
        seconds = self._seconds(step.get("seconds"), 0.1)
        self.log.add("-", "note", f"sleep {seconds:g} s")
        await asyncio.sleep(seconds)

    async def op_repeat(self, step: dict[str, Any]) -> None:
        count = int(evaluate(step["count"], self.env))
        var = str(step.get("var", "i"))
        start = int(evaluate(step.get("start", 0), self.env))
        for index in range(start, start + count):
            self.env[var] = index
            await self.run(step["steps"])

    async def op_assert_distinct(self, step: dict[str, Any]) -> None:
        names = [str(name) for name in step["vars"]]
        missing = [name for name in names if name not in self.env]
        if missing:
            raise CaseError(f"assert_distinct: {missing} not captured")
        values = [self.env[name] for name in names]
        if len(set(map(repr, values))) != len(values):
            shown = ", ".join(f"{name}={self.env[name]!r}" for name in names)
            raise StepFailed(f"expected distinct values, got {shown}", ["distinct"], [])

    async def close_all(self) -> None:
        for conn in list(self.conns.values()):
            await conn.close()
        self.conns.clear()


_TEMPLATE = re.compile(r"\{(web|web_host|web_port)\}")
MAX_HTTP_RESPONSE = 1 << 20  # bytes of an HTTP response the web cases read at most


async def _read_http_response(reader: asyncio.StreamReader) -> tuple[str, bytes]:
    """The head of an HTTP response and its body: up to the end of the connection, or
    nothing after a 101 (the connection is a jet connection from there on)."""
    head = (await reader.readuntil(b"\r\n\r\n"))[:-4].decode("latin-1")
    if head.startswith("HTTP/1.1 101"):
        return head, b""
    body = b""
    while len(body) < MAX_HTTP_RESPONSE and (chunk := await reader.read(65536)):
        body += chunk
    return head, body


def _failure_outcome(case: Case, step_requirement: Optional[str]) -> str:
    requirement = step_requirement or case.requirement
    if requirement == "SHOULD":
        return NON_STRICT
    if requirement == "INFORMATIONAL":
        return INFORMATIONAL
    return FAILED


async def run_case(case: Case, config: RunConfig, index: int, info_env: Mapping[str, Any]) -> CaseResult:
    """Run one case and classify it (never raises for daemon misbehaviour)."""
    namespace = f"cf.{config.run_token}.{index}/"
    env: Env = {**config.base_env(), **info_env, "ns_len": len(namespace.encode())}
    result = CaseResult(case, OK, namespace=namespace)
    for condition in case.requires:
        try:
            met = bool(evaluate(condition, env))
        except CaseError as exc:
            met, condition = False, f"{condition} ({exc})"
        if not met:
            result.outcome = SKIPPED
            result.reason = f"requires {condition}"
            if condition == "auth_required == 1":
                result.reason += (" (the daemon under test has no authentication: start it with"
                                  " --auth spec/conformance/users.toml to run these)")
            if condition == "web == 1":
                result.reason += " (give the daemon's HTTP listener with --web HOST:PORT to run the web cases)"
            return result
    execution = CaseExecution(case, config, env, namespace)
    start = time.monotonic()
    try:
        await asyncio.wait_for(execution.run(case.steps), config.case_timeout)
        if case.requirement == INFORMATIONAL:
            result.outcome = INFORMATIONAL
            result.reason = "observed as described"
    except StepFailed as exc:
        result.outcome = _failure_outcome(case, getattr(exc, "requirement", None))
        result.reason = exc.reason
        result.expected = exc.expected
        result.received = exc.received
        execution.log.add("-", "fail", exc.reason)
    except CaseError as exc:
        result.outcome = FAILED
        result.reason = f"case error (fix the case file): {exc}"
        execution.log.add("-", "fail", result.reason)
    except TimeoutError:
        result.outcome = FAILED
        result.reason = f"the case did not finish within {config.case_timeout:g} s"
        execution.log.add("-", "fail", result.reason)
    finally:
        await execution.close_all()
    result.duration = time.monotonic() - start
    result.exchange = execution.log.entries
    return result


async def probe(config: RunConfig) -> dict[str, Any]:
    """Connect once and read the daemon's INFO (PROTOCOL.md 4.4): its ``max_body``,
    ``features`` and ``name`` become variables every case can use.

    Raises:
        ConnectionError: if the daemon cannot be reached or sends no valid INFO.
    """
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(config.host, config.port), config.timeout)
    except (OSError, TimeoutError) as exc:
        raise ConnectionError(f"cannot connect to {config.host}:{config.port}: {exc}") from None
    decoder = Decoder(max_body=RECEIVE_MAX_BODY)
    try:
        deadline = time.monotonic() + config.timeout
        while True:
            try:
                message = decoder.next_message()
            except RemoteProtocolError as exc:
                raise ConnectionError(f"the daemon's first frame is not valid: {exc.message}") from None
            if message is not None:
                break
            data = await asyncio.wait_for(reader.read(READ_SIZE), max(0.0, deadline - time.monotonic()))
            if not data:
                raise ConnectionError("the daemon closed the connection without sending INFO")
            decoder.receive_data(data)
    except TimeoutError:
        raise ConnectionError(f"no INFO within {config.timeout:g} s") from None
    finally:
        writer.close()
        with contextlib.suppress(TimeoutError, OSError):
            await asyncio.wait_for(writer.wait_closed(), 2.0)
    if not isinstance(message, Info):
        raise ConnectionError(f"the daemon's first frame is {type(message).__name__}, not INFO")
    return {
        "max_body": message.max_body,
        "features": message.features,
        "info_major": message.major,
        # PROTOCOL.md 4.4, 15: the cases of 14-auth need a daemon that requires it.
        "auth_required": 1 if message.features & FEATURE_AUTH_REQUIRED else 0,
    }


async def run_cases(cases: list[Case], config: RunConfig) -> list[CaseResult]:
    """Run ``cases``: the independent ones concurrently (each in its own key namespace,
    at most ``config.jobs`` at once), then the ``exclusive`` ones one by one.

    Returns the results in the order of ``cases``.

    Raises:
        ConnectionError: if the daemon cannot be reached at all.
    """
    info_env = await probe(config)
    results: dict[int, CaseResult] = {}
    limit = asyncio.Semaphore(max(1, config.jobs))

    async def one(index: int, case: Case) -> None:
        async with limit:
            results[index] = await run_case(case, config, index, info_env)

    shared = [(i, case) for i, case in enumerate(cases) if not case.exclusive]
    await asyncio.gather(*(one(i, case) for i, case in shared))
    for index, case in enumerate(cases):
        if case.exclusive:
            results[index] = await run_case(case, config, index, info_env)
    return [results[i] for i in range(len(cases))]


def status_name(code: int) -> str:
    """Name of a status byte for reports."""
    try:
        return Status(code).name
    except ValueError:
        return f"0x{code:02X}"
