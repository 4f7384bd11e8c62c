"""``jet-conformance peer --agent CMD``: conformance of a *peer* (issue 17).

Like Autobahn|Testsuite's fuzzingserver, the suite plays the daemon: for every case it
listens on 127.0.0.1, starts the agent (``CMD HOST PORT``, spec/conformance/PEER.md),
and the agent's peer connects to it. A small scripted daemon answers what the agent's
script asks for (INFO, ADD_STATE, ADD_METHOD, FETCH_STATES, its set and call) and the
case adds its own behaviour: frames in one segment or split at every byte, routed
requests of every kind, bad frames, CLOSE, a dropped connection, a small ``max_body``.
It checks what the peer sends back and what the agent prints.

On every frame of every case it also checks the peer's standing obligations
(PROTOCOL.md 3 and 11): no body above the ``max_body`` we announced, no FETCH_* events,
no RESPONSE that answers nothing we routed, nothing undecodable. A breach fails the case
whatever its own requirement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import json
import shlex
import sys
import time
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import Optional

from jetwire import FEATURE_LIMITS
from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Close
from jetwire import Decoder
from jetwire import FetchAdd
from jetwire import FetchChange
from jetwire import FetchRemove
from jetwire import FetchStates
from jetwire import GetState
from jetwire import Info
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import decode_body
from jetwire import encode
from jetwire.errors import RemoteProtocolError

from .agents.script import METHOD_KEY
from .agents.script import SET_VALUE
from .agents.script import STATE_KEY
from .cases import Case
from .cases import describe_message
from .report import add_report_options
from .report import write_case_list
from .report import write_console
from .report import write_report_files
from .runner import FAILED
from .runner import NON_STRICT
from .runner import OK
from .runner import CaseLog
from .runner import CaseResult
from .runner import RunConfig
from .runner import StepFailed

__all__ = ["PEER_CASES", "PeerCase", "PeerRunConfig", "main", "run_peer_cases"]

# PEER.md: the agent's script (agents/script.py) is fixed so that every case knows what
# to expect.
DAEMON_MAX_BODY = 1 << 20
LIMITS_KEY_LENGTH, LIMITS_ROUTE_TIMEOUT_MS = 200, 2500  # announced by peer.info.limits
FIRST_FETCH_ID = 3
AT_ONCE = 2.0  # "at once": well below the agent's own request timeout of 10 s (PEER.md)
RECEIVE_MAX_BODY = 64 * 1024 * 1024


class MustViolation(StepFailed):
    """A standing obligation of every peer was breached: FAILED in any case."""


class PeerEnded(Exception):
    """The peer closed its connection."""


@dataclass
class PeerRunConfig(RunConfig):
    """A peer run: the agent command instead of a daemon address."""

    agent: list[str] = field(default_factory=list)
    agent_timeout: float = 10.0


@dataclass
class PeerCase:
    """One scripted-daemon case: metadata (as in the daemon suite) and its script."""

    id: str
    title: str
    section: str
    requirement: str
    quote: str
    script: Callable[[Session], Awaitable[None]]
    notes: str = ""

    def as_case(self) -> Case:
        return Case(self.id, self.title, self.section, self.requirement, self.quote, [], "peer",
                    "tools/conformance/peer.py", notes=self.notes)


class Session:
    """One case: our listening socket, the agent process, its one connection, and the
    scripted daemon that answers the agent's script."""

    def __init__(self, config: PeerRunConfig, log: CaseLog) -> None:
        self.config = config
        self.log = log
        self.timeout = config.timeout
        self.split = False  # write every byte of ours separately
        self.send_info = True
        self.info_features = 0  # FEATURE_LIMITS: answer a peer INFO that asks (PROTOCOL.md 4.4.1)
        self.daemon_max_body = DAEMON_MAX_BODY
        self.extra_after: dict[str, list[Message]] = {}  # "ADD_STATE"/"ADD_METHOD" -> sent with the OK
        self.fetch_adds: list[tuple[str, int]] = []
        # How we answer the agent's own SET data/x and CALL data/echo: "ok" or "hold".
        self.client_policy = "ok"
        self.held: list[Message] = []
        self.lines: list[str] = []
        self.peer_info: Optional[Info] = None
        self.peer_close: Optional[Close] = None
        self.ended = False
        self.outstanding: set[int] = set()  # ids we routed to the peer, not answered yet
        self.answers: dict[int, Response] = {}
        self.owner_log: list[tuple[str, Any]] = []  # ("notify", value) / ("response", id) in arrival order
        self.server: Optional[asyncio.Server] = None
        self.proc: Optional[asyncio.subprocess.Process] = None
        self.reader: Optional[asyncio.StreamReader] = None
        self.writer: Optional[asyncio.StreamWriter] = None
        self.connected: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.decoder = Decoder(max_body=RECEIVE_MAX_BODY)
        self.tasks: list[asyncio.Task[None]] = []
        self.stderr = b""

    # --- processes and sockets ---------------------------------------------------------

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.log.add("-", "note", f"listening on 127.0.0.1:{port}; starting {shlex.join(self.config.agent)}")
        self.proc = await asyncio.create_subprocess_exec(
            *self.config.agent, "127.0.0.1", str(port),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        self.tasks.append(asyncio.get_running_loop().create_task(self._read_lines()))
        try:
            await asyncio.wait_for(asyncio.shield(self.connected), self.config.agent_timeout)
        except TimeoutError:
            raise StepFailed(f"the agent did not connect within {self.config.agent_timeout:g} s") from None

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.connected.done():
            writer.close()  # PEER.md: one connection per agent run
            return
        self.reader, self.writer = reader, writer
        self.log.add("peer", "note", "the peer connected")
        if self.send_info:
            await self.send(Info("conformance", self.daemon_max_body, self.info_features))
        self.connected.set_result(None)

    async def _read_lines(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while line := await self.proc.stdout.readline():
            text = line.decode("utf-8", "replace").rstrip("\r\n")
            self.lines.append(text)
            self.log.add("agent", "note", f"agent: {text}")

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.server is not None:
            self.server.close()
        proc = self.proc
        if proc is not None:
            try:
                await asyncio.wait_for(proc.wait(), 5.0)
            except TimeoutError:
                self.log.add("-", "note", "the agent did not exit within 5 s of the end of the case: killed")
                proc.kill()
                await proc.wait()
            if proc.stderr is not None:
                self.stderr = await proc.stderr.read()
            if self.stderr.strip():
                self.log.add("agent", "note", "agent stderr: " + self.stderr.decode("utf-8", "replace")[-2000:])
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 2.0)

    # --- sending ------------------------------------------------------------------------

    async def send(self, *messages: Message, raw: bytes = b"", text: str = "") -> None:
        """Write ``messages`` (then ``raw``) in ONE write, or byte by byte when split."""
        assert self.writer is not None
        data = b"".join(encode(message) for message in messages) + raw
        for message in messages:
            if isinstance(message, (SetState, CallMethod, GetState)) and message.id is not None:
                self.outstanding.add(message.id)
            self.log.add("peer", "send", json.dumps(describe_message(message), ensure_ascii=False), encode(message))
        if raw:
            self.log.add("peer", "send", text or "raw bytes", raw)
        try:
            if self.split:
                for index in range(len(data)):
                    self.writer.write(data[index:index + 1])
                    await self.writer.drain()
            else:
                self.writer.write(data)
                await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            self.log.add("peer", "note", f"write failed: {exc!r}")

    # --- receiving and the scripted daemon -------------------------------------------------

    async def receive(self, timeout: float) -> Optional[Message]:
        """The peer's next message (None when ``timeout`` passes), after the standing checks.

        Raises:
            PeerEnded: the peer closed the connection.
            MustViolation: a standing obligation was breached.
        """
        assert self.reader is not None
        deadline = time.monotonic() + timeout
        while True:
            try:
                frame = self.decoder.next_frame()
            except RemoteProtocolError as exc:
                raise MustViolation(f"the peer sent an unframeable stream: {exc.message}") from None
            if frame is not None:
                ftype, body = frame
                raw = bytes([ftype]) + len(body).to_bytes(4, "big") + body
                try:
                    message = decode_body(ftype, body)
                except RemoteProtocolError as exc:
                    self.log.add("peer", "recv", f"undecodable: {exc.message}", raw)
                    raise MustViolation(f"the peer sent a malformed frame: {exc.message}") from None
                self.log.add("peer", "recv", json.dumps(describe_message(message), ensure_ascii=False), raw)
                if len(body) > self.daemon_max_body:
                    raise MustViolation(f"PROTOCOL.md 3: the peer sent a body of {len(body)} bytes, above the "
                                        f"max_body {self.daemon_max_body} we announced")
                return message
            if self.ended:
                raise PeerEnded()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                data = await asyncio.wait_for(self.reader.read(256 * 1024), remaining)
            except TimeoutError:
                return None
            except (ConnectionError, OSError):
                data = b""
            if not data:
                self.ended = True
                self.log.add("peer", "note", "the peer closed the connection")
            else:
                self.decoder.receive_data(data)

    async def handle(self, message: Message) -> None:
        """What the scripted daemon does with one message from the peer."""
        if isinstance(message, Info):
            self.peer_info = message
            if self.info_features & FEATURE_LIMITS and message.features & FEATURE_LIMITS:
                # PROTOCOL.md 4.4.1: the limits, and two bytes of a field from a later minor
                # version, which a peer that asked MUST ignore.
                limits = encode(Info("conformance", self.daemon_max_body, self.info_features,
                                     max_key_length=LIMITS_KEY_LENGTH, route_timeout_ms=LIMITS_ROUTE_TIMEOUT_MS))
                later = limits[:1] + (len(limits) - 5 + 2).to_bytes(4, "big") + limits[5:] + b"\x00\x2a"
                await self.send(raw=later, text="INFO with the limits extension and 2 bytes of a later field")
        elif isinstance(message, (FetchAdd, FetchChange, FetchRemove)):
            raise MustViolation("PROTOCOL.md 11: the peer sent a FETCH_* event (a peer MUST NOT send FETCH_* events)")
        elif isinstance(message, Response):
            if message.id not in self.outstanding:
                raise MustViolation(f"PROTOCOL.md 11: the peer sent a RESPONSE with id {message.id}, which answers no "
                                    "request we routed to it (a peer MUST NOT send RESPONSE frames except to answer "
                                    "routed requests)")
            self.outstanding.discard(message.id)
            self.answers[message.id] = message
            self.owner_log.append(("response", message.id))
        elif isinstance(message, Close):
            self.peer_close = message
        elif isinstance(message, NotifyState):
            self.owner_log.append(("notify", message.value))
            if message.id is not None:
                await self.send(Response(message.id, Status.OK))
        elif isinstance(message, (AddState, AddMethod, FetchStates)) and message.id is None:
            raise MustViolation(f"the peer sent {type(message).__name__} without an id")
        elif isinstance(message, AddState):
            assert message.id is not None
            await self.send(Response(message.id, Status.OK), *self.extra_after.get("ADD_STATE", []))
        elif isinstance(message, AddMethod):
            assert message.id is not None
            await self.send(Response(message.id, Status.OK), *self.extra_after.get("ADD_METHOD", []))
        elif isinstance(message, FetchStates):
            assert message.id is not None
            adds = [FetchAdd(FIRST_FETCH_ID, key, Value.of(value)) for key, value in self.fetch_adds]
            # PROTOCOL.md 10.5: the OK first, then the initial adds -- in one write.
            await self.send(Response(message.id, Status.OK, fetch_id=FIRST_FETCH_ID), *adds)
        elif isinstance(message, (SetState, CallMethod)) and message.id is not None:
            if self.client_policy == "hold":
                self.held.append(message)
            elif isinstance(message, SetState):
                await self.send(Response(message.id, Status.OK, Value.of(SET_VALUE)))
            else:
                await self.send(Response(message.id, Status.OK, message.value))
        elif hasattr(message, "id") and message.id is not None:
            await self.send(Response(message.id, Status.NOT_FOUND, message="not part of the agent script"))

    async def until(self, condition: Callable[[], bool], timeout: float, what: str,
                    expected: Any = None) -> None:
        """Run the scripted daemon until ``condition()`` holds.

        Raises:
            StepFailed: ``timeout`` passed first, or the peer closed while we wait.
        """
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StepFailed(f"{what}: not within {timeout:g} s", [expected or what], self._observed())
            try:
                message = await self.receive(min(remaining, 0.05))
            except PeerEnded:
                await asyncio.sleep(min(remaining, 0.05))  # the agent may still print
                if condition():
                    return
                if time.monotonic() >= deadline or self.proc is None or self.proc.returncode is not None:
                    raise StepFailed(f"{what}: the peer closed the connection first", [expected or what],
                                     self._observed()) from None
                continue
            if message is not None:
                await self.handle(message)

    def _observed(self) -> list[dict[str, Any]]:
        return [{"agent_lines": self.lines[-20:]}]

    def line(self, prefix: str) -> Optional[str]:
        return next((line for line in self.lines if line.startswith(prefix)), None)

    async def expect_line(self, prefix: str, timeout: Optional[float] = None) -> str:
        await self.until(lambda: self.line(prefix) is not None, timeout or self.timeout,
                         f"the agent prints a line starting {prefix!r}", f"agent: {prefix}...")
        found = self.line(prefix)
        assert found is not None
        return found

    async def expect_answer(self, rid: int, timeout: Optional[float] = None) -> Response:
        await self.until(lambda: rid in self.answers, timeout or self.timeout,
                         f"the peer answers the routed request {rid}", f"RESPONSE id {rid}")
        return self.answers[rid]

    async def expect_status(self, rid: int, status: Status, what: str) -> Response:
        """The peer's answer to routed request ``rid`` (``what``, for the failure); the
        step fails unless its status is ``status``."""
        response = await self.expect_answer(rid)
        if response.status is not status:
            raise StepFailed(f"{what} was not answered {status.name}", [status.name], [describe_message(response)])
        return response

    async def expect_end(self, timeout: Optional[float] = None) -> None:
        """The peer closes the connection; nothing but a CLOSE may come before."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StepFailed("the peer did not close the connection", ["disconnect"], self._observed())
            try:
                message = await self.receive(remaining)
            except PeerEnded:
                return
            if message is None:
                continue
            if isinstance(message, Close):
                self.peer_close = message
                continue
            raise StepFailed(f"the peer sent {type(message).__name__} where it must only close",
                             ["nothing, then a disconnect"], [describe_message(message)])

    async def start_and_handshake(self) -> None:
        await self.start()
        await self.expect_line("ready")

    async def finish(self) -> None:
        """End a case that left the peer connected: CLOSE OK (as a daemon shutting down)."""
        if not self.ended:
            await self.send(Close(Status.OK, "shutting down"))
            with contextlib.suppress(StepFailed):
                await self.expect_end(3.0)


# --- checks the cases share ---------------------------------------------------------------


async def routed_set(s: Session, rid: int, value: int) -> None:
    """Route a set of the agent's state and check the owner's answer (PROTOCOL.md 10.3, 11)."""
    mark = len(s.owner_log)
    await s.send(SetState(rid, STATE_KEY, Value.of(value)))
    await check_set_answer(s, rid, value, mark)


async def check_set_answer(s: Session, rid: int, value: int, mark: int) -> None:
    response = await s.expect_answer(rid)
    if response.status is not Status.OK or response.value != Value.of(value):
        raise StepFailed(f"the routed set {rid} was answered {response.status.name}", [f"OK INT64 {value}"],
                         [describe_message(response)])
    since = s.owner_log[mark:]
    if ("notify", Value.of(value)) not in since[: since.index(("response", rid))]:
        raise StepFailed(f"the owner answered the set {rid} OK without a NOTIFY_STATE of {value} before it",
                         ["NOTIFY_STATE agent/state, then RESPONSE OK"], [{"owner_frames": repr(since)}])


async def routed_call(s: Session, rid: int, arg: str) -> None:
    await s.send(CallMethod(rid, METHOD_KEY, Value.of(arg)))
    await check_call_answer(s, rid, arg)


async def check_call_answer(s: Session, rid: int, arg: str) -> None:
    response = await s.expect_answer(rid)
    if response.status is not Status.OK or response.value != Value.of(arg):
        raise StepFailed(f"the routed call {rid} was not answered OK with its argument", [f"OK STRING {arg!r}"],
                         [describe_message(response)])


async def client_requests_answered(s: Session) -> None:
    await s.expect_line("set ")
    await s.expect_line("call ")


def frame(ftype: int, body: bytes) -> bytes:
    return bytes([ftype]) + len(body).to_bytes(4, "big") + body


def str16(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(2, "big") + data


# --- the cases ------------------------------------------------------------------------------


async def case_fetch_adds_in_ok_segment(s: Session) -> None:
    s.fetch_adds = [("data/a", 1), ("data/b", 2)]
    await s.start_and_handshake()
    await s.expect_line("event add data/a 1")
    await s.expect_line("event add data/b 2")
    await client_requests_answered(s)
    await s.finish()


async def case_routed_in_ok_segment(s: Session) -> None:
    s.extra_after = {"ADD_STATE": [SetState(0x10, STATE_KEY, Value.of(5))],
                     "ADD_METHOD": [CallMethod(0x11, METHOD_KEY, Value.of("hi"))]}
    await s.start_and_handshake()
    await check_set_answer(s, 0x10, 5, 0)
    await check_call_answer(s, 0x11, "hi")
    await client_requests_answered(s)
    await s.finish()


async def case_split_every_byte(s: Session) -> None:
    s.split = True
    s.fetch_adds = [("data/a", 1)]
    await s.start_and_handshake()
    await s.expect_line("event add data/a 1")
    await client_requests_answered(s)
    await routed_set(s, 0x12, 6)
    await routed_call(s, 0x13, "split")
    await s.finish()


async def case_notify_before_ok(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    await routed_set(s, 0x20, 9)
    await s.finish()


async def case_answers_every_request(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    mark = len(s.owner_log)
    routed: list[Message] = []
    for n in range(8):
        routed += [SetState(0x100 + n, STATE_KEY, Value.of(100 + n)), CallMethod(0x200 + n, METHOD_KEY, Value.of(f"c{n}"))]
    await s.send(*routed)  # pipelined in one write
    for n in range(8):
        await check_set_answer(s, 0x100 + n, 100 + n, mark)
        await check_call_answer(s, 0x200 + n, f"c{n}")
    await s.finish()


async def case_ids_per_direction(s: Session) -> None:
    s.client_policy = "hold"
    await s.start_and_handshake()
    await s.until(lambda: bool(s.held), s.timeout, "the agent sends its SET_STATE data/x")
    own = s.held.pop()
    assert own.id is not None  # type: ignore[attr-defined]
    rid = own.id  # type: ignore[attr-defined]
    # The same id, in the other direction, while the peer's own request is pending.
    await routed_set(s, rid, 11)
    if s.line("set ") is not None:
        raise StepFailed(f"the peer took our RESPONSE to its routed request {rid} for its own request {rid}",
                         ["set still pending"], [{"agent_lines": s.lines[-5:]}])
    s.client_policy = "ok"
    await s.send(Response(rid, Status.OK, Value.of(SET_VALUE)))
    await s.expect_line(f"set ok {SET_VALUE}")
    await s.expect_line("call ")
    await s.finish()


async def case_other_function(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    await s.send(GetState(0x30, STATE_KEY))
    await s.expect_status(0x30, Status.UNKNOWN_FUNCTION, "a routed GET_STATE")
    await routed_call(s, 0x31, "still-open")
    await s.finish()


async def case_malformed_request(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    # id 0x40: SET_STATE whose key claims 200 bytes but has 3; id 0x41: function 0x7E.
    bad = frame(1, (0x40).to_bytes(4, "big") + b"\x03" + b"\x00\xc8abc")
    unknown = frame(1, (0x41).to_bytes(4, "big") + b"\x7e" + str16(STATE_KEY))
    s.outstanding |= {0x40, 0x41}
    await s.send(raw=bad + unknown, text="REQUEST 0x40 SET_STATE with a lying key length; REQUEST 0x41 function 0x7E")
    for rid, status in ((0x40, Status.MALFORMED), (0x41, Status.UNKNOWN_FUNCTION)):
        await s.expect_status(rid, status, f"the bad routed request {rid}")
    await routed_call(s, 0x42, "still-open")
    await s.finish()


async def case_unknown_event(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    s.outstanding.add(0x50)
    await s.send(raw=frame(3, b"\x7f\x01\x02\x03") + encode(CallMethod(0x50, METHOD_KEY, Value.of("after"))),
                 text="EVENT code 0x7F, then CALL_METHOD 0x50 in the same write")
    await s.until(lambda: 0x50 in s.answers or s.peer_close is not None or s.ended, s.timeout,
                  "the peer skips the unknown event (answers the call after it) or closes")
    if 0x50 in s.answers:
        await check_call_answer(s, 0x50, "after")
        await s.finish()
        return
    if s.peer_close is None or s.peer_close.status is not Status.UNKNOWN_FUNCTION:
        raise StepFailed("the peer closed without CLOSE UNKNOWN_FUNCTION", ["CLOSE UNKNOWN_FUNCTION"],
                         [{"close": describe_message(s.peer_close) if s.peer_close else None}])
    await s.expect_end()


async def _expect_fatal(s: Session, status: Status, trigger: bytes, text: str) -> None:
    s.outstanding.add(0x60)
    await s.send(raw=trigger + encode(CallMethod(0x60, METHOD_KEY, Value.of("must-not-run"))), text=text)
    await s.until(lambda: s.peer_close is not None or s.ended or 0x60 in s.answers, s.timeout,
                  f"the peer sends CLOSE {status.name}")
    if 0x60 in s.answers:
        raise StepFailed("the peer read on after a fatal error (it answered the call that followed)",
                         [f"CLOSE {status.name}"], [describe_message(s.answers[0x60])])
    if s.peer_close is None or s.peer_close.status is not status:
        raise StepFailed(f"the peer did not send CLOSE {status.name}", [f"CLOSE {status.name}"],
                         [{"close": describe_message(s.peer_close) if s.peer_close else None}])
    await s.expect_end()


async def case_unknown_frame_type(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    await _expect_fatal(s, Status.MALFORMED, frame(9, b"\x00\x00"), "a frame of type 0x09")


async def case_malformed_fetch_event(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    # A FETCH_ADD of our fetch whose INT64 value is 3 bytes long (5.3: MALFORMED).
    body = b"\x81" + FIRST_FETCH_ID.to_bytes(4, "big") + str16("data/bad") + b"\x02\x00\x00\x00\x03\x00\x00\x01"
    await _expect_fatal(s, Status.MALFORMED, frame(3, body), "a FETCH_ADD whose INT64 value has 3 bytes")


async def case_fire_and_forget_set(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    mark = len(s.owner_log)
    await s.send(SetState(None, STATE_KEY, Value.of(12)), CallMethod(None, METHOD_KEY, Value.of("ff")))
    await s.until(lambda: ("notify", Value.of(12)) in s.owner_log[mark:], s.timeout,
                  "the owner notifies the value of a SET_STATE event", "NOTIFY_STATE agent/state INT64 12")
    # An EVENT gets no RESPONSE: one now would be stray (Session.handle fails the case).
    await routed_call(s, 0x80, "after")
    await s.finish()


async def case_body_over_peer_max(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    if s.peer_info is None:
        raise StepFailed("the peer sent no INFO, so it announced no max_body to exceed", ["INFO"], [])
    length = s.peer_info.max_body + 1
    await _expect_fatal(s, Status.TOO_LARGE, bytes([3]) + length.to_bytes(4, "big") + b"\x82",
                        f"an EVENT header announcing {length} bytes (the peer's max_body + 1)")


async def case_max_body_respected(s: Session) -> None:
    s.daemon_max_body = 64
    await s.start_and_handshake()
    await s.expect_line(f"set ok {SET_VALUE}")
    # The call's body (about 120 bytes) must not be sent: the agent reports an error.
    await s.expect_line("call error")
    await s.finish()


async def case_close_fails_pending(s: Session) -> None:
    s.client_policy = "hold"
    await s.start_and_handshake()
    await s.until(lambda: bool(s.held), s.timeout, "the agent sends its SET_STATE data/x")
    await s.send(Close(Status.OVERLOADED, "conformance: closing with your set pending"))
    await s.expect_end()
    await s.expect_line("set error", AT_ONCE)


async def case_drop_fails_pending(s: Session) -> None:
    s.client_policy = "hold"
    await s.start_and_handshake()
    await s.until(lambda: bool(s.held), s.timeout, "the agent sends its SET_STATE data/x")
    assert s.writer is not None
    s.log.add("peer", "note", "resetting the connection")
    s.writer.transport.abort()
    s.ended = True
    await s.expect_line("set error", AT_ONCE)


async def case_info_limits(s: Session) -> None:
    s.info_features = FEATURE_LIMITS
    await s.start_and_handshake()
    await s.finish()


async def case_first_frame_not_info(s: Session) -> None:
    s.send_info = False
    await s.start()
    await s.send(FetchAdd(99, "data/z", Value.of(1)), Info("conformance", DAEMON_MAX_BODY, 0))
    await s.until(lambda: s.peer_close is not None or s.ended, AT_ONCE, "the peer sends CLOSE MALFORMED")
    if s.peer_close is None or s.peer_close.status is not Status.MALFORMED:
        raise StepFailed("the peer did not send CLOSE MALFORMED", ["CLOSE MALFORMED"],
                         [{"close": describe_message(s.peer_close) if s.peer_close else None}])
    await s.expect_end()


async def _bad_answer_to_set(s: Session, body_tail: bytes, text: str) -> None:
    s.client_policy = "hold"
    await s.start_and_handshake()
    await s.until(lambda: bool(s.held), s.timeout, "the agent sends its SET_STATE data/x")
    rid = s.held.pop().id  # type: ignore[attr-defined]
    s.client_policy = "ok"
    await s.send(raw=frame(2, rid.to_bytes(4, "big") + b"\x00" + body_tail), text=text)
    await s.expect_line("set ", AT_ONCE + 0.5)
    if not str(s.line("set ")).startswith("set error MALFORMED"):
        raise StepFailed("the set did not fail with MALFORMED", ["set error MALFORMED"], [{"agent": s.line("set ")}])
    await s.expect_line("call ")
    await s.finish()


async def case_malformed_response(s: Session) -> None:
    await _bad_answer_to_set(s, b"\x00\x01", "RESPONSE OK with a 2-byte payload (PROTOCOL.md 4.2: MALFORMED)")


async def case_wrong_shape_response(s: Session) -> None:
    await _bad_answer_to_set(s, b"\x00\x00\x00\x03", "RESPONSE OK with a fetch_id to a SET_STATE")


async def case_quiet_owner(s: Session) -> None:
    await s.start_and_handshake()
    await client_requests_answered(s)
    await routed_set(s, 0x70, 1)
    await routed_call(s, 0x71, "q")
    # Listen a while: a stray RESPONSE or a FETCH_* event fails the case (Session.handle).
    with contextlib.suppress(StepFailed):
        await s.until(lambda: False, 0.5, "silence")
    await s.finish()


Q_SPLIT = "A receiver MUST accept frames split across any number of reads and several frames in one read."
Q_ANSWER = "An owner MUST answer every routed REQUEST (section 10.3)"
Q_FATAL = ("Fatal, as in section 9.2: the peer MUST send CLOSE (MALFORMED, TOO_LARGE for the length) and close, "
           "and MUST NOT read further frames.")
Q_PENDING = "a peer MUST fail them at once (not at their timeout), reporting the CLOSE's status if there was one."

PEER_CASES: list[PeerCase] = [
    PeerCase("peer.fetch.adds-in-ok-segment", "initial FETCH_ADDs in the same segment as FETCH_STATES' OK are "
             "delivered", "10.5", "MUST", "The OK response to FETCH_STATES comes first; then one FETCH_ADD for every",
             case_fetch_adds_in_ok_segment),
    PeerCase("peer.owner.routed-in-ok-segment", "a routed set and call in the same segment as ADD_STATE's and "
             "ADD_METHOD's OK are answered", "11", "MUST", Q_ANSWER, case_routed_in_ok_segment),
    PeerCase("peer.framing.split-every-byte", "everything we send arrives one byte per write", "3", "MUST",
             Q_SPLIT, case_split_every_byte),
    PeerCase("peer.owner.notify-before-ok", "a routed set: NOTIFY_STATE of the value, then OK with it", "11",
             "MUST", "An owner that accepts a set MUST send NOTIFY_STATE with the complete new value before it "
             "answers OK", case_notify_before_ok),
    PeerCase("peer.owner.answers-every-request", "8 sets and 8 calls pipelined in one write: each answered once",
             "11", "MUST", Q_ANSWER, case_answers_every_request),
    PeerCase("peer.ids.per-direction", "a routed request reusing the id of the peer's own pending request",
             "11.3", "MUST", "the same number may be pending in both at once.", case_ids_per_direction),
    PeerCase("peer.routed.other-function", "a routed GET_STATE is answered UNKNOWN_FUNCTION, the connection "
             "stays", "11.1", "MUST", "a peer MUST answer it UNKNOWN_FUNCTION and keep the connection open.",
             case_other_function),
    PeerCase("peer.routed.malformed", "a malformed routed REQUEST is answered MALFORMED (UNKNOWN_FUNCTION for "
             "an unknown function), the connection stays", "11.1", "MUST",
             "the owner MUST answer a RESPONSE with that id and status MALFORMED", case_malformed_request),
    PeerCase("peer.event.unknown-code", "an EVENT with an unknown code is skipped, or closed on with "
             "UNKNOWN_FUNCTION", "11.1", "MUST", "The peer MUST either skip the frame (its `length` says where "
             "the next one begins) and carry on, or send CLOSE (UNKNOWN_FUNCTION) and close.", case_unknown_event),
    PeerCase("peer.fatal.unknown-frame-type", "a frame of unknown type: CLOSE MALFORMED, nothing read after it",
             "11.1", "MUST", Q_FATAL, case_unknown_frame_type),
    PeerCase("peer.fatal.malformed-fetch-event", "a FETCH_ADD with a bad value: CLOSE MALFORMED", "11.1", "MUST",
             "A malformed EVENT the peer knows (a bad FETCH_ADD, say) is fatal (CLOSE MALFORMED): skipping it would "
             "lose a change silently (section 9.3).", case_malformed_fetch_event),
    PeerCase("peer.owner.fire-and-forget", "a SET_STATE and a CALL_METHOD event: the set is notified, neither "
             "is answered", "7.1", "MUST", "the owner applies them and, for a set, notifies as usual.",
             case_fire_and_forget_set),
    PeerCase("peer.fatal.body-over-max", "a header above the peer's announced max_body: CLOSE TOO_LARGE",
             "11.1", "MUST", Q_FATAL, case_body_over_peer_max),
    PeerCase("peer.max-body.respected", "with a daemon max_body of 64 the peer sends no larger body (its call "
             "fails locally)", "3", "MUST", "A sender MUST NOT send a body larger than the receiver's announced "
             "`max_body`.", case_max_body_respected),
    PeerCase("peer.close.fails-pending", "CLOSE from the daemon: the pending set fails at once, the peer "
             "closes and sends nothing more", "11.4", "MUST", Q_PENDING, case_close_fails_pending),
    PeerCase("peer.drop.fails-pending", "the connection is reset: the pending set fails at once", "11.4",
             "MUST", Q_PENDING, case_drop_fails_pending),
    PeerCase("peer.info.limits", "a daemon announcing LIMITS: a peer that asks gets a second INFO with the "
             "limits (and a later field) and carries on; one that does not ask gets none", "4.4.1", "MUST",
             "A peer that asked MUST accept an INFO with or without the extension", case_info_limits),
    PeerCase("peer.info.first-frame-not-info", "a first frame other than INFO: CLOSE MALFORMED", "11.1",
             "SHOULD", "A peer SHOULD treat any other first frame as a fatal error: send CLOSE (MALFORMED) and "
             "close.", case_first_frame_not_info),
    PeerCase("peer.response.malformed", "an OK with a 2-byte payload to the peer's set fails it at once with "
             "MALFORMED", "11.1", "SHOULD", "the peer SHOULD fail that request at once with MALFORMED",
             case_malformed_response),
    PeerCase("peer.response.wrong-shape", "an OK with a fetch_id to the peer's set fails it with MALFORMED",
             "11.1", "SHOULD", "the peer SHOULD fail the request with MALFORMED.", case_wrong_shape_response),
    PeerCase("peer.owner.no-stray-frames", "after answering, the owner sends no stray RESPONSE and no FETCH_* "
             "event", "11", "MUST", "A peer MUST NOT send RESPONSE frames except to answer routed requests.",
             case_quiet_owner),
]


async def run_peer_case(case: PeerCase, config: PeerRunConfig) -> CaseResult:
    """Run one case against a fresh agent process; never raises for peer misbehaviour."""
    log = CaseLog()
    result = CaseResult(case.as_case(), OK)
    session = Session(config, log)
    start = time.monotonic()
    try:
        await asyncio.wait_for(case.script(session), config.case_timeout)
    except MustViolation as exc:
        result.outcome, result.reason = FAILED, exc.reason
        result.expected, result.received = exc.expected, exc.received
    except StepFailed as exc:
        result.outcome = NON_STRICT if case.requirement == "SHOULD" else FAILED
        result.reason, result.expected, result.received = exc.reason, exc.expected, exc.received
    except TimeoutError:
        result.outcome, result.reason = FAILED, f"the case did not finish within {config.case_timeout:g} s"
    except OSError as exc:
        result.outcome, result.reason = FAILED, f"cannot run the agent: {exc}"
    finally:
        with contextlib.suppress(Exception):
            await session.close()
    if result.outcome != OK:
        log.add("-", "fail", result.reason)
        # The report's shape for what was observed (runner.Received.describe).
        result.received = [item if "decoded" in item else {"decoded": item, "error": None, "hex": ""}
                           for item in result.received]
    result.duration = time.monotonic() - start
    result.exchange = log.entries
    result.namespace = "-"
    return result


async def run_peer_cases(cases: list[PeerCase], config: PeerRunConfig) -> list[CaseResult]:
    """Run ``cases``, at most ``config.jobs`` at once (each has its own port and agent)."""
    limit = asyncio.Semaphore(max(1, config.jobs))

    async def one(case: PeerCase) -> CaseResult:
        async with limit:
            return await run_peer_case(case, config)

    return list(await asyncio.gather(*(one(case) for case in cases)))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jet-conformance peer",
        description="Test a jet peer library: the suite plays the daemon on 127.0.0.1 and runs the agent "
                    "(spec/conformance/PEER.md) once per case as AGENT... HOST PORT.",
    )
    parser.add_argument("--agent", required=False, metavar="CMD",
                        help="the agent command line (split like a shell would); HOST PORT are appended")
    parser.add_argument("--cases", metavar="GLOB", help="only cases whose id matches GLOB")
    parser.add_argument("--strict", action="store_true", help="count NON-STRICT (unmet SHOULD) as failed")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="S",
                        help="how long a step waits for the peer (default 5)")
    parser.add_argument("--jobs", type=int, default=4, metavar="N", help="cases run at once (default 4)")
    add_report_options(parser)
    return parser


def main(argv: Optional[list[str]], status: dict[str, int]) -> int:
    """``jet-conformance peer ...``; exit 0 all passed, 1 failures, 2 usage errors."""
    parser = build_parser()
    args = parser.parse_args(argv)
    selected = [case for case in PEER_CASES if not args.cases or fnmatch.fnmatch(case.id, args.cases)]
    if args.list:
        write_case_list(selected, sys.stdout)
        return 0
    if not args.agent:
        parser.error("--agent CMD is required unless --list is given")
    if not selected:
        print("jet-conformance peer: no case matches the selection", file=sys.stderr)
        return 2
    config = PeerRunConfig(host="agent", port=0, timeout=args.timeout, strict=args.strict, jobs=max(1, args.jobs),
                           case_timeout=60.0, agent=shlex.split(args.agent), subject=f"peer agent: {args.agent}")
    results = asyncio.run(run_peer_cases(selected, config))
    if all(r.reason.startswith("cannot run the agent") for r in results):
        print(f"jet-conformance peer: {results[0].reason}", file=sys.stderr)
        return 2
    write_report_files(results, config, json_path=args.json, junit_path=args.junit, html_path=args.html)
    failed = any(result.counts_as_failure(config.strict) for result in results)
    status["code"] = 1 if failed else 0
    write_console(results, config, sys.stdout, verbose=args.verbose)
    sys.stdout.flush()
    return status["code"]

