"""Access control (PROTOCOL.md 15): users and their permissions, compiled for speed, and
the daemon's side of authentication.

- :class:`PrefixSet` compiles a list of key prefixes like the fetch index does
  (:class:`jetd.subscriptions.FetchRegistry`): a set of prefixes and the distinct
  lengths in use, so a check slices the key once per length (usually one or two).
- :class:`Permissions` is one user's compiled ``own``/``read``/``write``.
- :class:`Access` is a loaded users file: permissions per user, password checks.
- :class:`AccessControl` is the access part of :class:`jetd.core.Daemon`: AUTHENTICATE, the
  per-failure delay, the failure limit and the auth timeout, the checks the handlers
  call, and applying new permissions to a connection (on authentication and on SIGHUP).
- :class:`FailureRecord` and :class:`PasswordChecks` keep password checks cheap to attack
  (PROTOCOL.md 15.2): at most :data:`CHECKS_AT_ONCE` run (:func:`checks_at_once`: one
  core is left to the event loop), the rest wait in a bounded
  queue taken round-robin by source address, a waiting check whose connection closed is
  dropped unrun, and a source address or user with many recent failures waits a growing
  delay before its next check may start.

What the hot paths pay: without ``--auth`` a connection's ``perms`` and ``writable`` are
None and nothing is checked. With it, ``read`` costs nothing per event: a fetch is
indexed under the prefixes it may read (:meth:`PrefixSet.narrow`), so the fetch index
itself filters. ``write`` is cached per connection: ``conn.writable`` holds the keys it
may write, which the routed-SET fast path tests inline; ``own`` and GET's ``read`` are checked directly.
Every cache is dropped when permissions change (:meth:`AccessControl.set_access`).
"""

from __future__ import annotations

import hashlib
import heapq
import ipaddress
import logging
import os
from collections import deque
from collections.abc import Callable
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Optional

from jetwire import Authenticate
from jetwire import Function
from jetwire import RemoteProtocolError
from jetwire import Status
from jetwire import decode_body
from jetwire.codec import is_utf8
from jetwire.log import LogKind
from jetwire.log import conn_auth_data

from .base import Clock
from .base import Output
from .config import Config
from .connection import Connection
from .frames import FRAME_IN
from .frames import REQUEST
from .frames import LogHook
from .frames import close_frame
from .frames import ok_frame
from .users import UsersFile
from .users import verify_password

if TYPE_CHECKING:
    from .querying import Queries
    from .scheduler import Scheduler
    from .subscriptions import Subscriptions

__all__ = [
    "AUTHENTICATE",
    "CHECKS_AT_ONCE",
    "CHECKS_AT_ONCE_MAX",
    "FREE_FAILURES",
    "MAX_AUTH_FAILURES",
    "QUERY_FUNCTIONS",
    "Access",
    "AccessControl",
    "FailureRecord",
    "Offload",
    "PasswordCheck",
    "PasswordChecks",
    "Permissions",
    "PrefixSet",
    "checks_at_once",
    "intersect",
    "mask_authenticate",
    "source_of",
    "usable_cores",
]

log = logging.getLogger("jetd")

AUTHENTICATE = Function.AUTHENTICATE.value  # a plain int for the dispatcher's comparisons
# PROTOCOL.md 15.3: refused to a connection that may not read every key.
QUERY_FUNCTIONS = frozenset({Function.FETCH_QUERY.value, Function.QUERY_ONCE.value})
MAX_AUTH_FAILURES = 5  # PROTOCOL.md 15.2: CLOSE after the 5th AUTH_FAILED
AUTH_BUSY = "too many authentications waiting, try again later"  # PROTOCOL.md 15.2, with OVERLOADED
WRITABLE_CACHE_MAX = 4096  # keys cached per connection; a peer probing many keys resets it
# PROTOCOL.md 15.2: password checks that run at once, at most: each holds its hash's
# memory (64 MiB at argon2id's default cost), so this bounds what checks hold.
CHECKS_AT_ONCE_MAX = 2
# PROTOCOL.md 15.2: failures of one source address or user before its delay starts to grow.
FREE_FAILURES = MAX_AUTH_FAILURES
FAILURE_MEMORY = 600.0  # seconds after its last failure that a source or user is forgotten
FAILURE_RECORDS_MAX = 100_000  # sources and users remembered; the oldest go first
USER_KEY_MAX = 64  # longer user names are remembered by a digest (user_key)
# Issue 29: connections brought in line with a reloaded users file per slice, at most
# (the ceiling without a clock; the clock is read after each connection).
REINDEX_SLICE = 256
AUTH_BY_PASSWORD = 1  # JETLOG.md 4 CONN_AUTH method
AUTH_BY_CERTIFICATE = 2

Offload = Callable[[Callable[[], bool], Callable[[bool], None]], None]
"""``offload(job, done)``: run ``job`` (a slow password check) off the loop, then call
``done(result)`` on the loop's thread. ``done`` only records the outcome; the next turn
of the scheduler acts on it (:meth:`AccessControl.finish_checks`, called by
:meth:`jetd.core.Daemon.work`), so the IO layer must then have the core's work run. The
IO layer provides one; without it the check runs inline and completes at once."""


def checks_at_once(cores: int) -> int:
    """How many password checks run at once on a machine with ``cores`` usable cores
    (PROTOCOL.md 15.2, issue 29): one core is left to the event loop, since each check
    takes one core (:func:`jetd.users.verify_password` runs on one thread); at least
    one, at most :data:`CHECKS_AT_ONCE_MAX`. Measured on 2 cores (BENCHMARKS.md, issue
    29): one check at once kept other peers' GET latency during a login flood as a
    lower CPU priority did, without starving checks when the machine is busy."""
    return max(1, min(CHECKS_AT_ONCE_MAX, cores - 1))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


# This machine's: the IO layer runs the checks on as many threads.
CHECKS_AT_ONCE = checks_at_once(usable_cores())


class PrefixSet:
    """A compiled list of key prefixes (bytes; ``b""`` matches every key).

    Only the minimal prefixes are kept (one that has a shorter one in the list adds
    nothing), so the prefixes it yields never overlap.
    """

    __slots__ = ("everything", "lengths", "prefixes")

    def __init__(self, prefixes: Iterable[bytes]) -> None:
        minimal: set[bytes] = set()
        for prefix in sorted(set(prefixes), key=len):
            if not any(prefix[:n] in minimal for n in range(len(prefix) + 1)):
                minimal.add(prefix)
        self.prefixes = frozenset(minimal)
        self.lengths = sorted({len(p) for p in minimal})
        self.everything = b"" in minimal

    @property
    def empty(self) -> bool:
        return not self.prefixes

    def matches(self, key: bytes) -> bool:
        """True if ``key`` starts with one of the prefixes."""
        if self.everything:
            return True
        prefixes = self.prefixes
        klen = len(key)
        for n in self.lengths:
            if n > klen:
                return False
            if key[:n] in prefixes:
                return True
        return False

    def narrow(self, prefix: bytes) -> tuple[bytes, ...]:
        """The prefixes, sorted and disjoint, whose keys are exactly the keys that start
        with ``prefix`` and match this set (PROTOCOL.md 15.4): ``(prefix,)`` when the set
        covers it, else the set's prefixes that extend it (possibly none)."""
        if self.matches(prefix):
            return (prefix,)
        return tuple(sorted(p for p in self.prefixes if p.startswith(prefix)))


def intersect(a: PrefixSet, b: PrefixSet) -> PrefixSet:
    """The keys that match both ``a`` and ``b``, as a PrefixSet: of two prefixes where one
    starts with the other, the longer one (prefixes that do not nest share no key)."""
    both: list[bytes] = []
    for p in a.prefixes:
        for q in b.prefixes:
            if q.startswith(p):
                both.append(q)
            elif p.startswith(q):
                both.append(p)
    return PrefixSet(both)


class Permissions:
    """One connection's compiled permissions (PROTOCOL.md 15.1).

    ``own`` and ``write`` are what takes effect: the granted lists narrowed to the keys
    that ``read`` allows too (PROTOCOL.md 15.3, so that no answer tells anything about
    a key the connection may not read); ``granted_own`` and ``granted_write`` are the
    lists as granted, for naming the missing permission in a refusal."""

    __slots__ = ("granted_own", "granted_write", "nothing", "own", "read", "user", "write")

    def __init__(self, user: Optional[str], own: Iterable[str], read: Iterable[str], write: Iterable[str]) -> None:
        self.user = user
        self.granted_own = PrefixSet(p.encode("utf-8") for p in own)
        self.read = PrefixSet(p.encode("utf-8") for p in read)
        self.granted_write = PrefixSet(p.encode("utf-8") for p in write)
        self.own = intersect(self.granted_own, self.read)
        self.write = intersect(self.granted_write, self.read)
        # PROTOCOL.md 15.2: a connection without any permission gets NOT_AUTHORIZED for
        # every function but AUTHENTICATE.
        self.nothing = self.granted_own.empty and self.read.empty and self.granted_write.empty

    def missing(self, permission: str, key: bytes) -> str:
        """The permission to name when ``permission`` (``own``, ``read``, ``write``) of
        ``key`` is refused: ``read`` when it was granted but ``read`` was not."""
        if permission == "own" and self.granted_own.matches(key):
            return "read"
        if permission == "write" and self.granted_write.matches(key):
            return "read"
        return permission


class Access:
    """A loaded users file, compiled: what the daemon consults (PROTOCOL.md 15).

    Raises (from :meth:`load`): :class:`jetd.users.UsersFileError`.
    """

    def __init__(self, users: UsersFile, source: str = "") -> None:
        self.users = users
        self.source = source
        self.anonymous = self._compile(None)
        self._compiled: dict[str, Permissions] = {}
        # Checked when the user is unknown, so that it costs what a wrong password does.
        self._dummy_hash = next((u.password for u in users.users.values() if u.password), None)

    @classmethod
    def load(cls, path: str) -> Access:
        """Load and compile the users file at ``path``; warns (log) about every ``own``
        or ``write`` prefix that ``read`` does not cover, since it takes effect only
        where ``read`` does (PROTOCOL.md 15.3)."""
        access = cls(UsersFile.load(path), path)
        for line in access.partly_ineffective():
            log.warning("users file %s: %s", path, line)
        return access

    def partly_ineffective(self) -> list[str]:
        """One line per granted ``own``/``write`` prefix not covered by its holder's
        ``read`` (the anonymous entry and every user)."""
        lines = []
        holders: list[tuple[str, Permissions]] = [("anonymous entry", self.anonymous)]
        holders += [(f"user {name}", self.permissions(name)) for name in sorted(self.users.users)]
        for who, perms in holders:
            for permission, granted in (("own", perms.granted_own), ("write", perms.granted_write)):
                for prefix in sorted(granted.prefixes):
                    if not perms.read.matches(prefix):
                        shown = prefix.decode("utf-8", "replace")
                        lines.append(f"{who}: {permission} {shown!r} takes effect only on keys it may also read")
        return lines

    def _compile(self, name: Optional[str]) -> Permissions:
        grants = self.users.grants_of(name)
        return Permissions(name, grants.own, grants.read, grants.write)

    def permissions(self, name: str) -> Permissions:
        """The compiled permissions of user ``name`` (none for a name not in the file)."""
        perms = self._compiled.get(name)
        if perms is None:
            perms = self._compiled[name] = self._compile(name)
        return perms

    def knows(self, name: str) -> bool:
        return name in self.users.users

    def password_of(self, name: str) -> Optional[str]:
        """The stored hash of user ``name`` (None: no such user, or no password)."""
        user = self.users.users.get(name)
        return user.password if user is not None else None

    def verify(self, name: str, password: str) -> bool:
        """True if ``name`` is a user with a password and ``password`` is it (argon2id
        on the calling thread alone, :func:`jetd.users.verify_password`; slow on
        purpose: run it off the event loop)."""
        user = self.users.users.get(name)
        stored = user.password if user is not None else None
        try:
            if stored is None:
                if self._dummy_hash is not None:
                    # The same work as for a real user: no timing tells which names exist.
                    verify_password(self._dummy_hash, password + "\x00not-a-user")
                return False
            return verify_password(stored, password)
        except ValueError:  # not an argon2id hash (the users file's loader checks the prefix only)
            return False

    @property
    def timeout_applies(self) -> bool:
        """PROTOCOL.md 15.2: the auth timeout closes unauthenticated connections only when
        the anonymous entry grants nothing."""
        return self.anonymous.nothing


def mask_authenticate(frame: bytes) -> bytes:
    """An AUTHENTICATE frame with its password replaced by an empty str16 (JETLOG.md 4:
    the event log never holds a password, nor its length). Other frames unchanged."""
    if len(frame) < 12 or frame[0] != REQUEST or frame[9] != 0x10:
        return frame
    ulen = int.from_bytes(frame[10:12], "big")
    head_end = 12 + ulen
    if head_end > len(frame):
        return frame[:10]  # malformed: keep only what cannot hold a secret
    body = frame[5:head_end] + b"\x00\x00"
    return bytes((REQUEST,)) + len(body).to_bytes(4, "big") + body


def source_of(address: str) -> str:
    """The source a connection's failures are counted under (PROTOCOL.md 15.2): the host
    of ``address`` (``host:port``), an IPv6 host narrowed to its /64 (one machine usually
    holds a whole /64). An address without a port (a Unix socket, an in-memory peer)
    is its own source."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return host


def user_key(user: str) -> str:
    """The failure-record key of ``user``: the name, or a digest of a long one (a guesser
    may send names of up to 64 KiB; what the daemon remembers per name stays small)."""
    if len(user) <= USER_KEY_MAX:
        return "u" + user
    return "U" + hashlib.blake2b(user.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class FailureRecord:
    """Recent AUTH_FAILED answers of one source address or one user (PROTOCOL.md 15.2)."""

    __slots__ = ("failures", "last", "until")

    def __init__(self) -> None:
        self.failures = 0
        self.last = 0.0  # when the last failure was counted
        self.until = 0.0  # no check of this source or user starts before then


def _never_gone(conn: Connection) -> bool:
    return False


class PasswordCheck:
    """One AUTHENTICATE waiting for, or undergoing, its password check."""

    __slots__ = ("access", "checked", "conn", "frame", "password", "rid", "source", "user")

    def __init__(self, access: Access, conn: Connection, rid: int, user: str, password: str, frame: bytes,
                 checked: Optional[str], source: str) -> None:
        self.access = access  # the users file in force when it was asked
        self.conn = conn
        self.rid = rid
        self.user = user
        self.password = password
        self.frame = frame
        self.checked = checked  # the stored hash when it was asked (see AccessControl._auth_done)
        self.source = source


class PasswordChecks:
    """The bounded queue of password checks (PROTOCOL.md 15.2), sans-IO.

    Waiting checks are kept per source address and taken round-robin across sources, so
    a flood from one address delays another address's login by at most the checks
    already running. A source holds at most a quarter of ``limit``. The failure records
    per source and per user decide when a check may start (:meth:`blocked_until`).

    Attributes:
        run, dropped, refused: counters: checks started, checks dropped because their
            connection closed while they waited, AUTHENTICATEs refused with a full queue.
    """

    def __init__(self, limit: int, delay: float, delay_max: float, at_once: int = CHECKS_AT_ONCE) -> None:
        if at_once < 1:
            raise ValueError(f"at_once must be at least 1, got {at_once}")
        self.limit = limit
        self.at_once = at_once
        self.per_source = max(1, limit // 4)
        self.delay = delay
        self.delay_max = delay_max
        self.waiting: dict[str, deque[PasswordCheck]] = {}  # by source, in round-robin order
        self.queued = 0
        self.running = 0
        self.records: dict[str, FailureRecord] = {}  # "s" + source or "u" + user, oldest first
        self.run = 0
        self.dropped = 0
        self.refused = 0
        self.busy = False  # offered a check since the queue was last idle
        self.last_source = ""  # whose check started last (round-robin, take)

    def offer(self, check: PasswordCheck) -> bool:
        """Queue ``check``; False (not queued) when the queue or its source's share is full."""
        self.busy = True
        self.purge()
        mine = self.waiting.get(check.source)
        if self.queued >= self.limit or (mine is not None and len(mine) >= self.per_source):
            self.refused += 1
            return False
        if mine is None:
            mine = self.waiting[check.source] = deque()
        mine.append(check)
        self.queued += 1
        return True

    def purge(self, gone: Callable[[Connection], bool] = _never_gone) -> int:
        """Drop the waiting checks of closed connections, unrun (``gone(conn)``: the IO
        layer's word that a peer whose reading is paused has gone); returns how many."""
        dropped = 0
        # The IO layer closes a gone peer's connection; its disconnect comes later.
        dead = {id(c.conn) for q in self.waiting.values() for c in q if c.conn.closing or gone(c.conn)}
        for source in [s for s, q in self.waiting.items() if any(id(c.conn) in dead for c in q)]:
            checks = self.waiting[source]
            kept = deque(c for c in checks if id(c.conn) not in dead)
            for check in checks:
                if id(check.conn) in dead:
                    check.conn.held = False
            dropped += len(checks) - len(kept)
            if kept:
                self.waiting[source] = kept
            else:
                del self.waiting[source]
        self.queued -= dropped
        self.dropped += dropped
        return dropped

    def take(self, now: float) -> Optional[PasswordCheck]:
        """The next check allowed to start now (round-robin by source), or None: none
        waits, ``at_once`` run, or every waiting source or user is delayed."""
        if self.running >= self.at_once or not self.queued:
            return None
        waiting = self.waiting
        last = self.last_source
        if len(waiting) > 1 and next(iter(waiting)) == last:
            # Its queue ran empty when its check started and has filled again since:
            # it goes after the sources that were waiting meanwhile, not before them.
            waiting[last] = waiting.pop(last)
        for source in list(waiting):
            checks = self.waiting[source]
            if self.blocked_until(checks[0], now) > now:
                continue
            check = checks.popleft()
            del self.waiting[source]  # to the end of the round
            if checks:
                self.waiting[source] = checks
            self.queued -= 1
            self.running += 1
            self.run += 1
            self.last_source = source
            return check
        return None

    def finished(self) -> None:
        self.running -= 1

    def next_start(self, now: float) -> float:
        """When a delayed waiting check may start (``now`` or earlier when one can)."""
        return min((self.blocked_until(q[0], now) for q in self.waiting.values()), default=now)

    def blocked_until(self, check: PasswordCheck, now: float) -> float:
        """The time before which ``check`` may not start: its source's ``until``, and
        its user's when its source has failed too (0 if not delayed). A source without
        recent failures is not held back by its user's: so a user being guessed at
        from elsewhere can still log in, while each guessing address gets at most
        one check past the user's delay before its own count holds it too."""
        source = self.records.get("s" + check.source)
        if source is None or now - source.last > FAILURE_MEMORY:
            return 0.0
        user = self.records.get(user_key(check.user))
        return max(source.until, user.until if user is not None else 0.0)

    def failed(self, source: str, user: str, now: float) -> float:
        """Count an AUTH_FAILED for ``source`` and ``user``; returns the delay before it
        is answered: ``delay`` for each of the first :data:`FREE_FAILURES` (within
        :data:`FAILURE_MEMORY` seconds), then doubling per failure up to ``delay_max``;
        after those first ones, no check of that source or user starts before the answer
        is due."""
        failures = 0
        for key in ("s" + source, user_key(user)):
            record = self.records.pop(key, None)
            if record is None or now - record.last > FAILURE_MEMORY:
                record = FailureRecord()
            record.failures += 1
            record.last = now
            self.records[key] = record  # the newest last: the oldest are forgotten first
            failures = max(failures, record.failures)
        delay = self.delay_for(failures)
        if failures > FREE_FAILURES:
            for key in ("s" + source, user_key(user)):
                record = self.records[key]
                record.until = max(record.until, now + delay)
        while len(self.records) > FAILURE_RECORDS_MAX:
            del self.records[next(iter(self.records))]
        return delay

    def delay_for(self, failures: int) -> float:
        """The delay of the ``failures``-th recent failure (see :meth:`failed`)."""
        if failures <= FREE_FAILURES:
            return self.delay
        return min(self.delay_max, self.delay * 2.0 ** min(failures - FREE_FAILURES, 64))

    def succeeded(self, user: str) -> None:
        """A user who logs in is no longer delayed (its source still is: one address may
        hold both an attacker and a user with a password)."""
        self.records.pop(user_key(user), None)


class AccessControl:
    """The access part: authentication and the permission checks (PROTOCOL.md 15).

    Args:
        access: the loaded users file, or None when authentication is off.

    Attributes:
        offload: set by the IO layer to run password checks off the loop (see
            :data:`Offload`); None runs them inline.
        resume: set by the dispatcher: reads on a connection whose AUTHENTICATE was
            answered (the frames that arrived meanwhile, then its end of input).
        peer_gone: set by the IO layer: ``peer_gone(conn)`` is True when the peer of a
            connection whose reading is paused has ended its input (its FIN waits
            unread); the IO layer then closes it. The queue asks it before a check
            starts (PROTOCOL.md 15.2: such a check is dropped unrun).
    """

    subscriptions: Subscriptions  # wired by jetd.core.Daemon: fetches under new permissions
    queries: Queries

    def __init__(self, config: Config, out: Output, clock: Clock, log_hook: Optional[LogHook],
                 access: Optional[Access]) -> None:
        self.config = config
        self.out = out
        self.clock = clock
        self._log = log_hook
        self.access = access
        self.offload: Optional[Offload] = None
        self.resume: Callable[[Connection, float], None] = _no_resume
        self.peer_gone: Callable[[Connection], bool] = _never_gone
        # Delayed AUTH_FAILED answers: a heap by due time (delays differ, PROTOCOL.md 15.2).
        # (due, seq, conn, rid, frame, refused): refused is an OVERLOADED answer, else AUTH_FAILED.
        self._auth_answers: list[tuple[float, int, Connection, int, bytes, bool]] = []
        self._answer_seq = 0
        self.checks = PasswordChecks(config.auth_queue, config.auth_failure_delay, config.auth_failure_delay_max)
        self._pumping = False
        # Checks whose thread ended, not acted on yet: (check, user, ok), in the order
        # they ended (finish_checks, in the scheduler's turn).
        self.completed: deque[tuple[PasswordCheck, str, bool]] = deque()
        self._auth_deadlines: deque[tuple[float, Connection]] = deque()  # auth timeout, in connect order
        # Issue 29: connections still under the permissions of the users file before the
        # last reload, in connect order (reindex_slice); a dict for the membership test.
        self.reindex: dict[Connection, None] = {}

    # --- the checks the handlers call -------------------------------------------------

    def not_authorized(self, conn: Connection, rid: Optional[int], permission: str, key: bytes) -> None:
        """Answer NOT_AUTHORIZED naming the permission and the key (MALFORMED for a key
        that is not UTF-8: PROTOCOL.md 15.3 checks the form first). ``own`` or ``write``
        granted without ``read`` is named ``read`` (:class:`Permissions`)."""
        if not is_utf8(key):
            if rid is not None:
                self.out.reply(conn, rid, Status.MALFORMED, "key is not valid UTF-8")
            return
        perms = conn.perms
        if perms is not None:
            permission = perms.missing(permission, key)
        message = f"not authorized: {permission} {key.decode('utf-8')}"
        if rid is not None:
            self.out.reply(conn, rid, Status.NOT_AUTHORIZED, message)

    def hides(self, conn: Connection, key: bytes) -> bool:
        """PROTOCOL.md 15.3: True if ``conn`` may learn nothing about ``key``: it may not
        read it and owns no state or method of that key. A request on such a key is
        answered NOT_AUTHORIZED (``read``) whether the key is a state, a method or
        missing. Asked only off the owner's own path (a request by a non-owner)."""
        perms = conn.perms
        return (perms is not None and not perms.read.matches(key)
                and key not in conn.states and key not in conn.methods)

    def may_write(self, conn: Connection, key: bytes) -> bool:
        """PROTOCOL.md 15.3 ``write``, cached per connection for the keys it may write
        (the routed-SET fast path tests ``key in conn.writable`` inline; a denied key
        takes the careful path, which checks the compiled prefixes again)."""
        writable = conn.writable
        if writable is None or key in writable:
            return True
        perms = conn.perms
        if perms is None or not perms.write.matches(key):
            return False
        if len(writable) >= WRITABLE_CACHE_MAX:
            writable.clear()
        writable.add(key)
        return True

    # --- AUTHENTICATE ---------------------------------------------------------------------

    def authenticate(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        """PROTOCOL.md 6.12, 15.2.

        JETLOG.md 4: its FRAME_IN record (password masked) is written here, or when it is
        answered if that is later, so that the record of a request the daemon answers
        itself still comes right before its answer."""
        frame = mask_authenticate(buf[pos:end]) if self._log is not None else b""
        try:
            message = decode_body(REQUEST, buf[pos + 5 : end])
        except RemoteProtocolError:
            self._log_request(conn, frame)
            return self.out.malformed(conn, buf, pos, end, rid)
        assert isinstance(message, Authenticate)
        access = self.access
        if access is None:
            # PROTOCOL.md 6.12: without authentication every peer has every permission.
            self._log_request(conn, frame)
            self.out.send(conn, ok_frame(rid))
            return None
        if conn.user is not None:
            self._log_request(conn, frame)
            return self.out.reply(conn, rid, Status.NOT_AUTHORIZED, f"already authenticated as {conn.user}")
        user = message.user
        check = PasswordCheck(access, conn, rid, user, message.password, frame,
                              access.password_of(user), source_of(conn.address))
        # PROTOCOL.md 15.2: nothing more is read from the connection until it is answered.
        conn.held = True
        if not self.checks.offer(check):
            # PROTOCOL.md 15.2: a full queue answers OVERLOADED, unchecked and not counted
            # as a failure, after the failure delay (unread meanwhile, so that a flood
            # of refusals does not become a flood of cheap requests).
            self._answer_seq += 1
            heapq.heappush(self._auth_answers, (self.clock.now + self.config.auth_failure_delay, self._answer_seq,
                                                conn, rid, frame, True))
            return None
        self._pump(self.clock.now)
        return None

    def _pump(self, now: float) -> None:
        """Start the waiting checks that may start (PROTOCOL.md 15.2)."""
        if self._pumping:
            return  # an inline check finished inside the loop below: it goes on
        self._pumping = True
        try:
            checks = self.checks
            checks.purge(self.peer_gone)
            while True:
                check = checks.take(now)
                if check is None:
                    break
                self._start(check, now)
            if checks.busy and not checks.queued and not checks.running:
                # One line per burst, with the totals (tests and tools.chaos read them).
                checks.busy = False
                log.info("password checks idle: %d run, %d dropped (connection closed), %d refused (queue full) "
                         "since start", checks.run, checks.dropped, checks.refused)
        finally:
            self._pumping = False

    def _start(self, check: PasswordCheck, now: float) -> None:
        # Against the file it was asked under; _auth_done compares with the one in force.
        access = check.access
        user, password = check.user, check.password
        check.password = ""  # held no longer than needed

        def done(ok: bool) -> None:
            self.completed.append((check, user, ok))

        if self.offload is not None:
            self.offload(lambda: access.verify(user, password), done)
        else:
            self._complete(check, user, access.verify(user, password), now)
            self._pump(now)

    def finish_checks(self, scheduler: Scheduler, now: float) -> int:
        """Act on the checks whose thread ended (their answers, the input held behind
        them), until the slice is over (at least one), then start the checks that may
        start; returns how many were acted on. The daemon's one scheduler runs this in
        its turn (:meth:`jetd.core.Daemon.work`), like all its deferred work: a login's
        answer may re-read the input held behind it and apply its new permissions to
        the connection's fetches."""
        completed = self.completed
        done = 0
        while completed:
            check, user, ok = completed.popleft()
            self._complete(check, user, ok, now)
            done += 1
            if scheduler.spend(scheduler.check_every):
                break
        self._pump(now)
        return done

    def _complete(self, check: PasswordCheck, user: str, ok: bool, now: float) -> None:
        self.checks.finished()
        self._auth_done(check.conn, check.rid, user, ok, now, check.frame, check.checked, check.source)

    def _log_request(self, conn: Connection, frame: bytes) -> None:
        if self._log is not None:
            self._log(conn.conn_id, FRAME_IN, frame)

    def _auth_done(self, conn: Connection, rid: int, user: str, ok: bool, now: float, frame: bytes,
                   checked: Optional[str], source: str) -> None:
        self.clock.now = now
        access = self.access
        if access is None:
            conn.held = False
            return
        if ok and access.password_of(user) != checked:
            # PROTOCOL.md 15.2: checked against the users file in force now; a reload
            # while the check was queued or running changed or removed this user.
            log.info("authentication of %s as %r failed: the users file changed the user during the check",
                     conn.label, user)
            ok = False
        if conn.closing:
            conn.held = False
            if not ok:
                # PROTOCOL.md 15.2: a failure counts for its source and user even when
                # the peer did not wait for the answer (else closing would dodge the delay).
                self.checks.failed(source, user, now)
            return
        if not ok:
            conn.auth_failures += 1
            delay = self.checks.failed(source, user, now)
            log.info("authentication failed on %s for user %r (%d), answered in %g s",
                     conn.label, user, conn.auth_failures, delay)
            self._answer_seq += 1
            heapq.heappush(self._auth_answers, (now + delay, self._answer_seq, conn, rid, frame, False))
            return
        self.checks.succeeded(user)
        self._log_request(conn, frame)
        self._authenticated(conn, user, AUTH_BY_PASSWORD)
        self.out.send(conn, ok_frame(rid))
        self._release(conn, now)

    def _authenticated(self, conn: Connection, user: str, method: int) -> None:
        assert self.access is not None
        conn.user = user
        if self._log is not None:
            self._log(conn.conn_id, LogKind.CONN_AUTH, conn_auth_data(method, user))
        log.info("authenticated %s as %r (%s)", conn.label, user, "password" if method == 1 else "certificate")
        self._apply_permissions(conn, self.access.permissions(user))

    def _release(self, conn: Connection, now: float) -> None:
        """Read on: the frames that arrived while AUTHENTICATE was being answered (and
        the end of input, if the peer closed its side meanwhile)."""
        conn.held = False
        self.resume(conn, now)

    def authenticate_certificate(self, conn: Connection, user: str) -> None:
        """PROTOCOL.md 15.6: a verified client certificate names ``user`` (the IO layer
        calls this right after :meth:`connect`)."""
        if self.access is None or conn.closing:
            return
        if not self.access.knows(user):
            log.warning("client certificate of %s names %r, who is not in the users file", conn.label, user)
            return
        self._authenticated(conn, user, AUTH_BY_CERTIFICATE)

    def tick(self, now: float) -> None:
        """Delayed AUTH_FAILED answers and the auth timeout (PROTOCOL.md 15.2)."""
        answers = self._auth_answers
        while answers and answers[0][0] <= now:
            _, _, conn, rid, frame, refused = heapq.heappop(answers)
            if conn.closing:
                continue
            self._log_request(conn, frame)
            if refused:
                self.out.reply(conn, rid, Status.OVERLOADED, AUTH_BUSY)
                self._release(conn, now)
                continue
            self.out.reply(conn, rid, Status.AUTH_FAILED, "authentication failed")
            if conn.auth_failures >= MAX_AUTH_FAILURES:
                message = "too many failed authentications"
                self.out.violation(conn, message)
                self.out.close_with(conn, Status.AUTH_FAILED, message, close_frame(Status.AUTH_FAILED, message))
            else:
                self._release(conn, now)
        # Checks wait for closed connections to be dropped and for delays to pass.
        if self.checks.queued:
            self._pump(now)
        deadlines = self._auth_deadlines
        while deadlines and deadlines[0][0] <= now:
            _, conn = deadlines.popleft()
            if conn.closing or conn.user is not None:
                continue
            if conn.held:
                # Being answered: look again a full timeout later (keeps the deque in order).
                deadlines.append((now + self.config.auth_timeout, conn))
                continue
            access = self.access
            if access is not None and access.timeout_applies:
                message = "not authenticated within the auth timeout"
                self.out.close_with(conn, Status.NOT_AUTHORIZED, message, close_frame(Status.NOT_AUTHORIZED, message))

    def on_connect(self, conn: Connection) -> None:
        access = self.access
        if access is None:
            return
        conn.perms = access.anonymous
        conn.writable = None if access.anonymous.write.everything else set()
        self._auth_deadlines.append((self.clock.now + self.config.auth_timeout, conn))

    # --- changes of permissions (PROTOCOL.md 15.5) -------------------------------------------

    def set_access(self, access: Access, connections: list[Connection]) -> None:
        """Use a newly loaded users file (SIGHUP): every connection gets its user's new
        permissions, and its fetches are brought in line, a connection at a time in
        slices (:meth:`reindex_slice`, issue 29), in ``connections``' order.
        Connections are not dropped.

        Only a daemon started with an Access can switch: the fast paths assume no checks
        otherwise."""
        if self.access is None:
            raise ValueError("authentication was not enabled at start")
        self.access = access
        reindex = self.reindex
        for conn in connections:
            if not conn.closing:
                reindex[conn] = None

    def reindex_slice(self, scheduler: Scheduler) -> int:
        """Bring the connections waiting since the last reload in line with it, until
        the slice is over (at least one, at most :data:`REINDEX_SLICE`); returns how
        many. Each costs what its fetches' re-evaluation costs: the clock is read after
        every one (:meth:`jetd.scheduler.Scheduler.spend`)."""
        reindex = self.reindex
        done = 0
        while reindex and done < REINDEX_SLICE:
            self.reindex_one(next(iter(reindex)))
            done += 1
            if scheduler.spend(scheduler.check_every):
                break
        if not reindex and done:
            log.info("the reloaded permissions are in force on every connection")
        return done

    def reindex_one(self, conn: Connection) -> None:
        """``conn``, waiting since the last reload, gets its new permissions now (its
        turn came, or a frame of it is about to be handled: PROTOCOL.md 15.5)."""
        del self.reindex[conn]
        access = self.access
        if conn.closing or access is None:
            return
        self._apply_permissions(conn, access.permissions(conn.user) if conn.user is not None else access.anonymous)

    def _apply_permissions(self, conn: Connection, perms: Permissions) -> None:
        """PROTOCOL.md 15.5: ``conn``'s fetches are brought in line with ``perms`` at
        once: a delivery under way, then its query fetches, then its plain fetches."""
        if self.reindex:
            self.reindex.pop(conn, None)  # authenticated while a reload was in progress
        conn.perms = perms
        conn.writable = None if perms.write.everything else set()
        self.subscriptions.narrow_delivery(conn, perms)
        if conn.query_fetches:
            self.queries.permissions_changed(conn)  # jetd.querying
            if conn.closing:
                return
        self.subscriptions.narrow_fetches(conn, perms)


def _no_resume(conn: Connection, now: float) -> None:
    return None
