"""Event logs written by the real jetd core: random peers drive the sans-IO ``Daemon``
(jetd/core.py) and every record its log hook emits is kept, 1 µs apart (JETLOG.md 4).

Peers add, notify (by event and by request), set and call (routed to owners that answer
on time, late, wrongly or never), remove, close and disconnect; time passes, so routed
requests time out. For tests of the derived tables on what jetd really writes.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any
from typing import Optional

from jetd.config import Config
from jetd.core import Daemon
from jetwire import AddMethod
from jetwire import AddState
from jetwire import CallMethod
from jetwire import Close
from jetwire import Info
from jetwire import Message
from jetwire import NotifyState
from jetwire import RemoveState
from jetwire import Response
from jetwire import SetState
from jetwire import Status
from jetwire import Value
from jetwire import encode
from jetwire.log import LogHeader
from jetwire.log import LogKind
from jetwire.log import encode_header
from jetwire.log import encode_record

RUN = 1_767_225_600_000_000_000


class JetdLog:
    """A log of ``steps`` random peer actions against a jetd core (seeded)."""

    def __init__(self, seed: int, steps: int, *, start_ns: int = RUN) -> None:
        self.rnd = random.Random(seed)
        self.t = start_ns
        self.records: list[bytes] = []
        self.now = 0.0
        self.daemon = Daemon(Config(route_timeout=5.0), self._hook)
        self.conns: dict[int, Any] = {}
        self.owed: dict[int, list[int]] = {}  # owner conn -> ids of routed requests it has not answered
        self.keys: dict[str, int] = {}  # key -> the owner, as the peers believe
        self.methods: dict[str, int] = {}
        self.ids: dict[int, int] = {}
        for _ in range(steps):
            self._step()

    def _hook(self, conn_id: int, kind: int, data: bytes) -> None:
        self.t += 1000
        self.records.append(encode_record(self.t, conn_id, kind, bytes(data)))
        if kind == LogKind.ROUTE:
            _, _, owner, owner_id = struct.unpack_from(">IIII", data)
            self.owed.setdefault(owner, []).append(owner_id)

    def _send(self, cid: int, msg: Message) -> None:
        conn = self.conns.get(cid)
        if conn is None:
            return
        self.now += 0.01
        self.daemon.receive_data(conn, encode(msg), self.now)
        if conn.closed or conn.closing:
            self._forget(cid)

    def _id(self, cid: int) -> int:
        self.ids[cid] = self.ids.get(cid, 0) + 1
        return self.ids[cid]

    def _forget(self, cid: int) -> None:
        self.conns.pop(cid, None)
        self.owed.pop(cid, None)
        for table in (self.keys, self.methods):
            for k in [k for k, owner in table.items() if owner == cid]:
                del table[k]

    def _step(self) -> None:
        r = self.rnd
        if len(self.conns) < 2 or r.random() < 0.04:
            self.now += 0.01
            conn = self.daemon.connect(f"127.0.0.1:{40000 + len(self.records)}", self.now)
            self.conns[conn.conn_id] = conn
            self._send(conn.conn_id, Info(name=f"peer{conn.conn_id}"))
            return
        cid = r.choice(sorted(self.conns))
        keys = sorted(self.keys)
        x = r.random()
        if x < 0.10:
            key = f"k/{r.randrange(12)}"
            self._send(cid, AddState(self._id(cid), key, Value.of(r.randrange(100))))
            self.keys.setdefault(key, cid)
        elif x < 0.13:
            key = f"m/{r.randrange(4)}"
            self._send(cid, AddMethod(self._id(cid), key))
            self.methods.setdefault(key, cid)
        elif x < 0.30 and keys:  # a NOTIFY event, now and then from a peer that does not own the state
            key = r.choice(keys)
            self._send(self.keys[key] if r.random() < 0.8 else cid, NotifyState(None, key, Value.of(r.randrange(100))))
        elif x < 0.38 and keys:
            key = r.choice(keys)
            sender = self.keys[key] if r.random() < 0.8 else cid
            self._send(sender, NotifyState(self._id(sender), key, Value.of(r.randrange(100))))
        elif x < 0.55 and keys:
            key = r.choice(keys) if r.random() < 0.9 else "nope/x"
            self._send(cid, SetState(self._id(cid), key, Value.of(r.randrange(100))))
        elif x < 0.60 and self.methods:
            self._send(cid, CallMethod(self._id(cid), r.choice(sorted(self.methods)), Value.of(1)))
        elif x < 0.75:  # an owner answers one of the requests routed to it, maybe late, maybe out of order
            owners = sorted(o for o, owed in self.owed.items() if owed and o in self.conns)
            if owners:
                owner = r.choice(owners)
                owed = self.owed[owner]
                oid = owed.pop(r.randrange(len(owed)) if r.random() < 0.3 else 0)
                answer = Response(oid, value=Value.of(7)) if r.random() < 0.8 else Response(
                    oid, Status.REJECTED, message="no")
                self._send(owner, answer)
        elif x < 0.79 and keys:
            key = keys[r.randrange(len(keys))]
            owner = self.keys.pop(key)
            self._send(owner, RemoveState(self._id(owner), key))
        elif x < 0.84:
            conn = self.conns.get(cid)
            self.now += 0.01
            self.daemon.disconnect(conn, self.now)
            self._forget(cid)
        elif x < 0.86:
            self._send(cid, Close(Status.OK, "bye"))
            self._forget(cid)
        else:
            self.now += r.choice([0.1, 1.0, 3.0])
            self.daemon.tick(self.now)

    def write(self, path: Path, *, damage: int = 0, created_ns: int = RUN,
              rnd: Optional[random.Random] = None) -> Path:
        """Write the log as one segment; ``damage`` records get a wrong CRC."""
        records = list(self.records)
        for i in (rnd or random.Random(len(records))).sample(range(len(records)), k=damage):
            records[i] = records[i][:-1] + bytes([records[i][-1] ^ 0xFF])
        path.write_bytes(encode_header(LogHeader("jetd", created_ns, 0)) + b"".join(records))
        return path
