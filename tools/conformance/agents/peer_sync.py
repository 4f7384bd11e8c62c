"""The PEER.md agent for :class:`peer.Peer`: ``python -m tools.conformance.agents.peer_sync HOST PORT``."""

from __future__ import annotations

from peer import Peer
from peer.errors import PeerError

from .script import FETCH_PREFIX
from .script import METHOD_KEY
from .script import STATE_KEY
from .script import TIMEOUT
from .script import run_agent
from .script import run_requests
from .script import say
from .script import say_event


def status_of(exc: PeerError) -> str:
    return exc.status.name if exc.status is not None else type(exc).__name__


def main(host: str, port: int) -> int:
    peer = Peer.connect(host, port, name="agent-sync", timeout=TIMEOUT)
    try:
        peer.add_state(STATE_KEY, 0, on_set=lambda value: value)
        peer.add_method(METHOD_KEY, lambda args: args)
        peer.fetch(FETCH_PREFIX, lambda event: say_event(event.kind, event.key, event.value))
        say("ready")
        run_requests(peer, PeerError, status_of)
        peer.wait_closed()
        say("closed")
    finally:
        peer.close()
    return 0


if __name__ == "__main__":
    run_agent(main, PeerError, status_of)
