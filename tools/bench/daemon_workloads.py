"""The daemon benchmark's workloads W1-W5 (issue 3), for jetd and node-jet alike.

Each workload takes a factory that starts a fresh daemon, the dialect it speaks and the
sizes to run at, and returns :class:`Sample` lists: one value per repetition, so the
caller can report medians. Daemon CPU is read from ``/proc`` around each measured
window, so a number like "daemon CPU per routed set" holds even when the load generator
is the bottleneck.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import statistics
import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextlib import ExitStack
from dataclasses import dataclass
from dataclasses import field

from jetwire import Decoder
from jetwire import FetchAdd
from jetwire import Response

from .daemon_load import Channel
from .daemon_load import Pump
from .daemon_load import add_states
from .daemon_load import connect
from .daemon_load import wait_responses
from .daemon_procs import DaemonProcess
from .daemon_wire import BenchError
from .daemon_wire import Dialect
from .daemon_wire import EventCounter

StartDaemon = Callable[[], AbstractContextManager[DaemonProcess]]
_fetch_tags = itertools.count(1)


@dataclass(frozen=True)
class Sizes:
    """How big and how long each workload runs."""

    repeat: int = 5
    window: float = 2.0  # seconds per measured window
    warmup: float = 0.3
    w1_sequential: int = 5000
    w1_in_flight: int = 100
    w2_states: int = 100
    w2_fetchers: tuple[int, ...] = (1, 10, 50)
    w3_states: int = 10_000
    w4_states: int = 100_000
    w4_connections: int = 1000
    w5_fetchers: int = 10
    w5_rcvbuf: int = 4096
    w5_warmup: float = 1.0

    @classmethod
    def quick(cls) -> Sizes:
        """A few seconds per workload: for a first look, not for quoting."""
        return cls(repeat=3, window=0.5, warmup=0.2, w1_sequential=1000, w3_states=10_000,
                   w4_states=20_000, w4_connections=200, w5_warmup=0.5)

    @classmethod
    def tiny(cls) -> Sizes:
        """Fractions of a second per workload: the smoke test's size."""
        return cls(repeat=1, window=0.15, warmup=0.05, w1_sequential=50, w1_in_flight=10, w2_states=10,
                   w2_fetchers=(1, 3), w3_states=200, w4_states=500, w4_connections=20, w5_fetchers=2,
                   w5_warmup=0.1)


@dataclass
class Sample:
    """One metric's values over the repetitions of one workload on one daemon."""

    workload: str
    metric: str
    unit: str
    values: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values)


class Samples:
    """Samples keyed by (workload, metric), in the order they were first recorded."""

    def __init__(self) -> None:
        self.by_key: dict[tuple[str, str], Sample] = {}

    def add(self, workload: str, metric: str, unit: str, value: float) -> None:
        sample = self.by_key.setdefault((workload, metric), Sample(workload, metric, unit))
        sample.values.append(value)

    def list(self) -> list[Sample]:
        return list(self.by_key.values())


@contextlib.contextmanager
def _closing_all() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _keys(prefix: str, count: int) -> list[str]:
    width = len(str(max(count - 1, 1)))
    return [f"{prefix}{i:0{width}d}" for i in range(count)]


def _own_cpu() -> float:
    """CPU seconds used by this process (the load generator) so far."""
    times = os.times()
    return times.user + times.system


def _check_alive(daemon: DaemonProcess) -> None:
    if not daemon.alive():
        raise BenchError(f"{daemon.kind} exited ({daemon.proc.returncode}): {daemon.stderr_tail()}")


# --- W1: routed set -------------------------------------------------------------------


def w1_routed_set(start: StartDaemon, dialect: Dialect, sizes: Sizes) -> list[Sample]:
    """W1: a requester sets a state whose owner answers NOTIFY then OK (PROTOCOL.md 10.3).

    Sequential round trips (p50, p99) first, then ``w1_in_flight`` sets pipelined on one
    connection: sets/s and daemon CPU per routed set.
    """
    samples = Samples()
    key = "w1/state"
    with start() as daemon, _closing_all() as stack:
        owner = stack.enter_context(connect(daemon, dialect, "w1-owner"))
        requester = stack.enter_context(connect(daemon, dialect, "w1-requester"))
        add_states(owner, dialect, [key], [0])
        answerer = dialect.owner_answerer()
        # Repetition 0 is an unreported warm-up (first-use costs in the daemon and here).
        for rep in range(sizes.repeat + 1):
            scanner = dialect.response_scanner()
            latencies = []
            deadline = time.monotonic() + 120
            count = sizes.w1_sequential if rep else max(1, sizes.w1_sequential // 5)
            done_before = answerer.answered
            for i in range(count):
                frame = dialect.set_state(i + 1, key, rep * 10_000_000 + i + 1)
                t0 = time.perf_counter_ns()
                requester.sendall(frame)
                while answerer.answered <= done_before + i:
                    data = owner.recv(65536)
                    if not data:
                        raise BenchError("daemon closed the owner's connection")
                    out = answerer.feed(data)
                    if out:
                        owner.sendall(out)
                wait_responses(requester, scanner, i + 1, deadline)
                latencies.append(time.perf_counter_ns() - t0)
            if rep == 0:
                continue
            latencies.sort()
            samples.add("W1 routed set", "sequential round trip p50", "µs", latencies[len(latencies) // 2] / 1000)
            samples.add("W1 routed set", "sequential round trip p99", "µs",
                        latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] / 1000)
        _check_alive(daemon)
        # Pipelined, the sets go round a ring (requester -> daemon -> owner -> daemon ->
        # requester) with every process waiting for the one before it: on an idle machine
        # each hop costs a wake-up of a sleeping core. So each repetition runs twice, in
        # alternating order: the generator sleeping in select(), and busy-polling (it never
        # sleeps, so only the daemon's own wake-ups are in the figures).
        for rep in range(sizes.repeat):
            for busy_poll in ((False, True) if rep % 2 == 0 else (True, False)):
                rate, cpu, generator = _w1_pipelined(daemon, dialect, owner, requester, key, sizes, rep,
                                                     busy_poll=busy_poll)
                how = ", generator busy-polling" if busy_poll else ""
                samples.add("W1 routed set", f"pipelined ({sizes.w1_in_flight} in flight) sets/s{how}", "/s", rate)
                samples.add("W1 routed set", f"daemon CPU per routed set{how}", "µs", cpu * 1e6)
                samples.add("W1 routed set", f"load generator CPU while pipelining{how}", "cores", generator)
    return samples.list()


def _w1_pipelined(daemon: DaemonProcess, dialect: Dialect, owner: socket.socket, requester: socket.socket,
                  key: str, sizes: Sizes, rep: int, *, busy_poll: bool = False) -> tuple[float, float, float]:
    """One pipelined window: every response releases the next set, until the window ends."""
    cycle = max(10 * sizes.w1_in_flight, 1000)
    base = 1_000_000_000 + rep * 10_000_000
    # Ids cycle; with at most w1_in_flight pending, the pending ids are always distinct.
    frames = [dialect.set_state(i + 1, key, base + i) for i in range(cycle)]
    scanner = dialect.response_scanner()
    answerer = dialect.owner_answerer()
    state = {"next": 0, "seen": 0, "sent": 0, "stop": 0}

    def take(count: int) -> bytes:
        first = state["next"]
        state["next"] = (first + count) % cycle
        state["sent"] += count
        if first + count <= cycle:
            return b"".join(frames[first : first + count])
        return b"".join(frames[first:] + frames[: first + count - cycle])

    def on_responses(data: bytes) -> bytes:
        scanner.feed(data)
        if scanner.errors:
            raise BenchError(f"set failed: {scanner.first_error[:200]!r}")
        done = scanner.ok - state["seen"]
        state["seen"] = scanner.ok
        return b"" if state["stop"] else take(done)

    pump = Pump()
    try:
        pump.add(Channel(owner, on_data=answerer.feed))
        requester_channel = pump.add(Channel(requester, on_data=on_responses))
        requester_channel.write(take(sizes.w1_in_flight))
        pump.run_until(time.perf_counter() + sizes.warmup, busy_poll=busy_poll)
        t0, cpu0, ok0, gen0 = time.perf_counter(), daemon.cpu_seconds(), scanner.ok, _own_cpu()
        pump.run_until(t0 + sizes.window, busy_poll=busy_poll)
        t1, cpu1, ok1, gen1 = time.perf_counter(), daemon.cpu_seconds(), scanner.ok, _own_cpu()
        # Let the sets in flight finish so the next repetition starts on quiet connections.
        state["stop"] = 1
        pump.run_until(time.perf_counter() + 10, lambda: scanner.ok >= state["sent"])
        if scanner.ok < state["sent"]:
            raise BenchError(f"{state['sent'] - scanner.ok} routed sets never answered")
    finally:
        pump.close()
        owner.setblocking(True)
        requester.setblocking(True)
        owner.settimeout(30)
        requester.settimeout(30)
    _check_alive(daemon)
    sets = ok1 - ok0
    if sets <= 0:
        raise BenchError("no routed set completed in the window")
    return sets / (t1 - t0), (cpu1 - cpu0) / sets, (gen1 - gen0) / (t1 - t0)


# --- W2 / W5: fan-out ------------------------------------------------------------------


class _FanOut:
    """One owner with states on a daemon, and a notify stream it can push as fast as possible."""

    def __init__(self, daemon: DaemonProcess, dialect: Dialect, owner: socket.socket, keys: list[str]) -> None:
        self.daemon = daemon
        self.dialect = dialect
        self.owner = owner
        self.keys = keys
        # Values alternate so that no notify repeats its key's cached value (node-jet drops those).
        repeats = max(1, 500 // len(keys))
        self.block = (dialect.notify_block(keys, 1) + dialect.notify_block(keys, 2)) * repeats
        # Every notify frame has the same size (keys of one length, values 1 and 2).
        self.notify_size = len(self.block) / (2 * len(keys) * repeats)
        self.delivered_share = 0.0  # delivered events / (notifies sent x fetchers), last window
        self.owner_responses = dialect.response_scanner()
        self.generator_load = 0.0  # this process's CPU seconds per second in the last window

    def run(self, fetchers: int, sizes: Sizes, *, slow_rcvbuf: int | None = None,
            warmup: float | None = None) -> tuple[float, float, int]:
        """Connect ``fetchers`` fetchers of everything (plus a never-reading one if
        ``slow_rcvbuf``), push notifies, and measure one window.

        Returns (delivered events/s, daemon CPU seconds per delivered event, daemon RSS
        growth in bytes over warmup and window).
        """
        dialect = self.dialect
        pump = Pump()
        with ExitStack() as stack:
            stack.callback(pump.close)
            counters: list[EventCounter] = []
            for i in range(fetchers):
                sock = stack.enter_context(connect(self.daemon, dialect, f"fetcher-{i}"))
                counter = dialect.event_counter(self.keys[0])
                counters.append(counter)
                pump.add(Channel(sock, on_data=counter.feed)).write(dialect.fetch_all(1, f"f{next(_fetch_tags)}"))
            if slow_rcvbuf is not None:
                slow = stack.enter_context(connect(self.daemon, dialect, "slow-fetcher", rcvbuf=slow_rcvbuf))
                slow.sendall(dialect.fetch_all(1, f"f{next(_fetch_tags)}"))
            need = len(self.keys)
            pump.run_until(time.perf_counter() + 30,
                           lambda: all(c.answered and c.events >= need for c in counters))
            if not all(c.answered and c.events >= need for c in counters):
                raise BenchError("fetchers did not get their initial adds")
            owner_channel = pump.add(Channel(self.owner, on_data=self._owner_data, produce=lambda: self.block))
            rss0 = self.daemon.rss_bytes()
            pump.run_until(time.perf_counter() + (sizes.warmup if warmup is None else warmup))
            t0, cpu0, ev0 = time.perf_counter(), self.daemon.cpu_seconds(), sum(c.events for c in counters)
            gen0, sent0 = _own_cpu(), owner_channel.sent_bytes
            pump.run_until(t0 + sizes.window)
            # A daemon may deliver in bursts far apart (it may read the owner for a long
            # time before it writes): stretch the window until something has arrived.
            stretch = t0 + sizes.window + 10
            pump.run_until(stretch, lambda: sum(c.events for c in counters) > ev0)
            t1, cpu1, ev1 = time.perf_counter(), self.daemon.cpu_seconds(), sum(c.events for c in counters)
            self.generator_load = (_own_cpu() - gen0) / (t1 - t0)
            notifies = (owner_channel.sent_bytes - sent0) / self.notify_size
            self.delivered_share = (ev1 - ev0) / (notifies * fetchers) if notifies else 0.0
            rss1 = self.daemon.rss_bytes()
            # Stop producing, but never leave half a frame on the owner's stream.
            owner_channel.produce = None
            pump.run_until(time.perf_counter() + 30, lambda: not owner_channel.pending)
            if owner_channel.pending:
                raise BenchError("the daemon stopped reading the owner")
            pump.remove(owner_channel)
            self.owner.setblocking(True)
            self.owner.settimeout(30)
        _check_alive(self.daemon)
        events = ev1 - ev0
        if events <= 0:
            raise BenchError("no event delivered in the window")
        return events / (t1 - t0), (cpu1 - cpu0) / events, rss1 - rss0

    def _owner_data(self, data: bytes) -> None:
        self.owner_responses.feed(data)
        if self.owner_responses.errors:
            raise BenchError(f"notify failed: {self.owner_responses.first_error[:200]!r}")

    def drain_owner(self, seconds: float) -> None:
        """Read what the daemon still sends the owner (node-jet answers every change)."""
        self.owner.settimeout(0.05)
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                try:
                    data = self.owner.recv(1 << 20)
                except (TimeoutError, BlockingIOError):
                    break
                if not data:
                    raise BenchError("daemon closed the owner's connection")
                self._owner_data(data)
        finally:
            self.owner.settimeout(30)


def _fanout_setup(stack: ExitStack, daemon: DaemonProcess, dialect: Dialect, states: int) -> _FanOut:
    keys = _keys("w2/", states)
    # A small send buffer: the flood waits in the owner, not in a kernel backlog that the
    # daemon would still be working through when the next run's fetchers connect.
    owner = stack.enter_context(connect(daemon, dialect, "w2-owner", sndbuf=128 * 1024))
    add_states(owner, dialect, keys, [0] * len(keys))
    return _FanOut(daemon, dialect, owner, keys)


def w2_fanout(start: StartDaemon, dialect: Dialect, sizes: Sizes) -> list[Sample]:
    """W2: one owner notifying ``w2_states`` states as fast as it can; 1/10/50 fetchers of all."""
    samples = Samples()
    with start() as daemon, _closing_all() as stack:
        fanout = _fanout_setup(stack, daemon, dialect, sizes.w2_states)
        for fetchers in sizes.w2_fetchers:
            for _ in range(sizes.repeat):
                rate, cpu, _rss = fanout.run(fetchers, sizes)
                fanout.drain_owner(0.2)
                samples.add("W2 fan-out", f"{fetchers} fetchers: delivered events/s", "/s", rate)
                samples.add("W2 fan-out", f"{fetchers} fetchers: daemon CPU per delivered event", "µs", cpu * 1e6)
                samples.add("W2 fan-out", f"{fetchers} fetchers: delivered / (notifies sent x fetchers)", "ratio",
                            fanout.delivered_share)
                samples.add("W2 fan-out", f"{fetchers} fetchers: load generator CPU", "cores", fanout.generator_load)
    if "parked" in daemon.exit_stats:
        samples.add("W2 fan-out", "fetchers paused as slow consumers (all W2 runs)", "count",
                    daemon.exit_stats["parked"])
    return samples.list()


def w5_slow_consumer(start: StartDaemon, dialect: Dialect, sizes: Sizes) -> list[Sample]:
    """W5: W2 at ``w5_fetchers`` fetchers, without and with one extra fetcher that never
    reads (tiny SO_RCVBUF), in alternating order (AB BA AB ...) on one daemon, so that
    drift on a busy machine hits both sides alike."""
    samples = Samples()
    n = sizes.w5_fetchers
    alone: list[float] = []
    slowed: list[float] = []
    with start() as daemon, _closing_all() as stack:
        fanout = _fanout_setup(stack, daemon, dialect, sizes.w2_states)
        for rep in range(sizes.repeat):
            for with_slow in ((False, True) if rep % 2 == 0 else (True, False)):
                rate, cpu, rss = fanout.run(n, sizes, slow_rcvbuf=sizes.w5_rcvbuf if with_slow else None,
                                            warmup=sizes.w5_warmup)
                fanout.drain_owner(0.2)
                if with_slow:
                    slowed.append(rate)
                    samples.add("W5 slow consumer", f"{n} fetchers + 1 never reading: delivered events/s", "/s", rate)
                    samples.add("W5 slow consumer", "daemon CPU per delivered event, slow peer attached", "µs", cpu * 1e6)
                    samples.add("W5 slow consumer", "daemon RSS growth while the slow peer is attached", "MiB",
                                rss / (1 << 20))
                else:
                    alone.append(rate)
                    samples.add("W5 slow consumer", f"{n} fetchers: delivered events/s", "/s", rate)
                    samples.add("W5 slow consumer", "daemon CPU per delivered event, no slow peer", "µs", cpu * 1e6)
    labels = {"parked": "times a fetcher was paused as a slow consumer",
              "caught_up": "changes sent late, with the latest value,",
              "overloaded": "peers closed OVERLOADED"}
    for name, label in labels.items():
        if name in daemon.exit_stats:
            samples.add("W5 slow consumer", f"{label} by the daemon (all W5 runs)", "count", daemon.exit_stats[name])
    result = samples.list()
    # Each pair ran back to back, so machine load drifts less within a pair than across
    # the whole series: the headline is the median of the per-pair ratios.
    pair_ratios = [b / a for a, b in zip(alone, slowed, strict=True)]
    result.insert(0, Sample("W5 slow consumer", "rate with / without the slow peer (median of pairs)", "ratio",
                            pair_ratios))
    cpu_per_event = {s.metric: s.median for s in result if s.metric.startswith("daemon CPU per delivered event")}
    # Where the daemon is the bottleneck, rate ~ 1 / CPU per event: this ratio says how much
    # the slow peer costs the others without the machine's noise in it.
    result.insert(1, Sample("W5 slow consumer", "CPU per event without / with the slow peer", "ratio",
                            [cpu_per_event["daemon CPU per delivered event, no slow peer"]
                             / cpu_per_event["daemon CPU per delivered event, slow peer attached"]]))
    return result


# --- W3: fetch setup --------------------------------------------------------------------


def w3_fetch_setup(start: StartDaemon, dialect: Dialect, sizes: Sizes) -> list[Sample]:
    """W3: ``w3_states`` states cached; a new connection fetches all of them; time from
    sending the fetch until its last FETCH_ADD has arrived."""
    samples = Samples()
    count = sizes.w3_states
    keys = _keys("w3/", count)
    metric = f"fetch of {count:,} states: time to last add"
    with start() as daemon, _closing_all() as stack:
        owner = stack.enter_context(connect(daemon, dialect, "w3-owner"))
        add_states(owner, dialect, keys, list(range(count)))
        for rep in range(sizes.repeat + 1):
            with connect(daemon, dialect, "w3-fetcher") as fetcher:
                counter = dialect.event_counter(keys[0])
                chunks: list[bytes] = []
                frame = dialect.fetch_all(1, f"f{next(_fetch_tags)}")
                deadline = time.monotonic() + 60
                t0 = time.perf_counter()
                fetcher.sendall(frame)
                while counter.events < count:
                    data = fetcher.recv(1 << 20)
                    if not data:
                        raise BenchError("daemon closed the fetcher")
                    counter.feed(data)
                    chunks.append(data)
                    if time.monotonic() > deadline:
                        raise BenchError(f"only {counter.events} of {count} adds within 60 s")
                elapsed = time.perf_counter() - t0
            if rep == 0:
                # The first fetch is untimed: it checks what arrived, and warms the daemon up.
                if dialect.name == "jet":
                    _verify_jet_fetch(b"".join(chunks), keys)
                continue
            samples.add("W3 fetch setup", metric, "ms", elapsed * 1000)
        _check_alive(daemon)
    return samples.list()


def _verify_jet_fetch(stream: bytes, keys: list[str]) -> None:
    """PROTOCOL.md 10.5: the OK response first, then one FETCH_ADD per state in key order."""
    decoder = Decoder()
    decoder.receive_data(stream)
    messages = list(decoder.messages())
    first = messages[0] if messages else None
    if not isinstance(first, Response) or not first.ok or first.fetch_id is None:
        raise BenchError(f"fetch did not start with an OK response carrying a fetch id: {first!r}")
    adds = messages[1:]
    if len(adds) != len(keys) or not all(isinstance(m, FetchAdd) and m.fetch_id == first.fetch_id for m in adds):
        raise BenchError(f"expected {len(keys)} FETCH_ADDs after the response, got {len(adds)} messages")
    if [m.key for m in adds if isinstance(m, FetchAdd)] != sorted(keys, key=lambda k: k.encode()):
        raise BenchError("initial FETCH_ADDs are not in byte order of key")


# --- W4: memory -------------------------------------------------------------------------


def w4_memory(start: StartDaemon, dialect: Dialect, sizes: Sizes) -> list[Sample]:
    """W4: daemon RSS growth per cached INT64 state and per idle connection, each on a fresh daemon."""
    samples = Samples()
    count = sizes.w4_states
    keys = _keys("w4/", count)
    half = count // 2
    for _ in range(min(sizes.repeat, 3)):
        with start() as daemon, _closing_all() as stack:
            # Two owners: stays clear of a per-connection state limit of 100,000.
            owners = [stack.enter_context(connect(daemon, dialect, f"w4-owner-{i}")) for i in range(2)]
            time.sleep(0.2)
            rss0 = daemon.rss_bytes()
            add_states(owners[0], dialect, keys[:half], list(range(half)))
            add_states(owners[1], dialect, keys[half:], list(range(half, count)))
            time.sleep(0.5)
            rss1 = daemon.rss_bytes()
            _check_alive(daemon)
        samples.add("W4 memory", f"RSS per cached state ({count:,} INT64 states)", "B", (rss1 - rss0) / count)
        with start() as daemon, _closing_all() as stack:
            stack.enter_context(connect(daemon, dialect, "w4-control"))
            time.sleep(0.2)
            rss0 = daemon.rss_bytes()
            peers = [stack.enter_context(connect(daemon, dialect, f"idle-{i}")) for i in range(sizes.w4_connections)]
            if not dialect.greets():
                # Nothing proves node-jet set the connection up until it answers: ask for info.
                for i, peer in enumerate(peers):
                    peer.sendall(dialect.info_request(i + 1))
                deadline = time.monotonic() + 60
                for peer in peers:
                    wait_responses(peer, dialect.response_scanner(), 1, deadline)
            time.sleep(0.5)
            rss1 = daemon.rss_bytes()
            _check_alive(daemon)
        samples.add("W4 memory", f"RSS per idle connection ({sizes.w4_connections:,} peers)", "KiB",
                    (rss1 - rss0) / sizes.w4_connections / 1024)
    return samples.list()


WORKLOADS: dict[str, Callable[[StartDaemon, Dialect, Sizes], list[Sample]]] = {
    "W1": w1_routed_set,
    "W2": w2_fanout,
    "W3": w3_fetch_setup,
    "W4": w4_memory,
    "W5": w5_slow_consumer,
}
