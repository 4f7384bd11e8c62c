"""The PEER.md agent for :class:`peer.tiny.TinyPeer`: ``python -m tools.conformance.agents.peer_tiny HOST PORT``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from peer.tiny import STATUS_NAMES, TinyError, TinyPeer


def say(line: str) -> None:
    print(line, flush=True)


def status_of(exc: TinyError) -> str:
    return STATUS_NAMES[exc.status] if 0 <= exc.status < len(STATUS_NAMES) else str(exc.status)


def run(peer: TinyPeer) -> int:
    peer.add_state("agent/state", 0, on_set=lambda value: value)
    peer.add_method("agent/echo", lambda args: args)
    peer.fetch("data/", lambda kind, key, value: say(f"event {kind} {key} {json.dumps(value)}"))
    say("ready")
    requests: list[tuple[str, Callable[[], Any]]] = [("set", lambda: peer.set("data/x", 7)),
                                                     ("call", lambda: peer.call("data/echo", "x" * 100))]
    for name, start in requests:
        try:
            say(f"{name} ok {json.dumps(start())}")
        except TinyError as exc:
            say(f"{name} error {status_of(exc)}")
    while not peer.closed:
        try:
            peer.poll(1.0)
        except TinyError:
            break
    say("closed")
    return 0


def main(host: str, port: int, peer_class: type[TinyPeer] = TinyPeer) -> int:
    try:
        peer = peer_class(host, port, name="agent-tiny", timeout=10)
    except (TinyError, OSError) as exc:
        say(f"error {exc}")
        return 1
    try:
        return run(peer)
    except TinyError as exc:
        say(f"error {status_of(exc)} {exc}")
        return 1
    finally:
        peer.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
