"""The scheduler part: which stalled connection's work goes on next (PROTOCOL.md 10.5,
10.8, 14.5).

Work that grows with the bus is done in slices: a fetch's initial adds
(:data:`jetd.subscriptions.DELIVERY_SLICE` states a slice), seeding a query group and
its initial entries (:data:`jetd.querying.SEED_SLICE`), a burst of route timeouts
(:data:`jetd.routes.EXPIRE_SLICE`). A part that has more to do than one slice leaves the
connection ``stalled`` and wakes it here (or the dispatcher does once its output is
written); :meth:`jetd.core.Daemon.work` takes the woken connections, in the order they
woke, and gives each the next slice. Between two calls the IO layer reads and writes
sockets, so no connection's work stalls the others for more than a slice.

Today a slice is counted in items, as before this part existed. Issue 29 makes it
count time instead (about 1 ms, like redis's ``activeExpireCycle``) and round-robin
across connections, and brings the other work that grows with the bus (window
re-evaluation, fan-out to many fetchers, re-indexing on SIGHUP, password checks) under
it. The plan: the parts' slice loops ask this part whether the slice is over (given
``now``) instead of comparing a count, and :meth:`take` hands out connections
round-robin with a per-turn budget; the parts keep their interfaces.
"""

from __future__ import annotations

from .connection import Connection

__all__ = ["Scheduler"]


class Scheduler:
    """The queue of connections whose sliced work may go on (see the module docstring)."""

    __slots__ = ("_ready",)

    def __init__(self) -> None:
        self._ready: list[Connection] = []

    def wake(self, conn: Connection) -> None:
        """``conn``'s work may go on in the next :meth:`jetd.core.Daemon.work`: its
        output was written, its transport drained, or a slice left more to do."""
        self._ready.append(conn)

    @property
    def has_work(self) -> bool:
        """True while some connection was woken and not yet taken."""
        return bool(self._ready)

    def take(self) -> list[Connection]:
        """The woken connections, in the order they woke; the queue starts over."""
        ready = self._ready
        self._ready = []
        return ready
