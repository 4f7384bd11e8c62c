"""14-security: authentication that cannot be starved (PROTOCOL.md 15.2, issue 29).

The bounded queue of password checks, checks of closed connections dropped unrun, and
the growing delay per source address and per user: first in the sans-IO core with the
checks deferred (as the IO layer runs them in threads), counted exactly; then end to end
against a real jetd over TCP, with argon2 checks that really cost CPU."""

from __future__ import annotations

import re
import socket
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from jetd.access import CHECKS_AT_ONCE
from jetd.access import FREE_FAILURES
from jetd.access import Access
from jetd.access import source_of
from jetd.users import User
from jetd.users import UsersFile
from jetwire import Authenticate
from jetwire import Close
from jetwire import Message
from jetwire import Response
from jetwire import Status
from jetwire import encode
from tests.conftest import DaemonProcess
from tests.jetd.jetd_testlib import RawPeer
from tests.jetd.test_14_access_core import Harness
from tests.jetd.test_14_access_core import cheap_hash

BUSY = "too many authentications waiting, try again later"
FAILED = "authentication failed"


def make_access() -> Access:
    users = UsersFile()
    users.users["alice"] = User(password=cheap_hash("a"), read=["p/"])
    users.users["bob"] = User(password=cheap_hash("b"), read=["p/"])
    return Access(users)


# The in-memory tests count on 2 checks at once, whatever this machine's cores make of
# CHECKS_AT_ONCE (jetd.access.checks_at_once); the TCP tests below take the daemon's.
AT_ONCE = 2


class Core(Harness):
    """The access tests' in-memory daemon, with alice and bob; password checks are
    deferred and counted (``run``) until :meth:`finish_checks`; AT_ONCE run at once."""

    def __init__(self, **settings: object) -> None:
        super().__init__(make_access(), **settings)
        self.daemon.auth.checks.at_once = AT_ONCE


def test_source_of_groups_by_host_and_ipv6_slash_64() -> None:
    assert source_of("10.1.2.3:5555") == "10.1.2.3"
    assert source_of("[2001:db8:1:2::7]:5555") == source_of("[2001:db8:1:2:ffff::1]:6") == "2001:db8:1:2::/64"
    assert source_of("mem") == "mem"


def test_checks_of_closed_connections_are_not_run() -> None:
    """60 connections each send one wrong AUTHENTICATE and close: only the checks that
    had started run; the queued ones are dropped, the rest were refused at once."""
    core = Core(auth_queue=64)
    conns = [core.connect(f"10.0.0.9:{1000 + i}") for i in range(60)]
    for conn in conns:
        core.send(conn, Authenticate(1, "alice", "wrong"))
    for conn in conns:
        core.daemon.disconnect(conn, core.now)
    while core.finish_checks():
        core.tick(0.1)
    core.tick(0.1)
    checks = core.daemon.auth.checks
    assert core.run == checks.run == AT_ONCE  # not 60
    assert checks.dropped == 64 // 4  # one source holds a quarter of the queue
    assert checks.refused == 60 - AT_ONCE - 64 // 4
    assert checks.queued == 0 and checks.running == 0
    # The two that ran still count against the source and the user: closing does not dodge.
    assert checks.records["s10.0.0.9"].failures == AT_ONCE
    assert checks.records["ualice"].failures == AT_ONCE


def test_a_full_queue_answers_overloaded_unqueued() -> None:
    core = Core(auth_queue=4, auth_failure_delay=0.5)  # a source may hold 1 waiting check
    same = [core.connect(f"10.0.0.1:{i}") for i in range(4)]
    for conn in same:
        core.send(conn, Authenticate(7, "alice", "wrong"))
    # AT_ONCE run, one waits, the 4th from that address is refused unchecked ...
    assert core.daemon.auth.checks.refused == 1 and len(core.jobs) == AT_ONCE
    others = [core.connect(f"10.0.1.{i}:1") for i in range(4)]
    for conn in others:
        core.send(conn, Authenticate(8, "bob", "wrong"))
    # ... and with 4 waiting the queue is full for every address.
    assert core.daemon.auth.checks.refused == 2 and core.daemon.auth.checks.queued == 4
    # The refusals are answered after the failure delay, the connection unread meanwhile.
    assert [core.recv(c) for c in [*same, *others]] == [[]] * 8
    core.tick(0.5)
    assert core.recv(same[3]) == [Response(7, Status.OVERLOADED, message=BUSY)]
    assert core.recv(others[3]) == [Response(8, Status.OVERLOADED, message=BUSY)]
    assert [core.recv(c) for c in [*same[:3], *others[:3]]] == [[]] * 6
    assert len(core.jobs) == AT_ONCE  # nothing more was checked
    # A refused connection is released, not counted as failing: it may try again.
    assert not same[3].held and not same[3].closing and same[3].auth_failures == 0


def test_another_address_goes_before_a_flooding_one() -> None:
    """Round-robin by source: the real user's check is the next to start, not the 16th."""
    core = Core(auth_queue=64)
    flood = [core.connect(f"10.0.0.66:{i}") for i in range(18)]
    for conn in flood:
        core.send(conn, Authenticate(1, "bob", "wrong"))
    alice = core.connect("10.0.0.7:1")
    core.send(alice, Authenticate(2, "alice", "a"))
    assert core.finish_checks() == AT_ONCE  # two of the flood
    assert core.recv(alice) == []
    core.finish_checks()  # alice's and one more of the flood
    assert core.recv(alice) == [Response(2, Status.OK)]
    assert core.daemon.auth.checks.queued == 18 + 1 - 3 * AT_ONCE  # each finished check starts one


def test_round_robin_goes_on_after_a_source_whose_queue_ran_empty() -> None:
    """With one check at once (jetd on 2 cores): the flood's first check starts at once,
    emptying its address's queue; the 17 that follow fill it again before alice's
    arrives. Alice's check still starts next, not after a second one of the flood."""
    core = Core(auth_queue=64)
    core.daemon.auth.checks.at_once = 1
    flood = [core.connect(f"10.0.0.66:{i}") for i in range(18)]
    for conn in flood:
        core.send(conn, Authenticate(1, "bob", "wrong"))
    alice = core.connect("10.0.0.7:1")
    core.send(alice, Authenticate(2, "alice", "a"))
    assert core.finish_checks() == 1  # the flood's first
    assert core.finish_checks() == 1  # alice's
    assert core.recv(alice) == [Response(2, Status.OK)]
    assert core.daemon.auth.checks.queued == 16 + 1 - 2  # the flood's share of 16 waited, and alice


def _fail_and_time(core: Core, address: str, user: str) -> float:
    """One wrong AUTHENTICATE from a new connection: how long its AUTH_FAILED took
    (ticks of 1/8 s: exact in binary), with its check started at once."""
    conn = core.connect(address)
    core.send(conn, Authenticate(3, user, "wrong"))
    assert core.finish_checks() == 1  # started at once, not held back
    started = core.now
    while not core.recv(conn):
        core.tick(0.125)
    core.daemon.disconnect(conn, core.now)
    return round(core.now - started, 2)


def test_the_delay_grows_per_source() -> None:
    core = Core(auth_failure_delay=0.5, auth_failure_delay_max=4.0)
    # Different users from one address: the address's count grows.
    delays = [_fail_and_time(core, "10.0.0.5:1", f"nobody{i}") for i in range(FREE_FAILURES + 5)]
    assert delays == [0.5] * FREE_FAILURES + [1.0, 2.0, 4.0, 4.0, 4.0]
    # Another address is not delayed by it.
    assert _fail_and_time(core, "10.0.0.6:1", "nobody-else") == 0.5


def test_the_delay_grows_per_user_and_holds_back_its_next_check() -> None:
    core = Core(auth_failure_delay=0.5, auth_failure_delay_max=30.0)
    delays = [_fail_and_time(core, f"10.0.2.{i}:1", "alice") for i in range(FREE_FAILURES + 1)]
    assert delays == [0.5] * FREE_FAILURES + [1.0]
    # The next failure for alice (from yet another address) is answered in 2 s ...
    guesser = core.connect("10.0.2.99:1")
    core.send(guesser, Authenticate(3, "alice", "wrong"))
    assert core.finish_checks() == 1
    # ... and no check for alice starts before then from an address that has failed,
    # even with the right password (a guesser cannot tell) ...
    held = core.connect("10.0.2.0:2")
    core.send(held, Authenticate(4, "alice", "a"))
    core.tick(1.0)
    assert core.jobs == [] and core.recv(held) == []
    # ... while alice logs in at once from an address that has not failed.
    real = core.connect("10.0.3.1:1")
    core.send(real, Authenticate(5, "alice", "a"))
    assert len(core.jobs) == 1
    assert core.finish_checks() == 1
    assert core.recv(real) == [Response(5, Status.OK)]
    # Her login clears the user's record (so the held check starts); addresses keep theirs.
    assert "ualice" not in core.daemon.auth.checks.records
    assert "s10.0.2.99" in core.daemon.auth.checks.records
    assert core.finish_checks() == 1
    assert core.recv(held) == [Response(4, Status.OK)]
    # The guesser's answer still comes when due.
    core.tick(0.875)
    assert core.recv(guesser) == []
    core.tick(0.125)
    assert core.recv(guesser) == [Response(3, Status.AUTH_FAILED, message=FAILED)]
    # bob is not delayed by alice's failures.
    assert _fail_and_time(core, "10.0.4.1:1", "bob") == 0.5


def test_long_user_names_are_remembered_small() -> None:
    core = Core(auth_failure_delay=0.5)
    name = "x" * 60_000
    assert _fail_and_time(core, "10.0.5.1:1", name) == 0.5
    keys = list(core.daemon.auth.checks.records)
    assert keys[0] == "s10.0.5.1" and len(keys) == 2 and len(keys[1]) <= 33
    assert core.daemon.auth.checks.records[keys[1]].failures == 1


def test_the_fifth_failure_on_one_connection_still_closes() -> None:
    core = Core(auth_failure_delay=0.1)
    conn = core.connect("10.0.0.8:1")
    for attempt in range(5):
        core.send(conn, Authenticate(attempt, "alice", "wrong"))
        assert core.finish_checks() == 1
        answers: list[Message] = []
        while not answers:
            core.tick(0.05)
            answers = core.recv(conn)
        assert answers[0] == Response(attempt, Status.AUTH_FAILED, message=FAILED)
    assert answers[1:] == [Close(Status.AUTH_FAILED, "too many failed authentications")]


def test_an_ended_check_is_acted_on_in_the_schedulers_turn() -> None:
    """Issue 29: one design runs all deferred work. A check whose thread ended only
    records its outcome; its answer, and the input held behind it, come in the next turn
    of the core's work (Daemon.work, which the IO layer runs as for any deferred work),
    not inside the IO layer's callback."""
    core = Core()
    conn = core.connect("10.0.0.3:1")
    core.send(conn, Authenticate(1, "alice", "a"), Authenticate(2, "alice", "a"))
    [(job, done)] = core.jobs
    core.jobs.clear()
    done(job())
    assert core.daemon.auth.completed and core.daemon.has_work
    assert core.recv(conn) == [] and conn.held and conn.user is None  # not acted on yet
    assert core.daemon.auth.checks.running == 1  # still counted until then: no other starts
    core.daemon.work(core.now)
    assert not core.daemon.auth.completed and not core.daemon.has_work
    assert conn.user == "alice" and not conn.held
    # The frame held behind it was read in the same turn.
    assert core.recv(conn) == [Response(1, Status.OK),
                               Response(2, Status.NOT_AUTHORIZED, message="already authenticated as alice")]


def test_ended_checks_are_acted_on_a_slice_at_a_time() -> None:
    """The answers of checks that ended together are sliced like all the scheduler's
    work: a turn acts on at least one, and stops once the slice's time is up (here at
    once, by a clock that jumps a second a reading); the rest come in later turns, so
    that other connections' work interleaves."""
    core = Core(auth_queue=64)
    core.daemon.auth.checks.at_once = 4  # as on a machine with 5 cores or more
    ticks = iter(range(10**6))
    core.daemon.scheduler.clock = lambda: float(next(ticks))
    conns = [core.connect(f"10.0.1.{i}:1") for i in range(4)]
    for conn in conns:
        core.send(conn, Authenticate(1, "bob", "b"))
    assert len(core.jobs) == 4
    for job, done in core.jobs:
        done(job())
    core.jobs.clear()
    for turn in range(1, 5):
        core.daemon.work(core.now)
        assert [c.user for c in conns] == ["bob"] * turn + [None] * (4 - turn)
    assert not core.daemon.has_work


# --- end to end: a real jetd over TCP ---------------------------------------------------



@pytest.fixture
def slow_users(tmp_path: Path) -> Path:
    from argon2 import PasswordHasher

    users = UsersFile()
    # argon2id at its default cost, as jetd user add writes it: 0.15-0.3 s of CPU a check here.
    users.users["alice"] = User(password=PasswordHasher().hash("alice-pw"), read=["p/"])
    path = tmp_path / "users.toml"
    users.save(path)
    return path


IDLE_LINE = re.compile(r"password checks idle: (\d+) run, (\d+) dropped \(connection closed\), (\d+) refused")


def _totals(daemon: DaemonProcess, expected: int, timeout: float = 120.0) -> tuple[int, int, int]:
    """The counters of the last 'password checks idle' line, once they add up to ``expected``."""
    deadline = time.monotonic() + timeout
    last = (0, 0, 0)
    while time.monotonic() < deadline:
        found = IDLE_LINE.findall(daemon.stderr())
        if found:
            last = tuple(int(x) for x in found[-1])  # type: ignore[assignment]
            if sum(last) >= expected:
                return last
        time.sleep(0.2)
    raise AssertionError(f"password checks did not settle: last totals {last}\n{daemon.stderr()[-3000:]}")


def test_tcp_flood_of_closed_connections_runs_few_checks(start_jetd: Callable[..., DaemonProcess],
                                                         slow_users: Path) -> None:
    """Reproduces issue 29: 60 connections each send one wrong AUTHENTICATE and close.
    Before the fix all 60 checks ran; now only those started before the peers closed."""
    daemon = start_jetd("--auth", str(slow_users), "--auth-failure-delay", "0.2", "--log-level", "INFO")
    frame = encode(Authenticate(1, "alice", "wrong"))
    socks = [socket.create_connection(daemon.address, timeout=30) for _ in range(60)]
    try:
        for sock in socks:
            sock.sendall(frame)
            sock.shutdown(socket.SHUT_WR)  # the peer goes: EOF right behind its AUTHENTICATE
    finally:
        for sock in socks:
            sock.close()
    run, dropped, refused = _totals(daemon, 60)
    assert run + dropped + refused == 60
    # Started before the daemon saw the peers go: CHECKS_AT_ONCE, a few more at most on a
    # loaded machine; never the 60 of the issue.
    assert run <= 4 * CHECKS_AT_ONCE, (run, dropped, refused)
    # Then a real user logs in.
    with RawPeer(daemon.address) as alice:
        answer = alice.request(lambda rid: Authenticate(rid, "alice", "alice-pw"), timeout=60)
        assert answer.status == Status.OK


def test_tcp_full_queue_answers_overloaded(start_jetd: Callable[..., DaemonProcess], slow_users: Path) -> None:
    """60 connections from one address each send a wrong AUTHENTICATE and wait: those
    beyond what runs and what may wait (a quarter of --auth-queue for one address) are
    answered OVERLOADED, unchecked; every one gets exactly one answer."""
    daemon = start_jetd("--auth", str(slow_users), "--auth-queue", "8", "--auth-failure-delay", "0.2",
                        "--log-level", "INFO")
    peers = [RawPeer(daemon.address) for _ in range(60)]
    try:
        for peer in peers:
            peer.send(Authenticate(5, "alice", "wrong"))
        answers: Counter[Status] = Counter()
        for peer in peers:
            answer = peer.recv(timeout=120)
            assert answer in (Response(5, Status.OVERLOADED, message=BUSY),
                              Response(5, Status.AUTH_FAILED, message=FAILED)), answer
            answers[answer.status] += 1
    finally:
        for peer in peers:
            peer.close()
    run, dropped, refused = _totals(daemon, 60)
    assert (run, dropped) == (answers[Status.AUTH_FAILED], 0)
    assert refused == answers[Status.OVERLOADED]
    # At most CHECKS_AT_ONCE ran and 2 waited while the 60 arrived (a few more on a
    # loaded machine, where checks may end before the last ones arrive).
    assert answers[Status.OVERLOADED] >= 60 - 4 * (CHECKS_AT_ONCE + 2), answers
