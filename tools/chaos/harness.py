"""What every attack needs: the daemon under test, a raw peer, a health peer and an RSS
sampler. Everything here talks to 127.0.0.1 only, has a timeout on every wait, and is
stopped by its context manager whatever happened inside."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any
from typing import Optional
from typing import TypeVar

from jetwire import AddState
from jetwire import Close
from jetwire import Decoder
from jetwire import FrameType
from jetwire import GetState
from jetwire import Info
from jetwire import Message
from jetwire import NotifyState
from jetwire import Response
from jetwire import Value
from jetwire import encode
from tools.procs import stop_process

HOST = "127.0.0.1"
MiB = 1 << 20
STARTUP_TIMEOUT = 20.0
STOP_TIMEOUT = 15.0
WAIT = 10.0  # default wait for one answer
HEALTH_PERIOD = 0.05  # ISSUE 12: a health peer that reads and sets a state every 50 ms
STOP_GRACE = 5.0  # a health request in flight when the attack ends: how long its answer may take
SAMPLE_PERIOD = 0.02
READ_CHUNK = 1 << 20
MAX_BODY_READ = 256 * 1024 * 1024  # what our own decoders accept
HEADER = struct.Struct(">BI")  # PROTOCOL.md 3: type, body length


class NeedsOwnDaemon(Exception):
    """The attack needs flags, a signal or a log directory of a daemon chaos started."""


@dataclass
class Daemon:
    """The daemon under test: its address and, when known, its pid."""

    host: str
    port: int
    pid: Optional[int]
    proc: Optional[subprocess.Popen[bytes]] = None
    stderr_path: Optional[Path] = None
    log_dir: Optional[Path] = None

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""

    def signal(self, sig: int) -> None:
        """Send ``sig`` to a daemon chaos started (never to one it was pointed at)."""
        if self.proc is None:
            raise NeedsOwnDaemon("signals go only to a daemon chaos started")
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> Optional[int]:
        """The exit status once the daemon has exited, or None after ``timeout``."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None


@dataclass
class Target:
    """Where attacks go: a daemon chaos starts per attack (``repo``), or one already
    running (``connect``; flags cannot be given to it)."""

    repo: Path
    connect: Optional[tuple[str, int]] = None
    pid: Optional[int] = None
    extra_args: Sequence[str] = ()
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="jet-chaos-")))

    @contextlib.contextmanager
    def daemon(self, *args: str, nofile: Optional[int] = None, log: bool = False,
               own: bool = False) -> Iterator[Daemon]:
        """A daemon for one attack. Started with ``args`` (and an event log directory
        when ``log``; under RLIMIT_NOFILE ``nofile``) unless chaos was pointed at a
        running one; ``own``: the attack cannot run against that one."""
        if self.connect is not None:
            if own or nofile is not None or log:
                raise NeedsOwnDaemon("needs a daemon chaos starts (flags, signals or its event log)")
            yield Daemon(self.connect[0], self.connect[1], self.pid)
            return
        run_dir = Path(tempfile.mkdtemp(prefix="run-", dir=self.workdir))
        log_dir = run_dir / "log" if log else None
        cmd = [sys.executable, "-m", "jetd", "--host", HOST, "--port", "0", *args, *self.extra_args]
        if log_dir is not None:
            cmd += ["--log-dir", str(log_dir)]
        env = {**os.environ, "PYTHONPATH": str(self.repo), "PYTHONUNBUFFERED": "1"}
        stderr_path = run_dir / "stderr.txt"

        def limit_files() -> None:
            import resource

            assert nofile is not None
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, cwd=self.repo,
                                    preexec_fn=limit_files if nofile is not None else None)
        try:
            host, port = _listening_line(proc, stderr_path)
            yield Daemon(host, port, proc.pid, proc, stderr_path, log_dir)
        finally:
            stop_process(proc, STOP_TIMEOUT)
            shutil.rmtree(run_dir, ignore_errors=True)  # event logs of gigabytes


def stdout_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The next line of ``proc``'s stdout (read a byte at a time, so nothing after it is
    taken); what came before the end if it ends or ``timeout`` passes first."""
    assert proc.stdout is not None
    line = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            chunk = os.read(proc.stdout.fileno(), 1) if remaining > 0 and selector.select(remaining) else b""
            if not chunk:
                break
            line += chunk
    return line


def _listening_line(proc: subprocess.Popen[bytes], stderr_path: Path) -> tuple[str, int]:
    """Wait for ``jetd listening on HOST:PORT``; kill the daemon if it does not come."""
    line = stdout_line(proc, STARTUP_TIMEOUT)
    if not line.endswith(b"\n"):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"jetd did not start: {stderr_path.read_text(errors='replace')[-2000:].strip()}")
    host, _, port = line.decode().strip().removeprefix("jetd listening on ").rpartition(":")
    return host, int(port)


Conn = TypeVar("Conn")


def open_and_send(conns: list[Conn], count: int, seconds: float, connect: Callable[[], Conn],
                  send: Callable[[Conn, float], bool]) -> int:
    """Open up to ``count`` connections within ``seconds`` (one the daemon refuses is
    skipped), each appended to ``conns`` (the caller closes them, whatever happens), and
    ``send`` on each, given how long it may block (at most 2 s); returns how many sends
    went through."""
    sent = 0
    deadline = time.monotonic() + seconds
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        try:
            conn = connect()
        except (OSError, ConnectionError, PeerGone):  # a daemon that refuses more of them
            continue
        conns.append(conn)
        if send(conn, max(0.1, min(2.0, deadline - time.monotonic()))):
            sent += 1
    return sent


class PeerGone(Exception):
    """The daemon closed the connection (EOF or reset)."""


class RawPeer:
    """One blocking connection: send frames or raw bytes, read messages, with timeouts.

    ``info`` is the daemon's INFO (read at once unless ``read_info`` is false),
    ``close_frame`` the CLOSE read, if any, ``eof`` whether the daemon closed."""

    def __init__(self, address: tuple[str, int], *, rcvbuf: Optional[int] = None, read_info: bool = True,
                 timeout: float = WAIT) -> None:
        if address[0] != HOST:
            raise ValueError("chaos talks to 127.0.0.1 only")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(address)
        self.decoder = Decoder(max_body=MAX_BODY_READ)
        self.eof = False
        self.received = 0
        self.close_frame: Optional[Close] = None
        self.info: Optional[Info] = None
        if read_info:
            first = self.recv(timeout)
            if isinstance(first, Info):
                self.info = first

    @property
    def max_body(self) -> int:
        return self.info.max_body if self.info is not None else 1 << 20

    def send(self, *messages: Message) -> None:
        self.sock.sendall(b"".join(encode(m) for m in messages))

    def send_raw(self, data: bytes, timeout: float = WAIT) -> bool:
        """Send ``data``; False if the daemon closed, reset or stopped reading."""
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(data)
        except (OSError, TimeoutError):
            return False
        return True

    def fill(self, timeout: float) -> bool:
        """Read once; False on timeout. Raises PeerGone at EOF or reset."""
        if self.eof:
            raise PeerGone("daemon closed the connection")
        self.sock.settimeout(max(timeout, 0.001))
        try:
            data = self.sock.recv(READ_CHUNK)
        except TimeoutError:
            return False
        except OSError:
            data = b""
        if not data:
            self.eof = True
            raise PeerGone("daemon closed the connection")
        self.received += len(data)
        self.decoder.receive_data(data)
        return True

    def recv(self, timeout: float = WAIT) -> Message:
        """The next message. Raises PeerGone at EOF, TimeoutError after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.decoder.next_message()
            if message is not None:
                if isinstance(message, Close):
                    self.close_frame = message
                return message
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no message within {timeout} s")
            self.fill(remaining)

    def answer(self, rid: int, timeout: float = WAIT) -> Response:
        """Read until the response to ``rid`` (other messages are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.recv(deadline - time.monotonic())
            if isinstance(message, Response) and message.id == rid:
                return message
            if isinstance(message, Close):
                raise PeerGone(f"CLOSE {message.status.name} {message.message!r}")

    def read_to_end(self, timeout: float) -> bool:
        """Read and decode everything until EOF (True) or ``timeout`` (False); a CLOSE
        read on the way is kept in ``close_frame``."""
        deadline = time.monotonic() + timeout
        try:
            while True:
                while (message := self.decoder.next_message()) is not None:
                    if isinstance(message, Close):
                        self.close_frame = message
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.fill(remaining)
        except PeerGone:
            while (message := self.decoder.next_message()) is not None:
                if isinstance(message, Close):
                    self.close_frame = message
            return True
        except Exception:  # a frame our decoder rejects: stop reading, say so
            return self.eof

    def pump(self, most: int = READ_CHUNK) -> None:
        """Read what has arrived (up to ``most`` bytes), without waiting; note INFO,
        CLOSE and EOF (a reset counts as EOF)."""
        timeout = self.sock.gettimeout()
        self.sock.settimeout(0)  # with a timeout, Python waits for input even with MSG_DONTWAIT
        try:
            data = self.sock.recv(most)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        finally:
            self.sock.settimeout(timeout)
        if not data:
            self.eof = True
            return
        self.received += len(data)
        self.decoder.receive_data(data)
        with contextlib.suppress(Exception):  # a frame our decoder rejects ends the decoding, not the read
            while (message := self.decoder.next_message()) is not None:
                if isinstance(message, Info) and self.info is None:
                    self.info = message
                elif isinstance(message, Close):
                    self.close_frame = message

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def send_partial_frame(peer: RawPeer, timeout: float) -> bool:
    """A frame of max_body bytes but its last (PROTOCOL.md 3: the header announces it
    whole); False if the daemon closed or stopped reading."""
    return peer.send_raw(HEADER.pack(FrameType.REQUEST, peer.max_body) + bytes(peer.max_body - 1), timeout=timeout)


def pump_all(peers: Sequence[RawPeer], seconds: float) -> None:
    """Read whatever the daemon sends to ``peers`` for ``seconds``, or until all of them
    have reached EOF."""
    deadline = time.monotonic() + seconds
    with selectors.DefaultSelector() as selector:
        for peer in peers:
            if not peer.eof:
                selector.register(peer.sock, selectors.EVENT_READ, peer)
        while selector.get_map() and (remaining := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(remaining):
                key.data.pump()
                if key.data.eof:
                    selector.unregister(key.fileobj)


class _HealthLoop:
    """The health peer's work, in its own process (see :class:`HealthPeer`): every
    ``PERIOD`` seconds one request of each of ``KINDS``, made and awaited by :meth:`ask`.
    A subclass changes what is asked."""

    KEY = "chaos/health"
    KINDS: tuple[str, ...] = ("get", "notify")
    PERIOD = HEALTH_PERIOD

    def __init__(self, address: tuple[str, int], stop: Any) -> None:
        self.peer = RawPeer(address)
        self.peer.send(AddState(1, self.KEY, Value.of(0)))
        self.peer.answer(1)
        self.stop = stop  # a multiprocessing Event
        self.waits: list[float] = []
        self.started: list[float] = []  # monotonic time each request of ``waits`` was sent
        self.kinds: list[str] = []  # the kind of each request of ``waits``
        self.timeouts = 0
        self.lost = ""  # why the health peer stopped early, if it did

    def ask(self, kind: str, rid: int) -> bool:
        """One request of ``kind``; False if the attack ended before its answer."""
        self.peer.send(GetState(rid, self.KEY) if kind == "get" else NotifyState(rid, self.KEY, Value.of(rid)))
        return self._wait_for(rid)

    def close(self) -> None:
        self.peer.close()

    def run(self) -> None:
        rid = 1
        try:
            while not self.stop.is_set():
                cycle = time.monotonic()
                for kind in self.KINDS:
                    rid += 1
                    started = time.monotonic()
                    answered = self.ask(kind, rid)
                    self.waits.append(time.monotonic() - started)
                    self.started.append(started)
                    self.kinds.append(kind)
                    if not answered:
                        self.timeouts += 1
                        self.lost = (f"no answer to a {kind} {time.monotonic() - started:.1f} s after it "
                                     f"was sent ({STOP_GRACE:g} s after the attack's end at least)")
                        return
                self.stop.wait(max(0.0, cycle + self.PERIOD - time.monotonic()))
        except (PeerGone, OSError) as exc:
            self.lost = f"connection lost ({exc})"
        finally:
            self.close()

    def _wait_for(self, rid: int) -> bool:
        """Wait for the answer to ``rid``, as :meth:`_wait` says."""
        def answered(timeout: float) -> bool:
            try:
                self.peer.answer(rid, timeout)
            except TimeoutError:
                return False
            return True
        return self._wait(answered)

    def _wait(self, answered: Callable[[float], bool]) -> bool:
        """Call ``answered(timeout)`` (True once the answer is in; it reads for at most
        ``timeout`` seconds) however long the answer takes, and for at most
        ``STOP_GRACE`` seconds once the attack has ended; False if it has not come by
        then (its wait is then a lower bound). A request in flight when the attack ends
        is measured, not counted lost."""
        stopped_at: Optional[float] = None
        while not answered(0.5):
            if self.stop.is_set():
                now = time.monotonic()
                stopped_at = now if stopped_at is None else stopped_at
                if now - stopped_at >= STOP_GRACE:
                    return False
        return True

    def result(self) -> dict[str, Any]:
        """What the parent process gets back (picklable)."""
        return {"waits": self.waits, "started": self.started, "kinds": self.kinds, "timeouts": self.timeouts,
                "lost": self.lost}


def _health_process(address: tuple[str, int], stop: Any, results: Any, loop_class: type[_HealthLoop]) -> None:
    try:
        loop = loop_class(address, stop)
    except Exception as exc:
        results.send(f"health peer could not start: {type(exc).__name__}: {exc}")
        return
    results.send("ready")
    loop.run()
    results.send(loop.result())


class HealthPeer:
    """ISSUE 12: a peer that reads (GET_STATE) and sets (NOTIFY_STATE, as the state's
    owner) a small state every 50 ms and records how long each answer took.

    It runs in a process of its own, so that what the attack's own threads do in this
    one (encoding, counting frames: the GIL) never shows up as a stall of the daemon.
    ``loop_class`` is the work done there (a :class:`_HealthLoop`; its ``result()``
    lands in :attr:`result`).
    """

    def __init__(self, address: tuple[str, int], loop_class: type[_HealthLoop] = _HealthLoop) -> None:
        # fork: a spawned interpreter costs about a second per attack on a busy machine; the
        # child runs only _health_process (sockets, jetwire), no lock the parent's threads hold.
        context = multiprocessing.get_context("fork")
        self._stop = context.Event()
        self._results, child_end = context.Pipe(duplex=False)
        self._process = context.Process(target=_health_process, args=(address, self._stop, child_end, loop_class),
                                        name="chaos-health", daemon=True)
        self._process.start()
        child_end.close()
        self.waits: list[float] = []
        self.started: list[float] = []
        self.timeouts = 0
        self.lost = ""
        self.result: dict[str, Any] = {}
        try:
            first = self._results.recv() if self._results.poll(STARTUP_TIMEOUT) else "health peer did not start"
        except EOFError:
            first = "health peer died at its start"
        if first != "ready":
            self._end()
            raise RuntimeError(first)

    def _end(self) -> None:
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._results.close()

    def max_wait_ms(self, since: float, until: float) -> Optional[float]:
        """The longest wait (ms) of the requests sent or answered between two times
        (``time.monotonic()``, the same clock in every process); after :meth:`stop`."""
        waits = [w for s, w in zip(self.started, self.waits, strict=True) if s < until and s + w > since]
        return round(max(waits) * 1000, 1) if waits else None

    def stop(self) -> dict[str, object]:
        """Stop; returns max and p99 wait (ms), samples and timeouts."""
        self._stop.set()
        try:
            if not self._results.poll(10):
                raise EOFError
            self.result = self._results.recv()
            self.waits, self.started = self.result["waits"], self.result["started"]
            self.timeouts, self.lost = self.result["timeouts"], self.result["lost"]
        except EOFError:
            self.lost = "the health process sent no result"
        self._end()
        waits = sorted(self.waits)
        if not waits:
            return {"health_max_ms": None, "health_p99_ms": None, "health_samples": 0,
                    "health_timeouts": self.timeouts, "health_lost": self.lost}
        p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
        return {"health_max_ms": round(waits[-1] * 1000, 1), "health_p99_ms": round(p99 * 1000, 1),
                "health_samples": len(waits), "health_timeouts": self.timeouts, "health_lost": self.lost}


def _status_kib(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line[:5]] = int(line.split()[1])
    return out


class MemorySampler:
    """Samples the daemon's VmRSS every 20 ms; also reads VmHWM at the end."""

    def __init__(self, pid: Optional[int]) -> None:
        self.pid = pid
        self.base_kib = self.peak_kib = self.last_kib = self.hwm_kib = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if pid is not None:
            self.base_kib = self.peak_kib = _status_kib(pid).get("VmRSS", 0)
            self._thread = threading.Thread(target=self._run, name="chaos-rss", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        assert self.pid is not None
        while not self._stop.wait(SAMPLE_PERIOD):
            try:
                kib = _status_kib(self.pid)
            except OSError:
                return
            self.last_kib = kib.get("VmRSS", 0)
            self.peak_kib = max(self.peak_kib, self.last_kib)
            self.hwm_kib = kib.get("VmHWM", self.hwm_kib)

    def stop(self) -> dict[str, object]:
        """Stop; returns base, peak and growth of RSS and the high-water mark (MB)."""
        self._stop.set()
        if self._thread is None:
            return {"rss_base_mb": None, "rss_peak_mb": None, "rss_growth_mb": None, "hwm_mb": None}
        self._thread.join(5)
        mb = 1024.0
        return {"rss_base_mb": round(self.base_kib / mb, 1), "rss_peak_mb": round(self.peak_kib / mb, 1),
                "rss_growth_mb": round((self.peak_kib - self.base_kib) / mb, 1),
                "hwm_mb": round(self.hwm_kib / mb, 1)}


@dataclass
class Watch:
    """What watches an attack: the health peer (if any) and the RSS sampler."""

    health: Optional[HealthPeer]
    memory: MemorySampler

    def settle(self, least: float, most: float, quiet: float = 5.0) -> None:
        """Observe for ``least`` seconds, then until the daemon's RSS peak has not grown
        (by 1% or 4 MiB) for ``quiet`` seconds, ``most`` seconds in all."""
        start = last_change = time.monotonic()
        peak = self.memory.peak_kib
        while (now := time.monotonic()) - start < most and (now - start < least or now - last_change < quiet):
            time.sleep(0.1)
            if self.memory.peak_kib > peak + max(4096, peak // 100):
                peak, last_change = self.memory.peak_kib, time.monotonic()


@contextlib.contextmanager
def watched(daemon: Daemon, row: dict[str, object], health: bool = True) -> Iterator[Watch]:
    """Health peer and RSS sampler around an attack; their numbers go into ``row``."""
    peer = HealthPeer(daemon.address) if health else None
    memory = MemorySampler(daemon.pid)
    try:
        yield Watch(peer, memory)
    finally:
        if peer is not None:
            row.update(peer.stop())
        row.update(memory.stop())


def close_all(peers: Sequence[RawPeer]) -> None:
    for peer in peers:
        peer.close()


class FrameCounter:
    """Counts frames per type in a byte stream from their headers alone (no decoding)."""

    def __init__(self) -> None:
        self.by_type: Counter[int] = Counter()
        self._need = 0  # body bytes of the current frame still to skip
        self._head = b""

    def feed(self, data: bytes) -> None:
        pos, size = 0, len(data)
        while pos < size:
            if self._need:
                step = min(self._need, size - pos)
                self._need -= step
                pos += step
                continue
            want = 5 - len(self._head)
            self._head += data[pos : pos + want]
            pos += want
            if len(self._head) == 5:
                ftype, self._need = HEADER.unpack(self._head)
                self.by_type[ftype] += 1
                self._head = b""


class Drainer:
    """A thread that reads and discards what the daemon sends to some connections,
    counting frames per connection, until stopped (or every connection is closed)."""

    def __init__(self, peers: Sequence[RawPeer]) -> None:
        self.counters = {id(p): FrameCounter() for p in peers}
        self._peers = list(peers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for peer in self._peers:  # others may send on them meanwhile: they stay blocking
                selector.register(peer.sock, selectors.EVENT_READ, peer)
            while not self._stop.is_set() and selector.get_map():
                for key, _ in selector.select(0.1):
                    peer = key.data
                    try:
                        data = peer.sock.recv(READ_CHUNK, socket.MSG_DONTWAIT)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        selector.unregister(peer.sock)
                        continue
                    self.counters[id(peer)].feed(data)

    def frames(self, peer: RawPeer, ftype: int) -> int:
        return self.counters[id(peer)].by_type[ftype]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_until(done: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
    """Poll ``done`` until it is true (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(step)
    return True


def owner_with_state(daemon: Daemon, key: str, wanted: int) -> tuple[RawPeer, int]:
    """A connection owning ``key`` with a BYTES value near ``wanted`` bytes (less if
    the daemon's max_body needs it); returns it and the value's size."""
    owner = RawPeer(daemon.address)
    size = max(1, min(wanted, owner.max_body - len(key) - 64))
    owner.send(AddState(1, key, Value.of(b"\x5a" * size)))
    owner.answer(1)
    return owner, size


def add_states(daemon: Daemon, prefix: str, count: int, size: int, per_owner: int = 100_000) -> list[RawPeer]:
    """``count`` states of ``size`` bytes, ``per_owner`` per connection (jetd's default
    max_states_per_connection), added in pipelined batches."""
    owners: list[RawPeer] = []
    value = Value.of(b"\x5a" * size)
    for first in range(0, count, per_owner):
        owner = RawPeer(daemon.address, timeout=60)
        owners.append(owner)
        last = min(count, first + per_owner)
        for start in range(first, last, 10_000):
            stop = min(last, start + 10_000)
            owner.sock.sendall(b"".join(encode(AddState(i + 1, f"{prefix}{i:07d}", value)) for i in range(start, stop)))
            owner.answer(stop, timeout=120)
    return owners


def closures(peers: Sequence[RawPeer], timeout: float) -> Counter[str]:
    """How each connection ends within ``timeout``: ``CLOSE <STATUS>``, ``EOF without
    CLOSE`` or ``still open`` (what the daemon sends is read and discarded)."""
    pump_all(peers, timeout)
    return Counter(
        (f"CLOSE {p.close_frame.status.name}" if p.close_frame else "EOF without CLOSE") if p.eof else "still open"
        for p in peers
    )


def describe(counts: Counter[str]) -> str:
    return ", ".join(f"{n} {what}" for what, n in counts.most_common()) or "none"
