"""The PEER.md agent for :class:`peer.tiny.TinyPeer`: ``python -m tools.conformance.agents.peer_tiny HOST PORT``."""

from __future__ import annotations

import sys

from peer.tiny import STATUS_NAMES
from peer.tiny import TinyError
from peer.tiny import TinyPeer

from .script import FETCH_PREFIX
from .script import METHOD_KEY
from .script import STATE_KEY
from .script import TIMEOUT
from .script import run_requests
from .script import say
from .script import say_event


def status_of(exc: TinyError) -> str:
    return STATUS_NAMES[exc.status] if 0 <= exc.status < len(STATUS_NAMES) else str(exc.status)


def run(peer: TinyPeer) -> int:
    peer.add_state(STATE_KEY, 0, on_set=lambda value: value)
    peer.add_method(METHOD_KEY, lambda args: args)
    peer.fetch(FETCH_PREFIX, say_event)
    say("ready")
    run_requests(peer, TinyError, status_of)
    while not peer.closed:
        try:
            peer.poll(1.0)
        except TinyError:
            break
    say("closed")
    return 0


def main(host: str, port: int, peer_class: type[TinyPeer] = TinyPeer) -> int:
    try:
        peer = peer_class(host, port, name="agent-tiny", timeout=TIMEOUT)
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
