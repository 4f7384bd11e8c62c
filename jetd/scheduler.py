"""The scheduler part: which stalled connection's work goes on next, and when a slice
of it is over (PROTOCOL.md 10.5, 10.8, 14.5).

Work that grows with the bus is done in slices: a fetch's initial adds and a query's
initial entries, seeding a query group, a burst of route timeouts, a NOTIFY_STATE
event's or request's fan-out to many fetches, a run of pipelined requests (the frame
loop counts each careful frame), a closed owner's states. A slice ends when the
clock passes ``slice_seconds`` (about 1 ms, like redis's ``activeExpireCycle``) after it
began, or at the item count of its kind (``delivery_slice``, ``seed_slice``,
``expire_slice``, ``fan_slice``), whichever comes first: a count alone is 8 ms on one machine and 80 on
another. The parts' slice loops count their items with :meth:`Scheduler.spend` (every
16 states in the loops over states, whose items cost a microsecond or so); it reads the
clock only every ``check_every`` items, so the check costs next to nothing.

The core never reads a clock of its own (sans-IO): the IO layer hands the scheduler a
monotonic ``clock`` (the loop's ``time``), on the same time base as the ``now`` it
passes to the core; tests pass a fake one. Without a clock, slices are counted in items
only.

A part that has more to do than one slice leaves the connection ``stalled`` and wakes it
here (or the dispatcher does once its output is written); :meth:`jetd.core.Daemon.work`
takes the woken connections round-robin, in the order they woke, gives each one slice,
and ends its turn once ``slice_seconds`` have passed: the connections not reached go
first in the next turn, and one whose work goes on wakes again behind the others.
Between two turns the IO layer reads and writes sockets, so one peer's work delays
another's by about a slice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

from .connection import Connection

__all__ = [
    "DEFAULT_CHECK_EVERY",
    "DEFAULT_DELIVERY_SLICE",
    "DEFAULT_EXPIRE_SLICE",
    "DEFAULT_FAN_CHUNK",
    "DEFAULT_FAN_SLICE",
    "DEFAULT_FAN_STRIDE",
    "DEFAULT_SEED_SLICE",
    "DEFAULT_SLICE_SECONDS",
    "Scheduler",
]

# A slice of work, and a turn of Daemon.work, ends this long after it began (issue 29).
DEFAULT_SLICE_SECONDS = 0.001
# Items of work between two readings of the clock: an item is a state delivered or
# evaluated (~1-8 us), so 32 of them are well under the slice.
DEFAULT_CHECK_EVERY = 32
# The item counts are a ceiling on top of the clock (and the only bound without one).
# States per slice of initial adds or entries.
DEFAULT_DELIVERY_SLICE = 2048
# States a new query group evaluates per slice while seeding (PROTOCOL.md 14.5).
DEFAULT_SEED_SLICE = 1024
# Route timeouts answered per slice.
DEFAULT_EXPIRE_SLICE = 4096
# A NOTIFY_STATE event's fan-out to more live fetches than this is sliced (issue 29),
# and the rest waits for the owner's next turn. Fewer go out at once, uncounted: the
# common case (W2's 1-50 fetchers) pays one comparison.
DEFAULT_FAN_CHUNK = 64
# A sliced fan-out reads the clock after each stride of this many FETCH_CHANGE events
# (~0.1 us each, pure Python): a stride of 64 cost a tenth more CPU over 100,000 fetches.
DEFAULT_FAN_STRIDE = 256
# FETCH_CHANGE events of one sliced fan-out per slice (the ceiling without a clock).
DEFAULT_FAN_SLICE = 8192

_NEVER = float("inf")


class Scheduler:
    """The queue of connections whose sliced work may go on, the clock that ends a
    slice, and the item ceiling of each kind of slice (see the module docstring).

    Args:
        clock: a monotonic time source on the time base of the ``now`` the IO layer
            passes to the core, or None: slices are then counted in items only.
        slice_seconds: how long a slice, and a turn of :meth:`jetd.core.Daemon.work`, lasts.
        check_every: items of work between two readings of ``clock`` (at least 1).
        delivery_slice, seed_slice, expire_slice, fan_slice: item ceilings per slice.
    """

    __slots__ = (
        "_count",
        "_deadline",
        "_over",
        "_ready",
        "check_every",
        "clock",
        "current",
        "delivery_slice",
        "expire_slice",
        "fan_slice",
        "seed_slice",
        "slice_seconds",
        "slices_cut",
    )

    def __init__(self, delivery_slice: int = DEFAULT_DELIVERY_SLICE, seed_slice: int = DEFAULT_SEED_SLICE,
                 expire_slice: int = DEFAULT_EXPIRE_SLICE, clock: Optional[Callable[[], float]] = None,
                 slice_seconds: float = DEFAULT_SLICE_SECONDS, check_every: int = DEFAULT_CHECK_EVERY,
                 fan_slice: int = DEFAULT_FAN_SLICE) -> None:
        if slice_seconds <= 0 or check_every < 1:
            raise ValueError("slice_seconds must be > 0 and check_every >= 1")
        self._ready: list[Connection] = []
        self.delivery_slice = delivery_slice
        self.seed_slice = seed_slice
        self.expire_slice = expire_slice
        self.fan_slice = fan_slice
        self.clock = clock
        self.slice_seconds = slice_seconds
        self.check_every = check_every
        self._deadline = _NEVER
        self._count = 0
        self._over = False
        self.current: Optional[Connection] = None  # whose frames the slice handles
        self.slices_cut = 0  # slices ended by the clock (a counter for tests and stats)

    # --- the queue ----------------------------------------------------------------------

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

    def put_back(self, conns: list[Connection]) -> None:
        """Connections taken but not reached in this turn: they go first in the next,
        ahead of those woken meanwhile (round-robin)."""
        if conns:
            self._ready = conns + self._ready

    # --- the clock ------------------------------------------------------------------------

    def begin(self, now: float, conn: Optional[Connection] = None) -> None:
        """A slice starts at ``now`` (the time the IO layer passed to the core), for
        the frames of ``conn`` if given: work its own requests cause is not deferred
        (``current``), so that it precedes their answers (PROTOCOL.md 10.8)."""
        self.current = conn
        self._count = 0
        self._over = False
        self._deadline = now + self.slice_seconds if self.clock is not None else _NEVER

    def restart(self) -> None:
        """A new slice starts now, by the clock (between two connections' slices)."""
        self.current = None
        clock = self.clock
        self._count = 0
        self._over = False
        self._deadline = clock() + self.slice_seconds if clock is not None else _NEVER

    def spent(self) -> bool:
        """One more item of work was done in this slice; True once the slice is over
        (and until the next one begins). Reads the clock only every ``check_every`` items."""
        return self.spend(1)

    def spend(self, items: int) -> bool:
        """``items`` more items of work were done in this slice (a window of many
        entries counts each); True once the slice is over, and until the next begins."""
        if self._over:
            return True
        count = self._count + items
        if count < self.check_every:
            self._count = count
            return False
        self._count = 0
        clock = self.clock
        if clock is None or clock() < self._deadline:
            return False
        self._over = True
        self.slices_cut += 1
        return True

    def over(self, deadline: float) -> bool:
        """True once the clock has passed ``deadline`` (never without a clock)."""
        clock = self.clock
        return clock is not None and clock() >= deadline
