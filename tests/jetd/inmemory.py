"""A sans-IO Daemon with in-memory peers (h11's ConnectionPair idea), shared by the core
tests: ``send(conn, *messages)`` feeds frames in, ``recv(conn)`` decodes what the daemon
queued for ``conn``. A test's own harness subclasses it for how it plays the IO layer
(``output``): running the pending work, or taking the frames parked behind a budget."""

from __future__ import annotations

from jetd.connection import Connection
from jetd.core import Daemon
from jetwire import Decoder
from jetwire import Info
from jetwire import Message
from jetwire import encode


class MemoryPeers:
    """In-memory connections to ``daemon``; the time is ``now``."""

    def __init__(self, daemon: Daemon, now: float = 0.0) -> None:
        self.daemon = daemon
        self.now = now
        self.decoders: dict[int, Decoder] = {}
        self.infos: dict[int, Info] = {}  # the INFO each connection got first

    def connect(self, address: str = "mem") -> Connection:
        """A new connection; the daemon's INFO is read (kept in ``infos``)."""
        conn = self.daemon.connect(address, self.now)
        self.decoders[conn.conn_id] = Decoder(max_body=1 << 30)
        info = self.recv(conn)[0]
        assert isinstance(info, Info), info
        self.infos[conn.conn_id] = info
        return conn

    def send(self, conn: Connection, *messages: Message) -> None:
        self.daemon.receive_data(conn, b"".join(encode(m) for m in messages), self.now)

    def output(self, conn: Connection) -> bytes:
        """What the IO layer would write to ``conn`` now: its queued output."""
        self.daemon.take_dirty()
        data = b"".join(conn.out)
        conn.out.clear()
        return data

    def decode(self, conn: Connection, data: bytes) -> list[Message]:
        decoder = self.decoders[conn.conn_id]
        decoder.receive_data(data)
        return list(decoder.messages())

    def recv(self, conn: Connection) -> list[Message]:
        """Everything queued for ``conn`` (the output of this 'loop turn')."""
        return self.decode(conn, self.output(conn))

    def drain(self, conn: Connection) -> list[Message]:
        """The IO layer's drain (jetd.server.PeerProtocol.drain): write the frames parked
        behind the budget, call drained() until it says the connection is live (it may
        queue the held-back changes first), then flush."""
        messages: list[Message] = []
        while True:
            messages += self.decode(conn, b"".join(conn.take_pending(1 << 30)))
            if conn.closing or self.daemon.drained(conn):
                break
        return messages + self.recv(conn)

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.daemon.tick(self.now)
