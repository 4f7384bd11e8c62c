"""One peer's connection as the daemon's core sees it: its queues and its holdings."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING
from typing import Optional

from jetwire import Status

if TYPE_CHECKING:
    from .access import Permissions
    from .querying import QueryDelivery
    from .querying import QueryFetch
    from .routes import Route
    from .subscriptions import Delivery
    from .subscriptions import Fetch

__all__ = ["Connection"]


class Connection:
    """One peer's connection as the core sees it.

    ``out`` collects byte pieces to write at the end of the loop turn. While ``paused``
    (its transport is above the soft limit, or older output still waits) frames go to
    ``pending`` instead, and its fetches are ``parked``: their changes are held back
    as keys changed after ``mark`` (PROTOCOL.md 10.8, see the module docstring).
    """

    __slots__ = (
        "address",
        "at_eof",
        "auth_failures",
        "caught",
        "close_at",
        "close_reason",
        "close_status",
        "closed",
        "closing",
        "conn_id",
        "delivery",
        "fetches",
        "heard",
        "held",
        "io",
        "mark",
        "max_body",
        "methods",
        "name",
        "need",
        "next_route_id",
        "out",
        "out_size",
        "parked",
        "paused",
        "pending",
        "pending_size",
        "perms",
        "query_fetches",
        "rest",
        "routes",
        "slow_since",
        "stalled",
        "states",
        "transport_size",
        "user",
        "violations",
        "writable",
    )

    def __init__(self, conn_id: int, address: str) -> None:
        self.conn_id = conn_id
        self.address = address
        self.name = ""
        self.out: list[bytes] = []
        self.paused = False
        self.parked = False  # its fetches are in Daemon.parked_fetches, not Daemon.fetches
        self.mark = 0  # parked: the changes up to this sequence number are queued already
        self.caught: dict[bytes, int] = {}  # parked: keys caught up on one by one since, and when
        self.pending: deque[bytes] = deque()
        self.pending_size = 0
        self.transport_size = 0  # bytes the transport buffers; set by the IO layer
        self.slow_since: Optional[float] = None
        self.closing = False  # CLOSE queued (or peer gone): read nothing more
        self.closed = False  # torn down: its states, methods, fetches, routes are gone
        self.close_status = Status.OK
        self.close_reason = ""
        self.close_at = -1
        self.states: dict[bytes, bytes] = {}  # its states: key -> Key, Value payload
        self.methods: set[bytes] = set()
        self.fetches: dict[int, Fetch] = {}
        self.query_fetches: dict[int, QueryFetch] = {}  # FETCH_QUERY fetches (PROTOCOL.md 14.3)
        self.routes: dict[int, Route] = {}  # routed to this connection, by our id
        self.next_route_id = 1
        # Received bytes not processed yet: an incomplete frame, or (while ``stalled``)
        # whole frames held back. A bytearray: a frame trickled in tiny reads costs
        # about its size, not a bytes object per read (PROTOCOL.md 10.7).
        self.rest = bytearray()
        self.need = 5  # bytes ``rest`` must hold before it is worth cutting frames again
        # Bytes the careful paths (answers, initial adds, held events) queued in ``out``
        # since the last flush: the output budget of PROTOCOL.md 10.8 within one read.
        self.out_size = 0
        # Input processing stopped (its output is over the budget, or one of its fetches
        # is still delivering initial adds): ``rest`` waits; the IO layer stops reading.
        self.stalled = False
        self.heard = False  # a whole frame arrived (first_frame_timeout, PROTOCOL.md 10.7)
        self.at_eof = False  # the peer closed its side while stalled: disconnect once caught up
        # A fetch whose initial adds (or a query whose entries) are under way.
        self.delivery: Optional[Delivery | QueryDelivery] = None
        self.violations = 0
        self.io: object = None  # the IO layer's handle (a protocol object)
        # PROTOCOL.md 3: the largest body this peer accepts; until its INFO says
        # otherwise we assume it accepts what we do.
        self.max_body = 0xFFFF_FFFF
        # PROTOCOL.md 15 (jetd.access): None without --auth, so nothing is checked.
        self.perms: Optional[Permissions] = None
        # keys it may write, cached (jetd.access); None when every key is writable.
        self.writable: Optional[set[bytes]] = None
        self.user: Optional[str] = None  # who it authenticated as
        self.held = False  # PROTOCOL.md 15.2: AUTHENTICATE being answered: read nothing
        self.auth_failures = 0

    @property
    def label(self) -> str:
        """``#id name@address`` for log lines (``#id name(user)@address`` once authenticated)."""
        user = f"({self.user})" if self.user is not None else ""
        return f"#{self.conn_id} {self.name or '-'}{user}@{self.address}"

    @property
    def queued(self) -> int:
        """Bytes waiting for this peer: in the transport plus in the local queue."""
        return self.transport_size + self.pending_size

    def enqueue(self, frame: bytes) -> None:
        """Queue a frame locally (paused mode)."""
        self.pending.append(frame)
        self.pending_size += len(frame)

    def take_pending(self, budget: int) -> list[bytes]:
        """Pop queued frames, in order, up to about ``budget`` bytes (at least one)."""
        taken: list[bytes] = []
        size = 0
        pending = self.pending
        while pending and size < budget:
            frame = pending.popleft()
            taken.append(frame)
            size += len(frame)
        self.pending_size -= size
        return taken
