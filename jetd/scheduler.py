"""The scheduler part: which stalled connection's work goes on next (PROTOCOL.md 10.5,
10.8, 14.5).

Work that grows with the bus is done in slices, whose sizes this part owns: a fetch's
initial adds and a query's initial entries (``delivery_slice`` states a slice), seeding
a query group (``seed_slice``), a burst of route timeouts (``expire_slice``). A part
that has more to do than one slice leaves the
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

__all__ = ["DEFAULT_DELIVERY_SLICE", "DEFAULT_EXPIRE_SLICE", "DEFAULT_SEED_SLICE", "Scheduler"]

# States per slice of initial adds or entries: about a millisecond or two of the loop.
DEFAULT_DELIVERY_SLICE = 2048
# States a new query group evaluates per slice while seeding (PROTOCOL.md 14.5).
DEFAULT_SEED_SLICE = 1024
# Route timeouts answered per slice: a burst goes out in slices of a few ms.
DEFAULT_EXPIRE_SLICE = 4096


class Scheduler:
    """The queue of connections whose sliced work may go on, and the size of a slice of
    each kind of work (see the module docstring). The parts read a size once per slice."""

    __slots__ = ("_ready", "delivery_slice", "expire_slice", "seed_slice")

    def __init__(self, delivery_slice: int = DEFAULT_DELIVERY_SLICE, seed_slice: int = DEFAULT_SEED_SLICE,
                 expire_slice: int = DEFAULT_EXPIRE_SLICE) -> None:
        self._ready: list[Connection] = []
        self.delivery_slice = delivery_slice
        self.seed_slice = seed_slice
        self.expire_slice = expire_slice

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
