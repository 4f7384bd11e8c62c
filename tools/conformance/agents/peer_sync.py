"""The PEER.md agent for :class:`peer.Peer`: ``python -m tools.conformance.agents.peer_sync HOST PORT``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from peer import Peer
from peer.errors import PeerError


def say(line: str) -> None:
    print(line, flush=True)


def status_of(exc: PeerError) -> str:
    return exc.status.name if exc.status is not None else type(exc).__name__


def main(host: str, port: int) -> int:
    peer = Peer.connect(host, port, name="agent-sync", timeout=10)
    try:
        peer.add_state("agent/state", 0, on_set=lambda value: value)
        peer.add_method("agent/echo", lambda args: args)
        peer.fetch("data/", lambda event: say(f"event {event.kind} {event.key} {json.dumps(event.value)}"))
        say("ready")
        requests: list[tuple[str, Callable[[], Any]]] = [("set", lambda: peer.set("data/x", 7)),
                                                         ("call", lambda: peer.call("data/echo", "x" * 100))]
        for name, start in requests:
            try:
                say(f"{name} ok {json.dumps(start())}")
            except PeerError as exc:
                say(f"{name} error {status_of(exc)}")
        peer.wait_closed()
        say("closed")
    finally:
        peer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1], int(sys.argv[2])))
    except PeerError as exc:
        say(f"error {status_of(exc)} {exc}")
        sys.exit(1)
