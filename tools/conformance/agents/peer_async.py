"""The PEER.md agent for :class:`peer.PeerAsync`: ``python -m tools.conformance.agents.peer_async HOST PORT``."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from peer import PeerAsync
from peer.errors import PeerError


def say(line: str) -> None:
    print(line, flush=True)


def status_of(exc: PeerError) -> str:
    return exc.status.name if exc.status is not None else type(exc).__name__


async def main(host: str, port: int) -> int:
    peer = await PeerAsync.connect(host, port, name="agent-async", timeout=10)
    await peer.add_state("agent/state", 0, on_set=lambda value: value)
    await peer.add_method("agent/echo", lambda args: args)
    await peer.fetch("data/", lambda event: say(f"event {event.kind} {event.key} {json.dumps(event.value)}"))
    say("ready")
    requests: list[tuple[str, Any]] = [("set", lambda: peer.set("data/x", 7)),
                                       ("call", lambda: peer.call("data/echo", "x" * 100))]
    for name, start in requests:
        try:
            say(f"{name} ok {json.dumps(await start())}")
        except PeerError as exc:
            say(f"{name} error {status_of(exc)}")
    await peer.wait_closed()
    say("closed")
    await peer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]))))
    except PeerError as exc:
        say(f"error {status_of(exc)} {exc}")
        sys.exit(1)
