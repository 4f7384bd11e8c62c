"""The Python floor of issue 19: a uvloop relay that only cuts jet frames and appends
each to the write list of the peers it goes to, with nothing else.

    python -m tools.bench.floor [--port 0]

It speaks just enough jet for ``tools.bench.brokers``' shapes. Set-up requests
(ADD_STATE, ADD_METHOD, FETCH_STATES) are answered as jetd answers them. After that, a
NOTIFY_STATE event goes verbatim to every connection that fetched. A CALL_METHOD
request goes verbatim to the connection that added a method, and a RESPONSE from that
connection goes verbatim to the last caller. Frames are not validated, ids are not
remapped, nothing is cached and no FETCH_CHANGE is encoded. Each connection's output is
written once per read, as jetd does. What jetd costs above this relay is the price of
being a daemon and not a byte pump; the brokers benchmark reports the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys
from typing import Optional

from jetwire import AddMethod
from jetwire import AddState
from jetwire import EventCode
from jetwire import FetchAdd
from jetwire import FetchStates
from jetwire import FrameType
from jetwire import Function
from jetwire import Info
from jetwire import Response
from jetwire import Value
from jetwire import decode_frame
from jetwire import encode

_HEADER = struct.Struct(">BI")
# Plain ints for the per-frame comparisons. The function byte follows a REQUEST's 4-byte
# id (offset 9 in the frame); an EVENT's code is its first body byte (offset 5).
_REQUEST, _RESPONSE, _EVENT = FrameType.REQUEST.value, FrameType.RESPONSE.value, FrameType.EVENT.value
_CALL_METHOD = Function.CALL_METHOD.value
_NOTIFY = EventCode.NOTIFY_STATE.value


class Relay:
    """The shared state: who fetched, who owns the method, who called last."""

    def __init__(self) -> None:
        self.fetchers: list[Peer] = []
        self.owner: Optional[Peer] = None
        self.caller: Optional[Peer] = None
        self.states: dict[str, Value] = {}


class Peer(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.buffer = b""
        self.out: list[bytes] = []
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        transport.write(  # type: ignore[attr-defined]
            encode(Info(name="floor", max_body=1 << 20)))

    def connection_lost(self, exc: Optional[Exception]) -> None:
        relay = self.relay
        if self in relay.fetchers:
            relay.fetchers.remove(self)
        if relay.owner is self:
            relay.owner = None
        if relay.caller is self:
            relay.caller = None

    def data_received(self, data: bytes) -> None:
        buf = self.buffer + data if self.buffer else data
        relay = self.relay
        fetchers = relay.fetchers
        touched: set[Peer] = set()
        pos, size = 0, len(buf)
        while size - pos >= 5:
            ftype, length = _HEADER.unpack_from(buf, pos)
            end = pos + 5 + length
            if end > size:
                break
            frame = buf[pos:end]
            if ftype == _EVENT and buf[pos + 5] == _NOTIFY:
                for peer in fetchers:
                    peer.out.append(frame)
                touched.update(fetchers)
            elif ftype == _REQUEST and buf[pos + 9] == _CALL_METHOD and relay.owner is not None:
                relay.owner.out.append(frame)
                relay.caller = self
                touched.add(relay.owner)
            elif ftype == _RESPONSE and relay.caller is not None:
                relay.caller.out.append(frame)
                touched.add(relay.caller)
            else:
                self.setup(frame)
                touched.add(self)
            pos = end
        self.buffer = buf[pos:]
        for peer in touched:
            if peer.out and peer.transport is not None:
                peer.transport.write(b"".join(peer.out))
                peer.out.clear()

    def setup(self, frame: bytes) -> None:
        """The set-up requests, answered as jetd answers them (not measured)."""
        message = decode_frame(frame)
        relay = self.relay
        rid = getattr(message, "id", None) or 0
        if isinstance(message, AddState):
            relay.states[message.key] = message.value
            self.out.append(encode(Response(rid)))
        elif isinstance(message, AddMethod):
            relay.owner = self
            self.out.append(encode(Response(rid)))
        elif isinstance(message, FetchStates):
            relay.fetchers.append(self)
            self.out.append(encode(Response(rid, fetch_id=1)))
            self.out.extend(encode(FetchAdd(1, key, value)) for key, value in sorted(relay.states.items())
                            if key.startswith(message.prefix))


async def serve(host: str, port: int) -> None:
    relay = Relay()
    server = await asyncio.get_running_loop().create_server(lambda: Peer(relay), host, port)
    bound = server.sockets[0].getsockname()
    print(f"floor listening on {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import uvloop
    except ImportError:
        print("uvloop is not installed: the floor runs on asyncio's own loop", file=sys.stderr)
        asyncio.run(serve(args.host, args.port))
    else:
        uvloop.run(serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
