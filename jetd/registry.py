"""The registry part: who owns what, states (with their cached values) and methods, and
the requests that add, remove, notify and read them (PROTOCOL.md 6.1, 6.2, 6.4, 6.6, 6.7,
6.10, 10.2, 10.4).

:class:`Registry` owns :class:`StateRegistry` (the tables). It calls the subscriptions
part for the fetch events a change causes, the queries part for methods added and
removed, and the access part for ``own``/``read``; everything it sends goes through
:class:`jetd.base.Output`."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from heapq import heapify
from heapq import heappop
from heapq import heapreplace
from typing import TYPE_CHECKING
from typing import Optional

from sortedcontainers import SortedList

from jetwire import Status
from jetwire.codec import is_utf8

from .base import Output
from .config import Config
from .connection import Connection
from .frames import FETCH_ADD
from .frames import FETCH_CHANGE
from .frames import FETCH_REMOVE
from .frames import RESP_HEAD_PACK
from .frames import RESPONSE
from .frames import key_only_end
from .frames import key_value_end
from .frames import ok_frame

if TYPE_CHECKING:
    from .access import AccessControl
    from .querying import Queries
    from .subscriptions import Subscriptions

__all__ = ["LEAVE_RUN", "RESERVED_PREFIX", "Registry", "StateRegistry"]

# PROTOCOL.md 16: the daemon's own states (jetd.metrics); no peer may own a key under it.
RESERVED_PREFIX = b"$jet/"
# Issue 29: a closed owner's keys are put in byte order this many at a time (a sort of
# ~0.13 ms here), then the runs are merged: no call sorts all of a big owner's keys.
LEAVE_RUN = 1024


class _Leaving:
    """A closed owner's keys on their way out (issue 29, PROTOCOL.md 10.6): ``keys`` as
    they sat in its table, sorted ``LEAVE_RUN`` at a time into ``runs`` (``sorted`` keys
    so far, each run in reverse byte order), then merged through ``heads`` (a heap of
    each run's smallest key and the run's index). A key leaves its run as it goes, so
    no call frees them all at once (100,000 keys: ~2.5 ms)."""

    __slots__ = ("heads", "keys", "runs", "sorted")

    def __init__(self, keys: list[bytes]) -> None:
        self.keys = keys
        self.runs: list[list[bytes]] = []
        self.sorted = 0
        self.heads: Optional[list[tuple[bytes, int]]] = None


def reserved_hidden(prefix: bytes, key: bytes) -> bool:
    """PROTOCOL.md 16.1: the empty prefix (a fetch of every key, a query that names no
    prefix) does not match the keys under ``$jet/``, as MQTT's ``#`` does not match
    ``$SYS``: a fetch of everything sees exactly what it saw before 1.3."""
    return not prefix and key.startswith(RESERVED_PREFIX)


class StateRegistry:
    """States and methods by key bytes, with a sorted index of state keys.

    ``states`` maps a key to its owner; the cached value lives in the owner's
    ``Connection.states`` as the ``Key, Value`` payload exactly as on the wire
    (u16 klen | key | Value), so a fetch event is a head, a fetch id and that payload,
    and a state costs two dict entries and two bytes objects (PROTOCOL.md 10.4 cache).

    PROTOCOL.md 5.2: keys sort by their UTF-8 bytes, so the index holds ``bytes`` and a
    prefix fetch is one range scan: O(log n + matches), never a walk over all states.
    """

    __slots__ = ("index", "methods", "states")

    def __init__(self) -> None:
        self.states: dict[bytes, Connection] = {}
        self.methods: dict[bytes, Connection] = {}
        self.index: SortedList = SortedList()

    def add_state(self, key: bytes, kv: bytes, owner: Connection) -> None:
        """Register ``key`` owned by ``owner`` with its ``Key, Value`` payload ``kv``."""
        self.states[key] = owner
        owner.states[key] = kv
        self.index.add(key)

    def remove_state(self, key: bytes) -> bytes:
        """Forget ``key``; returns its last ``Key, Value`` payload (the caller fans out
        FETCH_REMOVE and then drops the key's cached fetch targets)."""
        owner = self.states.pop(key)
        self.index.remove(key)
        return owner.states.pop(key)

    def matching(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(key, ``Key, Value`` payload) of the states whose key starts with ``prefix``,
        in byte order of key."""
        states = self.states
        for key in self.index.irange(minimum=prefix):
            if not key.startswith(prefix):
                return
            if prefix or not key.startswith(RESERVED_PREFIX):  # reserved_hidden
                yield key, states[key].states[key]

    def matching_after(self, prefix: bytes, after: Optional[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """Like :meth:`matching`, but only the keys above ``after`` (all if None): where
        a fetch delivered in slices (:class:`jetd.subscriptions.Delivery`) goes on. Read
        it within one slice: the index must not change while it is iterated."""
        if after is None or after < prefix:
            yield from self.matching(prefix)
            return
        states = self.states
        for key in self.index.irange(minimum=after, inclusive=(False, True)):
            if not key.startswith(prefix):
                return
            if prefix or not key.startswith(RESERVED_PREFIX):  # reserved_hidden
                yield key, states[key].states[key]

    def matching_any_after(self, prefixes: tuple[bytes, ...], after: Optional[bytes]) -> Iterator[tuple[bytes, bytes]]:
        """:meth:`matching_after` for several disjoint prefixes, sorted (a fetch's readable
        prefixes, PROTOCOL.md 15.4): still in byte order of key."""
        for prefix in prefixes:
            yield from self.matching_after(prefix, after)

    def matching_any(self, prefixes: tuple[bytes, ...]) -> Iterator[tuple[bytes, bytes]]:
        """As :meth:`matching` for several disjoint prefixes, sorted: still in byte order
        of key (PROTOCOL.md 15.4)."""
        for prefix in prefixes:
            yield from self.matching(prefix)


class Registry:
    """The registry part: the tables and the requests on them (see the module docstring).

    ``states`` and ``methods`` (key -> owner) are published for the dispatcher's fast
    paths and the console, read-only: only this part changes them.
    """

    subscriptions: Subscriptions  # wired by jetd.core.Daemon: fetch events of a change
    queries: Queries  # methods added and removed (PROTOCOL.md 14.2)
    access: AccessControl  # own / read (PROTOCOL.md 15.3)

    def __init__(self, config: Config, out: Output) -> None:
        self.config = config
        self.out = out
        self.table = StateRegistry()
        self.states = self.table.states
        self.methods = self.table.methods
        self.max_key = config.max_key_length
        # Issue 29: closed owners whose states are still being removed, in slices, and
        # their keys (byte order of key, PROTOCOL.md 10.6).
        self.leaving: dict[Connection, _Leaving] = {}

    # --- what the other parts may ask -------------------------------------------------

    def value(self, key: bytes) -> Optional[bytes]:
        """The ``Key, Value`` payload of state ``key``, or None if there is none."""
        owner = self.states.get(key)
        return None if owner is None else owner.states[key]

    def state_owner(self, key: bytes) -> Optional[Connection]:
        return self.states.get(key)

    def method_owner(self, key: bytes) -> Optional[Connection]:
        return self.methods.get(key)

    def method_keys(self) -> list[bytes]:
        return list(self.methods)

    def all_keys(self) -> list[bytes]:
        """Every state and method key (the nodes of PROTOCOL.md 14.2 are counted from them)."""
        return [*self.states, *self.methods]

    def matching_after(self, prefix: bytes, after: Optional[bytes]) -> Iterator[tuple[bytes, bytes]]:
        return self.table.matching_after(prefix, after)

    def matching_any(self, prefixes: tuple[bytes, ...]) -> Iterator[tuple[bytes, bytes]]:
        return self.table.matching_any(prefixes)

    def matching_any_after(self, prefixes: tuple[bytes, ...], after: Optional[bytes]) -> Iterator[tuple[bytes, bytes]]:
        return self.table.matching_any_after(prefixes, after)

    def publish(self, owner: Connection, key: bytes, kv: bytes) -> None:
        """Add state ``key`` for ``owner`` with the ``Key, Value`` payload ``kv``, or change
        it: the daemon's own states (jetd.metrics, PROTOCOL.md 16), with the same fetch
        events a peer's ADD_STATE or NOTIFY_STATE causes."""
        if self.states.get(key) is owner:
            owner.states[key] = kv
            self.subscriptions.fanout(key, FETCH_CHANGE, kv)
        else:
            self.table.add_state(key, kv, owner)
            self.subscriptions.fanout(key, FETCH_ADD, kv)

    def withdraw(self, key: bytes) -> None:
        """Remove one of the daemon's own states (FETCH_REMOVE), if it is there."""
        if key in self.states:
            self.subscriptions.fanout(key, FETCH_REMOVE, self.table.remove_state(key))
            self.subscriptions.forget(key)

    def reserved(self, conn: Connection, rid: int, key: bytes) -> None:
        """PROTOCOL.md 16: ADD_STATE, ADD_METHOD or SET_STATE of a key under ``$jet/``."""
        self.out.reply(conn, rid, Status.NOT_AUTHORIZED,
                       f"not authorized: {RESERVED_PREFIX.decode()} is reserved for the daemon's own states")

    def drop_owner(self, conn: Connection, spend: Optional[Callable[[int], bool]] = None) -> bool:
        """PROTOCOL.md 10.6: a closed owner's states go (FETCH_REMOVE in byte order of
        key), then its methods. With ``spend`` (:meth:`jetd.scheduler.Scheduler.spend`)
        only until the slice is over (issue 29): False then, and the rest waits in
        ``leaving`` for :meth:`leave_slice`; True once all are gone."""
        leaving = self.leaving.pop(conn, None)
        if leaving is None:
            # One copy in C (~1 ms per 100,000 keys here): the table changes meanwhile.
            leaving = _Leaving(list(conn.states))
        while leaving.heads is None:
            keys = leaving.keys
            done = leaving.sorted
            if done >= len(keys):
                leaving.heads = [(run[-1], i) for i, run in enumerate(leaving.runs)]
                heapify(leaving.heads)
                leaving.keys = []
                break
            run = keys[done : done + LEAVE_RUN]
            run.sort(reverse=True)
            leaving.runs.append(run)
            leaving.sorted = done + len(run)
            if spend is not None and spend(len(run)):
                self.leaving[conn] = leaving
                return False
        subscriptions = self.subscriptions
        states = self.states
        heads = leaving.heads
        runs = leaving.runs
        while heads:
            key, index = heads[0]
            run = runs[index]
            run.pop()
            if run:
                heapreplace(heads, (run[-1], index))
            else:
                heappop(heads)
            if states.get(key) is not conn:
                continue  # taken over meanwhile (_check_new_key removed it)
            subscriptions.fanout(key, FETCH_REMOVE, self.table.remove_state(key))
            subscriptions.forget(key)
            if heads and spend is not None and spend(1):
                self.leaving[conn] = leaving
                return False
        queries = self.queries
        for key in conn.methods:
            del self.methods[key]
            queries.method_changed(key, False)
        conn.methods.clear()
        return True

    def leave_slice(self, spend: Callable[[int], bool]) -> None:
        """The next slice of the closed owners' removals, one owner at a time, in the
        order they closed (from :meth:`jetd.core.Daemon.work`)."""
        while self.leaving:
            if not self.drop_owner(next(iter(self.leaving)), spend):
                return

    def _leave_now(self, key: bytes) -> None:
        """A peer wants ``key``: if it is a state or method of a closed owner still
        being removed (``leaving``), it goes now (a state's FETCH_REMOVE first)."""
        owner = self.states.get(key)
        if owner is not None and owner in self.leaving:
            self.subscriptions.fanout(key, FETCH_REMOVE, self.table.remove_state(key))
            self.subscriptions.forget(key)
        owner = self.methods.get(key)
        if owner is not None and owner in self.leaving:
            del self.methods[key]
            owner.methods.discard(key)
            self.queries.method_changed(key, False)

    # --- requests ---------------------------------------------------------------------

    def unknown_key(self, conn: Connection, key: bytes, rid: Optional[int], kind: str) -> Optional[str]:
        """Reply for a key that is neither where it was looked for: MALFORMED if it is not
        UTF-8, TOO_LARGE above the key limit, else NOT_FOUND or WRONG_KIND. Returns the
        reason (for a fire-and-forget event, where nobody is answered)."""
        if not is_utf8(key):
            message, status = "key is not valid UTF-8", Status.MALFORMED
        elif len(key) > self.max_key:
            message, status = f"key of {len(key)} bytes exceeds the limit of {self.max_key}", Status.TOO_LARGE
        elif kind == "state" and key in self.methods:
            message, status = "the key is a method", Status.WRONG_KIND
        elif kind == "method" and key in self.states:
            message, status = "the key is a state", Status.WRONG_KIND
        else:
            message, status = f"no such {kind}", Status.NOT_FOUND
        if rid is not None:
            self.out.reply(conn, rid, status, message)
        return message

    def _check_new_key(self, conn: Connection, key: bytes, rid: int) -> bool:
        if self.leaving:
            self._leave_now(key)  # PROTOCOL.md 10.6: a closed owner's key goes now (issue 29)
        if key.startswith(RESERVED_PREFIX):
            self.reserved(conn, rid, key)
        elif len(key) > self.max_key:
            self.out.reply(conn, rid, Status.TOO_LARGE, f"key of {len(key)} bytes exceeds the limit of {self.max_key}")
        elif key in self.states or key in self.methods:
            self.out.reply(conn, rid, Status.ALREADY_EXISTS, "the key is taken")
        elif not is_utf8(key):
            self.out.reply(conn, rid, Status.MALFORMED, "key is not valid UTF-8")
        elif len(conn.states) + len(conn.methods) >= self.config.max_states_per_connection:
            self.out.reply(
                conn,
                rid,
                Status.LIMIT_EXCEEDED,
                f"at most {self.config.max_states_per_connection} states and methods per connection",
            )
        else:
            return True
        return False

    def add_state(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        kend = key_value_end(buf, pos + 10, end)
        if kend < 0:
            return self.out.malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : kend]
        if conn.perms is not None and not conn.perms.own.matches(key):
            return self.access.not_authorized(conn, rid, "own", key)  # PROTOCOL.md 15.3
        if not self._check_new_key(conn, key, rid):
            return None
        kv = buf[pos + 10 : end]
        self.table.add_state(key, kv, conn)
        # PROTOCOL.md 10.5: the fetch events a request causes go out before its OK (to
        # many fetches in slices, issue 29: the OK then follows the last).
        self.subscriptions.fanout(key, FETCH_ADD, kv, conn, ok_frame(rid))
        return None

    def remove_state(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not key_only_end(buf, pos + 10, end):
            return self.out.malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        if not self._removable(conn, key, rid, self.states, "state"):
            return None
        kv = self.table.remove_state(key)
        self.subscriptions.fanout(key, FETCH_REMOVE, kv, conn, ok_frame(rid))  # PROTOCOL.md 10.5: before the OK
        self.subscriptions.forget(key)
        return None

    def _removable(self, conn: Connection, key: bytes, rid: int, owners: dict[bytes, Connection], kind: str) -> bool:
        """True if ``conn`` owns ``key`` in ``owners``; else answers NOT_FOUND or NOT_OWNER,
        or NOT_AUTHORIZED for a key it may not read (PROTOCOL.md 15.3)."""
        owner = owners.get(key)
        if owner is not conn and self.access.hides(conn, key):
            self.access.not_authorized(conn, rid, "read", key)  # PROTOCOL.md 15.3
            return False
        if owner is None:
            self.unknown_key(conn, key, rid, kind)
            return False
        if owner is not conn:
            self.out.reply(conn, rid, Status.NOT_OWNER, f"only the owner may remove a {kind}")
            return False
        return True

    def add_method(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not key_only_end(buf, pos + 10, end):
            return self.out.malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        if conn.perms is not None and not conn.perms.own.matches(key):
            return self.access.not_authorized(conn, rid, "own", key)  # PROTOCOL.md 15.3
        if not self._check_new_key(conn, key, rid):
            return None
        self.methods[key] = conn
        conn.methods.add(key)
        self.queries.method_changed(key, True)  # PROTOCOL.md 14.2
        self.out.send(conn, ok_frame(rid))
        return None

    def remove_method(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not key_only_end(buf, pos + 10, end):
            return self.out.malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        if not self._removable(conn, key, rid, self.methods, "method"):
            return None
        del self.methods[key]
        conn.methods.discard(key)
        self.queries.method_changed(key, False)  # PROTOCOL.md 14.2
        self.out.send(conn, ok_frame(rid))
        return None

    def notify(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        kend = key_value_end(buf, pos + 10, end)
        if kend < 0:
            return self.out.malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : kend]
        owner = self.states.get(key)
        if owner is not conn and self.access.hides(conn, key):
            return self.access.not_authorized(conn, rid, "read", key)  # PROTOCOL.md 15.3
        if owner is None:
            self.unknown_key(conn, key, rid, "state")
            return None
        if owner is not conn:
            return self.out.reply(conn, rid, Status.NOT_OWNER, "only the owner may notify")
        kv = conn.states[key] = buf[pos + 10 : end]
        if conn.parked:
            self.subscriptions.fanout(key, FETCH_CHANGE, kv)
            self.subscriptions.catch_up_on(conn, key, kv)  # it fetches its own state: the change first
            self.out.send(conn, ok_frame(rid))
        else:  # PROTOCOL.md 10.5: the events before the OK (many: in slices, issue 29)
            self.subscriptions.fanout(key, FETCH_CHANGE, kv, conn, ok_frame(rid))
        return None

    def get(self, conn: Connection, buf: bytes, pos: int, end: int, rid: int) -> None:
        if not key_only_end(buf, pos + 10, end):
            return self.out.malformed(conn, buf, pos, end, rid)
        key = buf[pos + 12 : end]
        if conn.perms is not None and not conn.perms.read.matches(key):
            return self.access.not_authorized(conn, rid, "read", key)  # PROTOCOL.md 15.3
        owner = self.states.get(key)
        if owner is None:
            self.unknown_key(conn, key, rid, "state")
            return None
        value = owner.states[key][2 + len(key) :]
        self.out.send(conn, RESP_HEAD_PACK(RESPONSE, 5 + len(value), rid, 0) + value)
        return None
